"""The posterior predictive of a trained classifier and its post-hoc variants.

From one set of trained weights and S posterior draws of its global sites, on the validation
and in-domain test splits and every out-of-domain set (:meth:`DataBundle.splits`):

- ``plain``: the posterior predictive of the model and its posterior;
- ``mc_dropout``: the same with dropout kept on (Gal & Ghahramani 2016), a baseline of both
  papers (:class:`MCDropout`);
- ``laplace``: the last-layer Laplace approximation around the trained head
  (:mod:`probtrans.inference.laplace`; Daxberger et al. 2021), the SGPA paper's KFLLLA baseline
  and SNGP's posterior (:class:`LastLayerLaplacePredictive`);
- ``stochastic_attention`` (a pretrained backbone): the blocks ``stochastic_layers`` sample
  their attention weights as STO does (Pei et al. 2022, Eq. 9–11) over their trained logits,
  at the temperature of ``stochastic_taus`` with the lowest validation NLL; no training
  (:class:`StochasticAttention`).

The variants asked for are the inference spec's ``[predictive] posthoc``. Each is a
:class:`PosthocPredictive` registered by name in :data:`probtrans.specs.inference.POSTHOC`
(:func:`register_posthoc`): ``check`` refuses a classifier it cannot serve before any training,
``fit`` reads the training or validation split, ``predict`` gives one split's predictive.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from probtrans.analysis.metrics import nll
from probtrans.analysis.results import PLAIN
from probtrans.classifier import BackboneClassifier, Classifier
from probtrans.data import DataBundle, DataSplit
from probtrans.errors import ConfigError, ProbtransError
from probtrans.inference.laplace import LastLayerLaplace
from probtrans.inference.predictive import sample_predictive
from probtrans.runtime.stopwatch import Stopwatch
from probtrans.specs import PredictiveSpec
from probtrans.specs.inference import POSTHOC

Probs = dict[str, dict[str, np.ndarray]]  # variant → split → (S, N, C)
TrainFeatures = Callable[[], np.ndarray]  # → the training split's features (N, D), computed once
Energy = dict[str, dict[str, np.ndarray]]  # variant → split → (N,) mean free energy
#: a split's predictive outputs: ``probs`` (S, N, C), ``energy`` (S, N) where it has logits,
#: and the other sites asked for
Outputs = dict[str, np.ndarray]


@dataclass
class PosthocContext:
    """What a post-hoc predictive is fitted on and predicts from: the trained ``classifier``,
    the S posterior ``draws`` of its global sites, the ``data``, the ``spec``'s options,
    ``on(split, **options)`` (the split's predictive under those draws, with the predictive's
    options: ``mc_dropout=True``, ...), the ``plain`` predictive's outputs per split (to post-
    process), its pooled ``features`` per split (S, N, D; where a variant or the feature scores
    need them) and ``train_features`` (the training split's features (N, D) of the first draw,
    where the caller shares them)."""

    classifier: Classifier
    draws: dict[str, Tensor]
    data: DataBundle
    spec: PredictiveSpec
    on: Callable[..., Outputs]
    plain: dict[str, Outputs]
    features: dict[str, np.ndarray]
    device: str = "cpu"
    train_features: TrainFeatures | None = None


class PosthocPredictive(ABC):
    """A predictive from the trained weights besides the plain one, fitted once per evaluation."""

    #: its name in ``[predictive] posthoc``, ``metrics.json`` and the tables
    name: ClassVar[str]
    #: fitted on the training split (which the run folder then keeps)
    uses_training_split: ClassVar[bool] = False
    #: reads the plain predictive's pooled features
    uses_features: ClassVar[bool] = False

    @classmethod  # noqa: B027 (by default, any classifier)
    def check(cls, classifier: Classifier, spec: PredictiveSpec) -> None:
        """Raise ConfigError, before any training, for a classifier it cannot serve."""

    def fit(self, context: PosthocContext) -> None:  # noqa: B027 (by default, nothing)
        """Fit what it needs on the training or validation split (nothing by default)."""

    @abstractmethod
    def predict(self, context: PosthocContext, split: str) -> Outputs:
        """The predictive of ``split`` (a name of :meth:`DataBundle.splits`)."""


def register_posthoc(method: type[PosthocPredictive]) -> type[PosthocPredictive]:
    """Add ``method`` to :data:`~probtrans.specs.inference.POSTHOC` (a plugin's one call; usable
    as a decorator)."""
    POSTHOC.register(method.name, method)
    return method


def chosen(spec: PredictiveSpec) -> list[type[PosthocPredictive]]:
    """The classes of ``spec.posthoc``'s variants, in its order."""
    return [POSTHOC.get(name, "predictive.posthoc") for name in spec.posthoc]


def check_posthoc(classifier: Classifier, spec: PredictiveSpec) -> None:
    """Refuse, before any training, a variant that ``classifier`` cannot give."""
    for method in chosen(spec):
        method.check(classifier, spec)


def needs_training_split(spec: PredictiveSpec) -> bool:
    """Whether a variant of ``spec`` is fitted on the training split (the Laplace is)."""
    return any(method.uses_training_split for method in chosen(spec))


def posterior_predictives(
    classifier: Classifier,
    draws: dict[str, Tensor],
    data: DataBundle,
    spec: PredictiveSpec,
    samples: int,
    device: str = "cpu",
    progress: bool = False,
    predictive: Callable[..., Outputs] = sample_predictive,
    train_features: TrainFeatures | None = None,
    stopwatch: Stopwatch | None = None,
) -> tuple[Probs, Energy, dict[str, Outputs], dict[str, np.ndarray]]:
    """Class probabilities of the ``plain`` predictive and of ``spec.posthoc``'s variants, the
    free energy of the variants with logits (all but ``laplace``; the mean over samples of
    −log Σ_c exp f_c), every site of the plain predictive per split (for the InferenceData),
    and, where the feature scores or a variant need them, the plain predictive's pooled
    features per split (S, N, D); from the S posterior ``draws`` of the global sites (the same
    draws on every split). ``predictive`` computes each split's predictive: by default
    :func:`~probtrans.inference.predictive.sample_predictive`; a test-time adaptation passes its
    own, with the same arguments. ``train_features``: what gives the training split's features
    (N, D) of the first draw, where the caller shares them. ``stopwatch`` times the plain
    ``predictive`` and each variant by its name (fit and predict)."""
    stopwatch = stopwatch or Stopwatch()
    methods = {method.name: method() for method in chosen(spec)}
    with_features = spec.feature_scores or any(m.uses_features for m in methods.values())
    splits = data.splits()

    def on(split: str, **options: Any) -> Outputs:
        return predictive(
            classifier,
            None,
            splits[split],
            samples,
            spec.batch_size,
            device,
            draws=draws,
            progress=progress,
            **options,
        )

    extra = ("features",) * with_features
    with stopwatch.part("predictive"):
        plain = {split: on(split, extra_sites=extra) for split in splits}
    features = {split: out.pop("features") for split, out in plain.items() if with_features}
    context = PosthocContext(
        classifier, draws, data, spec, on, plain, features, device, train_features
    )
    outputs = {PLAIN: plain}
    for name, method in methods.items():
        with stopwatch.part(name):
            method.check(classifier, spec)
            method.fit(context)
            outputs[name] = {split: method.predict(context, split) for split in splits}
    probs = {v: {split: out["probs"] for split, out in by.items()} for v, by in outputs.items()}
    energy = {
        v: {split: out["energy"].mean(0) for split, out in by.items()}
        for v, by in outputs.items()
        if all("energy" in out for out in by.values())
    }
    return probs, energy, plain, features


@register_posthoc
class MCDropout(PosthocPredictive):
    """The posterior predictive with dropout kept on (Gal & Ghahramani 2016)."""

    name = "mc_dropout"

    def predict(self, context: PosthocContext, split: str) -> Outputs:
        return context.on(split, mc_dropout=True)


@register_posthoc
class StochasticAttention(PosthocPredictive):
    """A pretrained backbone's blocks ``stochastic_layers`` sampling their attention weights as
    STO does (Pei et al. 2022, Eq. 9–11) over their trained logits, at the temperature of
    ``stochastic_taus`` with the lowest validation NLL (:func:`stochastic_temperature`)."""

    name = "stochastic_attention"

    @classmethod
    def check(cls, classifier: Classifier, spec: PredictiveSpec) -> None:
        if not isinstance(classifier, BackboneClassifier):
            raise ConfigError(
                "predictive.posthoc = 'stochastic_attention': needs a model.backbone (it "
                "samples the attention weights of a pretrained model's blocks); a model trained "
                "here gets stochastic attention from model.attention"
            )
        with classifier.sampled_attention(spec.stochastic_layers, 1.0):
            pass  # its blocks checked (in range, swappable) before anything trains

    def fit(self, context: PosthocContext) -> None:
        labels = context.data.val.labels.numpy()
        self.tau, self.val = stochastic_temperature(
            context.classifier, context.spec, context.on, labels
        )

    def predict(self, context: PosthocContext, split: str) -> Outputs:
        if split == "val":  # computed when the temperature was chosen
            return self.val
        with context.classifier.sampled_attention(context.spec.stochastic_layers, self.tau):
            return context.on(split)


def stochastic_temperature(
    classifier: BackboneClassifier,
    spec: PredictiveSpec,
    on: Callable[[str], Outputs],
    labels: np.ndarray,
) -> tuple[float, Outputs]:
    """The temperature of ``spec.stochastic_taus`` (× √d_head) whose stochastic-attention
    predictive has the lowest validation NLL, and that validation predictive; says which on
    stderr."""
    scores, predictives = {}, {}
    for tau in spec.stochastic_taus:
        with classifier.sampled_attention(spec.stochastic_layers, tau):
            predictives[tau] = on("val")
        scores[tau] = nll(predictives[tau]["probs"].mean(0), labels)
    best = min(scores, key=scores.__getitem__)
    tried = ", ".join(f"{tau:g}: {value:.4f}" for tau, value in scores.items())
    print(
        f"note: stochastic_attention: tau = {best:g} × √d_head (validation NLL by tau: {tried})",
        file=sys.stderr,
    )
    return best, predictives[best]


@register_posthoc
class LastLayerLaplacePredictive(PosthocPredictive):
    """The last-layer Laplace predictive (:class:`~probtrans.inference.laplace.LastLayerLaplace`)
    from the plain predictive's feature draws (S, N, D), fitted on the training split's
    features (N, D) of the first draw (``train_features()``, or computed on the device), its
    prior precision ``laplace_prior_precision`` or the one of lowest validation NLL. It runs on
    the CPU (where the features are) and has no logits, so no free energy."""

    name = "laplace"
    uses_training_split = True
    uses_features = True

    def fit(self, context: PosthocContext) -> None:
        data, spec, draws = context.data, context.spec, context.draws
        classifier = context.classifier
        if len(data.train) == 0:
            raise ProbtransError(
                f"{data.name}: no training split to fit the last-layer Laplace on (a run "
                f"folder keeps it only when its inference spec asks for the Laplace or for "
                f"PSIS-LOO); load the run with its data: Run.load(path, data=...)"
            )
        if context.train_features is not None:
            train = context.train_features()
        else:
            train = first_draw_features(
                classifier, draws, data.train, spec.batch_size, context.device
            )
        weight = draws["head.weight"][0] if "head.weight" in draws else classifier.head.weight
        bias = draws["head.bias"][0] if "head.bias" in draws else classifier.head.bias
        self.posterior = LastLayerLaplace.fit(torch.as_tensor(train), weight, bias)
        if spec.laplace_prior_precision:
            self.posterior.prior_precision = spec.laplace_prior_precision
        else:
            val = torch.as_tensor(context.features["val"])
            self.posterior.fit_prior_precision(val, data.val.labels.numpy())

    def predict(self, context: PosthocContext, split: str) -> Outputs:
        return {"probs": self.posterior.predictive(torch.as_tensor(context.features[split]))}


def first_draw_features(
    classifier: Classifier,
    draws: dict[str, Tensor],
    split: DataSplit,
    batch_size: int,
    device: str = "cpu",
) -> np.ndarray:
    """The pooled features (N, D) of ``split`` under the first of the posterior ``draws``, one
    sample of any local randomness."""
    first = {name: value[:1] for name, value in draws.items()}
    return sample_predictive(
        classifier, None, split, 1, batch_size, device, extra_sites=("features",), draws=first
    )["features"][0]
