"""Test-time adaptation of a trained classifier to each unlabelled test batch, before predicting.

Two methods, chosen by name or by their options object:

- ``"em"`` (:class:`EmOptions`): Probabilistic Transformers' inference-time adaptation (Movellan &
  Gabbur 2020, Eq. 29–30). In every Gaussian-mixture attention layer the units' keys ξ adapt to
  the queries by EM under a Gaussian prior N(ξ⁰, θ_ξ⁻¹ I) centred on the trained keys
  (:func:`probtrans.adaptation.em_keys`), then, with ``precision=True``, the query precisions α
  under a Gamma prior whose mode is the trained α (:func:`probtrans.adaptation.em_precision`),
  then the layer infers its values. A layer's units are the tokens of one input, so each input
  adapts its own units to its own queries: nothing is shared between the inputs of a batch or
  between batches, and the predictions do not depend on how the inputs are batched. Only for
  models with Gaussian-mixture attention.
- ``"tent"`` (:class:`TentOptions`): Tent (Wang et al., ICLR 2021, "Tent: Fully Test-Time
  Adaptation by Entropy Minimization"), for any model. A few gradient steps per batch minimise
  the mean entropy of the batch's posterior predictive (the mean of the S sampled probability
  vectors) over the affine parameters (γ, β) of every LayerNorm, all other parameters frozen;
  then the batch is predicted. LayerNorm has no batch statistics to re-estimate (the Tent
  paper's BatchNorm has), so the gradient steps are the whole adaptation. The LayerNorm
  parameters and the optimiser are reset to the trained state before every batch, unless
  ``online=True``: then they carry over from batch to batch (the order of the batches then
  matters) and are reset when the adaptation ends.

Use :func:`adapted_predictive`, :func:`probtrans.inference.predictive.sample_predictive` with
the adaptation, e.g. ``adapted_predictive(classifier, None, split, "em", samples, draws=draws)``
(the same arguments, and ``adapt``); or, batch by batch, the context
:func:`test_time_adaptation`, whose :meth:`Adaptation.adapt` prepares the model for one batch.

What the adaptation leaves as it was when it ends: every parameter's value, ``requires_grad``
and ``.grad``, the train/eval mode, the mixture layers' ``adaptation`` hooks, the Pyro param
store (parameters stay module-local) and the caller's random state (Tent's passes draw their
attention noise from a generator forked and seeded with ``TentOptions.seed``, so the predictive
draws the same noise as it would without adaptation, and a batch adapts the same whatever came
before it).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from pyro import poutine
from torch import Tensor, nn

from probtrans.adaptation import adapting, em_keys, em_precision, mixture_layers
from probtrans.attention import MultiHeadAttention, attention_sites
from probtrans.attention.gaussian_mixture import Mixture
from probtrans.contract import local_params
from probtrans.data import DataSplit
from probtrans.errors import ProbtransError
from probtrans.inference.objective import self_guided
from probtrans.inference.predictive import is_point_mass, posterior_draws, sample_predictive
from probtrans.progress import progress_bar
from probtrans.pyro_internals import pyro_sample_names

#: the test-time adaptation methods, by name
METHODS = ("em", "tent")


@dataclass(frozen=True)
class EmOptions:
    """EM adaptation of Gaussian-mixture attention (Eq. 29–30), in every mixture layer.

    The defaults are those that ``benchmarks/adaptation.py --tune`` chose on the digits
    validation split (never the test split) under the digits-C corruptions: the best accuracy
    averaged over severities 3–5, losing at most 0.5 points of clean accuracy. Weak adaptation
    won: one EM step of the keys with a strong prior (θ_ξ = 10), and no precision step (Eq. 30
    lowered validation accuracy in every setting tried; ``precision=True`` turns it on, with the
    best of its priors tried, θ_α1 = 100).
    """

    n_iter: int = 1
    """EM steps of the keys (Eq. 29), then as many of the precisions (Eq. 30)."""
    theta_xi: float = 10.0
    """Precision θ_ξ of the keys' Gaussian prior around the trained keys: small follows the
    queries, large keeps the trained keys."""
    anchor: Literal["trained", "previous"] = "trained"
    """Centre of the keys' prior: the trained keys (the paper) or the previous iterate."""
    precision: bool = False
    """Also adapt the query precisions α (Eq. 30) after the keys."""
    theta_alpha1: float = 100.0
    """Shape θ_α1 > 1 of the precisions' Gamma prior: large keeps the trained α."""
    theta_alpha2: float | None = None
    """Rate θ_α2 of the Gamma prior; None puts its mode (θ_α1 − 1)/θ_α2 on the trained α."""

    method: Literal["em"] = "em"

    def __post_init__(self) -> None:
        if not (isinstance(self.n_iter, int) and self.n_iter >= 1):
            raise ProbtransError(f"em: n_iter = {self.n_iter!r}: must be an integer ≥ 1")
        if not self.theta_xi > 0:
            raise ProbtransError(f"em: theta_xi = {self.theta_xi}: must be > 0")
        if not self.theta_alpha1 > 1:
            raise ProbtransError(f"em: theta_alpha1 = {self.theta_alpha1}: must be > 1")
        if self.theta_alpha2 is not None and not self.theta_alpha2 > 0:
            raise ProbtransError(f"em: theta_alpha2 = {self.theta_alpha2}: must be > 0")
        if self.anchor not in ("trained", "previous"):
            raise ProbtransError(f"em: anchor = {self.anchor!r}: must be 'trained' or 'previous'")

    def update(self, q: Tensor, mix: Mixture) -> Mixture:
        """One layer's units adapted to its queries q (B, H, L, d): keys, then precisions."""
        mix = em_keys(q, mix, self.n_iter, self.theta_xi, self.anchor, query_mask=mix.mask)
        if self.precision:
            mix = em_precision(
                q, mix, self.n_iter, self.theta_alpha1, self.theta_alpha2, query_mask=mix.mask
            )
        return mix


@dataclass(frozen=True)
class TentOptions:
    """Tent: entropy minimisation over the LayerNorm affine parameters, per batch.

    The defaults are those that ``benchmarks/adaptation.py --tune`` chose on the digits
    validation split (never the test split) under the digits-C corruptions, for the
    Gaussian-mixture and H-STO models together (the rule of :class:`EmOptions`): one Adam step
    of learning rate 10⁻³. Larger steps or more of them lowered accuracy at severities 4–5.
    """

    steps: int = 1
    """Gradient steps per batch."""
    lr: float = 1e-3
    """Learning rate."""
    optimizer: Literal["adam", "sgd"] = "adam"
    """Adam (Tent's choice on CIFAR) or SGD with momentum 0.9 (its choice on ImageNet)."""
    online: bool = False
    """Carry the adapted parameters and the optimiser's state over from batch to batch (reset
    when the adaptation ends); False: every batch starts from the trained state."""
    samples: int | None = None
    """Posterior draws (or local-noise replicas) in the predictive whose entropy is minimised;
    None: those of the predictive. A pass holds ``samples`` × the batch's rows, with gradients."""
    seed: int = 0
    """Seed of the attention noise Tent's own passes draw (the caller's generator is kept)."""

    method: Literal["tent"] = "tent"

    def __post_init__(self) -> None:
        if not (isinstance(self.steps, int) and self.steps >= 1):
            raise ProbtransError(f"tent: steps = {self.steps!r}: must be an integer ≥ 1")
        if not self.lr > 0:
            raise ProbtransError(f"tent: lr = {self.lr}: must be > 0")
        if self.optimizer not in ("adam", "sgd"):
            raise ProbtransError(f"tent: optimizer = {self.optimizer!r}: must be 'adam' or 'sgd'")
        if self.samples is not None and not (isinstance(self.samples, int) and self.samples >= 1):
            raise ProbtransError(f"tent: samples = {self.samples!r}: must be an integer ≥ 1")


Options = EmOptions | TentOptions


def adaptation_options(adapt: str | Options, online: bool = False, **options: object) -> Options:
    """The options of ``adapt``: a method name (``"em"``, ``"tent"``) with ``options`` by name
    (the fields of :class:`EmOptions` or :class:`TentOptions`), or an options object.
    ``online=True`` (Tent only) carries the adapted state over from batch to batch."""
    if isinstance(adapt, EmOptions | TentOptions):
        if options:
            adapt = dataclasses.replace(adapt, **options)
        if online and isinstance(adapt, TentOptions):
            adapt = dataclasses.replace(adapt, online=True)
    elif adapt == "em":
        try:
            adapt = EmOptions(**options)
        except TypeError:
            raise _unknown_options("em", EmOptions, options) from None
    elif adapt == "tent":
        try:
            adapt = TentOptions(online=online, **options)
        except TypeError:
            raise _unknown_options("tent", TentOptions, options) from None
    else:
        raise ProbtransError(
            f"test-time adaptation {adapt!r}: unknown; one of {', '.join(METHODS)}"
        )
    if online and isinstance(adapt, EmOptions):
        raise ProbtransError(
            "online adaptation is for 'tent' only: 'em' adapts each input's own units to its own "
            "queries, so there is no state to carry from one batch to the next"
        )
    return adapt


def _unknown_options(method: str, cls: type, options: dict[str, object]) -> ProbtransError:
    fields = [f.name for f in dataclasses.fields(cls) if f.name != "method"]
    unknown = sorted(set(options) - set(fields))
    return ProbtransError(
        f"{method}: unknown option {', '.join(map(repr, unknown))} (options: {', '.join(fields)})"
    )


def attention_kinds(classifier: nn.Module) -> list[str]:
    """The attention kinds of the layers of ``classifier``, sorted."""
    return sorted(
        {
            getattr(layer.options, "kind", type(layer).__name__)
            for layer in classifier.modules()
            if isinstance(layer, MultiHeadAttention)
        }
    )


def layer_norm_parameters(classifier: nn.Module) -> list[nn.Parameter]:
    """The affine parameters (γ, β) of every LayerNorm of ``classifier``, which Tent adapts; an
    error where there are none, or where they carry priors (random weights: the draws of a
    guide, not parameters)."""
    norms = [m for m in classifier.modules() if isinstance(m, nn.LayerNorm)]
    drawn = [name for m in norms for name in pyro_sample_names(m)]
    if drawn:
        raise ProbtransError(
            "test-time adaptation 'tent' adapts the LayerNorm parameters, and this model's "
            "LayerNorm weights carry priors ([model.prior] weights = 'all'): use a model with "
            "priors on the last layer only"
        )
    parameters = [p for m in norms for p in m.parameters(recurse=False)]
    if not parameters:
        raise ProbtransError(
            "test-time adaptation 'tent' adapts the LayerNorm affine parameters, and this model "
            "has none"
        )
    return parameters


def _rows(inputs: Tensor, mask: Tensor | None, replicas: int, device: torch.device | str):
    rows = inputs.repeat(replicas, *[1] * (inputs.dim() - 1)).to(device)
    return rows, None if mask is None else mask.repeat(replicas, 1).to(device)


def predictive_mean_entropy(
    classifier: nn.Module,
    inputs: Tensor,
    mask: Tensor | None,
    draws: dict[str, Tensor],
    samples: int,
    device: torch.device | str = "cpu",
) -> Tensor:
    """The mean over the batch of the entropy of the posterior predictive
    p(y | x) = (1/S) Σ_s p(y | x, W_s, â_s), differentiable: what Tent minimises (a scalar).

    S passes of the draws (site → (S, ...)), or one pass of ``samples`` replicas of the batch
    when the draws are all equal and the model has local randomness, as
    :func:`probtrans.inference.predictive.sample_predictive` draws them."""
    model = self_guided(classifier)
    n = len(inputs)
    if is_point_mass(draws):
        local = bool(attention_sites(classifier))
        passes = [(0, samples if local else 1)]
    else:
        passes = [(s, 1) for s in range(samples)]
    total: Tensor | float = 0.0
    for s, replicas in passes:
        data = {name: value[s].to(device) for name, value in draws.items()}
        rows, rows_mask = _rows(inputs, mask, replicas, device)
        trace = poutine.trace(poutine.condition(model, data=data)).get_trace(rows, rows_mask)
        probs = trace.nodes["probs"]["value"]
        total = total + probs.reshape(replicas, n, -1).sum(0)
    mean = total / sum(replicas for _, replicas in passes)
    return -torch.xlogy(mean, mean).sum(-1).mean()


class Adaptation:
    """Test-time adaptation of ``classifier`` while the context is open (see
    :func:`test_time_adaptation`): with ``em``, every forward pass adapts the mixture layers to
    its queries; with ``tent``, :meth:`adapt` adapts the LayerNorm parameters to one batch.
    Everything is restored on leaving the context."""

    def __init__(self, classifier: nn.Module, options: Options) -> None:
        self.classifier = classifier
        self.options = options
        self._stack: contextlib.ExitStack | None = None
        self._optimiser: torch.optim.Optimizer | None = None
        if isinstance(options, EmOptions):
            self.layers = mixture_layers(classifier)
            if not self.layers:
                kinds = ", ".join(repr(kind) for kind in attention_kinds(classifier)) or "none"
                raise ProbtransError(
                    f"test-time adaptation 'em' adapts Gaussian-mixture attention and this "
                    f"model's attention is {kinds}: use 'tent' (entropy minimisation over the "
                    f"LayerNorm parameters), which adapts any model"
                )
            self.parameters: list[nn.Parameter] = []
        else:
            self.layers = []
            self.parameters = layer_norm_parameters(classifier)

    def __enter__(self) -> Adaptation:
        stack = contextlib.ExitStack()
        if isinstance(self.options, EmOptions):
            stack.enter_context(adapting(self.classifier, self.options.update, self.layers))
        else:
            everything = list(self.classifier.parameters())
            flags = [p.requires_grad for p in everything]
            grads = [p.grad for p in self.parameters]
            trained = [p.detach().clone() for p in self.parameters]

            def restore() -> None:
                with torch.no_grad():
                    for p, value, grad in zip(self.parameters, trained, grads, strict=True):
                        p.copy_(value)
                        p.grad = grad
                for p, flag in zip(everything, flags, strict=True):
                    p.requires_grad_(flag)
                self._optimiser = None

            stack.callback(restore)
            for p in everything:
                p.requires_grad_(False)
            for p in self.parameters:
                p.requires_grad_(True)
            self._trained = trained
        self._stack = stack
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stack is not None
        self._stack.close()
        self._stack = None

    def adapt(
        self,
        inputs: Tensor,
        mask: Tensor | None,
        draws: dict[str, Tensor],
        samples: int,
        device: torch.device | str = "cpu",
    ) -> None:
        """Prepare the model for the batch (inputs, mask), whose predictive will use ``draws``
        (site → (S, ...)) and S = ``samples``. Tent: its gradient steps; em: nothing (each
        forward pass adapts)."""
        if self._stack is None:
            raise RuntimeError("Adaptation.adapt: outside its context (use `with`)")
        options = self.options
        if not isinstance(options, TentOptions):
            return
        if not options.online or self._optimiser is None:
            with torch.no_grad():
                for p, value in zip(self.parameters, self._trained, strict=True):
                    p.copy_(value)
            self._optimiser = self._new_optimiser(options)
        if options.samples is not None:
            samples = min(samples, options.samples)
            if not is_point_mass(draws):
                draws = {name: value[:samples] for name, value in draws.items()}
        was_training = self.classifier.training
        self.classifier.eval()
        gpus = [torch.device(device).index or 0] if torch.device(device).type == "cuda" else []
        try:
            with torch.enable_grad(), local_params(), torch.random.fork_rng(devices=gpus):
                torch.manual_seed(options.seed)
                for _ in range(options.steps):
                    loss = predictive_mean_entropy(
                        self.classifier, inputs, mask, draws, samples, device
                    )
                    self._optimiser.zero_grad(set_to_none=True)
                    loss.backward()
                    self._optimiser.step()
        finally:
            self.classifier.train(was_training)

    def _new_optimiser(self, options: TentOptions) -> torch.optim.Optimizer:
        if options.optimizer == "adam":
            return torch.optim.Adam(self.parameters, lr=options.lr)
        return torch.optim.SGD(self.parameters, lr=options.lr, momentum=0.9)


def test_time_adaptation(
    classifier: nn.Module, adapt: str | Options, online: bool = False, **options: object
) -> Adaptation:
    """The context in which ``classifier`` adapts to each test batch: ``adapt`` is ``"em"`` or
    ``"tent"`` with ``options`` by name, or an :class:`EmOptions` / :class:`TentOptions`;
    ``online=True`` (Tent) carries the adapted state over between batches. ``em`` on a model
    without Gaussian-mixture attention raises :class:`~probtrans.errors.ProbtransError`.

    ::

        with test_time_adaptation(classifier, "tent") as adaptation:
            for inputs, mask in batches:
                adaptation.adapt(inputs, mask, draws, samples)  # Tent's steps; em: nothing
                ...  # predict the batch

    :func:`adapted_predictive` does this over a split."""
    return Adaptation(classifier, adaptation_options(adapt, online, **options))


test_time_adaptation.__test__ = False  # not a test, for pytest, when a test module imports it


def adapted_predictive(
    classifier: nn.Module,
    guide: object,
    split: DataSplit,
    adapt: str | Options,
    samples: int = 10,
    batch_size: int = 256,
    device: str = "cpu",
    attention: bool = False,
    draws: dict[str, Tensor] | None = None,
    mc_dropout: bool = False,
    extra_sites: Sequence[str] = (),
    progress: bool = False,
) -> dict[str, np.ndarray]:
    """:func:`probtrans.inference.predictive.sample_predictive`, each batch of ``batch_size``
    examples of ``split`` predicted after the model has adapted to it (``adapt``: see
    :func:`test_time_adaptation`). The same arguments, the same result; the S global draws are
    taken once and shared by every batch. Batches are cut as ``sample_predictive`` cuts them
    (rows in order of length); the predictive of one batch may take several passes."""
    adaptation = Adaptation(classifier, adaptation_options(adapt))  # checks the model
    same = dict(attention=attention, mc_dropout=mc_dropout, extra_sites=extra_sites)
    if len(split) == 0:
        return sample_predictive(
            classifier, guide, split, samples, batch_size, device, draws=draws, **same
        )
    if draws is None:
        draws = posterior_draws(guide, samples, split, device)
    chunks: list[dict[str, np.ndarray]] = []
    located: list[Tensor] = []
    indices = split.batch_indices(batch_size, by_length=True)
    with adaptation:
        for index in progress_bar(
            indices, desc="adapted predictive", leave=False, disable=not progress
        ):
            _, inputs, mask, labels = split.batch(index, trim=not attention)
            adaptation.adapt(inputs, mask, draws, samples, device)
            part = DataSplit(inputs, labels, mask)
            chunks.append(
                sample_predictive(
                    classifier, None, part, samples, batch_size, device, draws=draws, **same
                )
            )
            located.append(index)
    order = torch.cat(located).argsort().numpy()
    return {name: np.concatenate([c[name] for c in chunks], axis=1)[:, order] for name in chunks[0]}


__all__ = [
    "METHODS",
    "Adaptation",
    "EmOptions",
    "TentOptions",
    "adaptation_options",
    "adapted_predictive",
    "predictive_mean_entropy",
    "test_time_adaptation",
]
