"""Inference specs (``inference/**.toml``): how a model is inferred — guide, ELBO, optimiser,
training, posterior predictive."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from probtrans.registry import Registry
from probtrans.runtime.paths import AttentionPath, SgpaConditional
from probtrans.specs.base import NonNegative, NonNegativeInt, Positive, PositiveInt, Spec, SpecFile

#: the post-hoc predictives from the trained weights by name
#: (:class:`probtrans.inference.posthoc.PosthocPredictive` classes): MC dropout (dropout kept
#: on), the last-layer Laplace approximation, and (for a backbone) stochastic attention over
#: the trained logits. They register in :mod:`probtrans.inference.posthoc`, imported when the
#: registry is first read; a spec names them in ``[predictive] posthoc``.
POSTHOC: Registry[Any] = Registry("post-hoc predictive", ("probtrans.inference.posthoc",))


class GuideSpec(Spec):
    """``[guide]``: the variational family over the global latent sites."""

    name: str = "delta"
    """Guide of the weights with priors, registered in ``probtrans.guides.weights.GUIDES``."""
    init_scale: Positive = 0.01
    """Initial posterior standard deviation of the normal and lowrank guides."""
    rank: PositiveInt = 8
    """lowrank: rank of the covariance's low-rank part."""
    sites: Literal["auto", "all", "last_layer"] = "auto"
    """lowrank: where the low-rank part goes; ``auto``: the last layer of large nets."""
    max_lowrank_dims: PositiveInt = 20_000
    """lowrank, sites = "auto": nets with more latent dimensions get it on the last layer."""
    head_scales: Literal["learned", "fixed_point"] = "learned"
    """normal: the head's posterior standard deviations as SVI leaves them, or, once training
    ends, set at the ELBO's fixed point for the head's learned means (``fixed_point``,
    :mod:`probtrans.inference.head_variances`). Adam moves a scale by about its rate per step,
    so after a fine-tuning's few hundred steps the head's scales are still near ``init_scale``
    wherever the ELBO would put them (see ``optim.scale_lr``)."""
    inducing: str = "cholesky"
    """Guide of the whitened SGPA inducing variables u_g, registered in
    ``probtrans.guides.inducing.INDUCING_GUIDES``."""
    inducing_init_scale: Positive = 0.1
    """Initial standard deviation of the cholesky and diagonal u_g guides."""


class ElboSpec(Spec):
    """``[elbo]``: the objective and the weight of its KL terms."""

    name: Literal["trace", "meanfield"] = "trace"
    """Trace_ELBO (sampled KL) or TraceMeanField_ELBO (analytic KL)."""
    particles: PositiveInt = 1
    kl_weight: NonNegative = 1.0
    """Multiplies KL(q ‖ p) of the global latent sites; 1 with kl_scale = "dataset" is the
    ELBO itself."""
    kl_scale: Literal["dataset", "authors"] = "dataset"
    """``authors``: the KL of SGPA's inducing variables u_g also times N_train, so that the loss
    is N_train × the SGPA authors' (mean NLL + KL(u_g) + batch-mean amortised KL); weight priors
    (which the authors' model does not have) and the amortised KL keep the ELBO's weight."""
    kl_anneal_epochs: NonNegativeInt = 0
    """Linear warm-up of every KL term from 0 over this many epochs."""


class OptimSpec(Spec):
    """``[optim]``: optimiser and learning-rate schedule."""

    name: Literal["adam", "adamw", "clipped_adam"] = "adam"
    """Adam (``weight_decay`` as an L2 term of the gradient), AdamW (decoupled weight decay,
    Loshchilov & Hutter 2019; the optimiser of ``transformers`` fine-tuning) or Pyro's
    ClippedAdam."""
    lr: Positive = 1e-3
    backbone_lr: Positive | None = None
    """The learning rate of a pretrained backbone's own weights where they train
    (``model.train_backbone``); unset: ``lr``. Everything new (head, adapters, swapped layers,
    the guide's parameters) trains at ``lr``: e.g. 5e-5 for the backbone, as ``transformers``
    fine-tuning, and 1e-3 for adapters."""
    scale_lr: Positive | None = None
    """The learning rate of the guide's scale parameters (a mean-field guide's standard
    deviations, a low-rank guide's diagonal and factor, the inducing guides' Cholesky factors);
    unset: ``lr``. Adam moves each parameter by about its rate per step, so at ``lr`` = 1e-3 a
    scale started at ``guide.init_scale`` = 0.01 is still below 0.02 after a few hundred steps,
    however wide the posterior, and the predictive stays that of the means. BLoB's authors
    (Wang et al., NeurIPS 2024) step the KL term with an optimiser of its own."""
    weight_decay: NonNegative = 0.0
    clip_norm: Positive = 10.0
    """clipped_adam: gradient norm bound."""
    schedule: Literal["constant", "cosine", "linear", "exponential"] = "constant"
    """The learning rate's decay over the fit's steps after the warm-up: none, cosine or linear
    to 0, or a factor ``gamma`` per step."""
    warmup: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """The fraction of the fit's steps over which the learning rate rises linearly from 0
    (0.1 with ``schedule = "linear"`` is ``transformers``' usual fine-tuning schedule)."""
    gamma: Annotated[float, Field(gt=0, le=1)] = 0.999
    """exponential schedule: learning-rate factor per step (a decay: at most 1)."""


class TrainSpec(Spec):
    """``[train]``: epochs, batches, early stopping."""

    epochs: PositiveInt = 30
    batch_size: PositiveInt = 64
    """Rows per optimiser step; with N processes (torchrun), each takes about batch_size / N."""
    patience: NonNegativeInt = 0
    """Stop after this many epochs without improvement; 0 = never."""
    monitor: str = "accuracy"
    """Validation metric whose best epoch is kept: any metric of ``metrics.json`` that is
    better higher or lower (accuracy, mcc, nll, brier, ece, ...;
    :mod:`probtrans.analysis.metrics`)."""
    val_samples: PositiveInt = 3
    """Posterior samples of the validation metric."""
    group_by_length: bool = False
    """Token data: batches of texts of similar length (less padding)."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """``bf16``: the model and guide run under ``torch.autocast`` in bfloat16 (the SGPA kernel
    and Cholesky factors stay in float32 / float64; parameters and the optimiser in float32)."""
    divergence_factor: Annotated[float, Field(gt=1)] = 1000.0
    """Training stops as diverged when the loss per example exceeds this many times its size at
    the start (the first batch's, with every KL term at full weight, at least 1 nat)."""
    logger: Literal["csv", "tensorboard", "none"] = "csv"
    """Training log of every epoch in the run folder: ``history.csv``, TensorBoard scalars in
    ``tensorboard/`` (needs the ``tensorboard`` package), or none."""


#: ``[predictive] loo_samples`` when unset and cheap: at 400 draws ArviZ's k̂ threshold is
#: 1 − 1/log10(400) ≈ 0.62 and the Pareto tail is fitted to 3·sqrt(400) = 60 ratios (at 100
#: draws 0.5 and 30: an MFVI head flags about 9 % of the training examples there, none at 400)
AUTOMATIC_LOO_SAMPLES = 400


#: the uncertainty score shown first, by default: the best mean rank of OOD AUROC over every
#: (run, out-of-domain set) of ``benchmarks/ood_scores.py`` (README, "Does it know what it has
#: not seen?")
RECOMMENDED_OOD_SCORE = "mahalanobis"


class PredictiveSpec(Spec):
    """``[predictive]``: the posterior predictive and its post-hoc variants."""

    samples: PositiveInt = 10
    batch_size: PositiveInt = 256
    """Rows per pass (examples × samples evaluated together)."""
    head_draws: PositiveInt = 1
    """M: the draws of the head per draw of the network below it, for a guide that draws the
    head independently of the rest (``guide.name = "normal"``): the ``samples`` draws then take
    ⌈samples/M⌉ passes of the network, each draw's head applied to its group's features. A
    mean-field head's predictive varies with its draws; this averages many of them at the cost
    of a few passes of the network."""
    replicas: PositiveInt = 10
    """R: draws of the local randomness (attention samples, SGPA outputs) averaged inside each
    pointwise likelihood of ``predictive.nc``, log (1/R) Σ_r p(y_n | W_s, â_r), so that it is
    a likelihood of the global draw W_s alone (the same R for every draw)."""
    loo_samples: NonNegativeInt | None = None
    """Global posterior draws of the training log-likelihood that PSIS-LOO reads. Costs R
    passes over the training split when the draws differ in the head alone (a last-layer prior)
    or not at all (a point mass), loo_samples × R passes when they differ inside the network
    (e.g. SGPA's u_g from a Normal). Unset: :data:`AUTOMATIC_LOO_SAMPLES` in the first two
    cases, none in the third (``metrics.json``'s ``loo_note`` says so); 0: none. Without them
    ``predictive.nc`` has no pointwise likelihoods and ``metrics.json`` no LOO (the held-out
    ELPD stays)."""
    posthoc: list[str] = []
    """Predictives from the same trained weights besides the plain one, names of
    ``probtrans.specs.inference.POSTHOC``: mc_dropout, laplace, stochastic_attention."""
    stochastic_layers: list[int] | Literal["all"] = [-1]
    """``stochastic_attention`` (a ``model.backbone`` run): the blocks whose attention weights
    are sampled, indices as ``model.swap.layers``."""
    stochastic_taus: list[Positive] = Field([0.5, 1.0, 2.0, 4.0], min_length=1)
    """``stochastic_attention``: the temperatures tried, in units of √d_head (1 keeps the
    scale of the pretrained softmax); the one of lowest validation NLL is used."""
    laplace_prior_precision: NonNegative = 0.0
    """Prior precision of the Laplace head posterior; 0 = the log-grid value with the lowest
    validation NLL."""
    feature_scores: bool = True
    """Fit the feature-space uncertainty scores (Mahalanobis, relative Mahalanobis, feature
    density, k-NN; :mod:`probtrans.analysis.feature_scores`) on the training split's pooled
    features, averaged over the ``samples`` posterior draws, and report them for every split and new
    input. Costs one predictive pass over the training split (which the run folder then keeps)."""
    knn_neighbours: PositiveInt = 50
    """k of the ``knn`` score: the distance to the k-th nearest normalised training feature."""
    ood_score: str = RECOMMENDED_OOD_SCORE
    """The uncertainty score a run shows first (its OOD table, the ROC of its figure): one of
    ``probtrans.analysis.metrics.UNCERTAINTY_SCORES``. The default is the score that separated
    out-of-domain inputs best over the sets measured (README, "Does it know what it has not
    seen?"); a score the run does not give (a feature score with ``feature_scores = false``)
    falls back to ``entropy``."""


class PathsSpec(Spec):
    """``[paths]``: which of two implementations of one computation runs, each the same result to
    its tested tolerance (:mod:`probtrans.runtime.paths`). ``auto``: the faster one on the run's
    device, as measured (``probtrans.runtime.paths.MEASURED``); the run folder's
    ``timing.json`` records the paths taken."""

    sgpa_conditional: Literal["auto"] | SgpaConditional = "auto"
    """SGPA's decoupled conditional: its O(T²) remainder in float32 (``factored``) or every
    matrix in float64 (``float64``: O(T²) float64 memory)."""
    residual_chunk: Literal["auto"] | PositiveInt = "auto"
    """T × T elements per chunk of the factored conditional's remainder product."""
    attention: Literal["auto"] | AttentionPath = "auto"
    """Stochastic attention where its sites are hidden (training): one fused kernel
    (``fused``) or its Pyro sample sites (``sites``)."""


class InferenceSpec(SpecFile):
    """An inference spec file."""

    guide: GuideSpec = GuideSpec()
    elbo: ElboSpec = ElboSpec()
    optim: OptimSpec = OptimSpec()
    train: TrainSpec = TrainSpec()
    predictive: PredictiveSpec = PredictiveSpec()
    paths: PathsSpec = PathsSpec()
