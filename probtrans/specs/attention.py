"""``[model.attention]``: the options of each attention kind, chosen by ``kind``.

Each kind's module lives in :mod:`probtrans.attention` and is registered there under the
``kind`` of its options class; the equations are in the modules' docstrings.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Tag

from probtrans.specs.base import Positive, PositiveInt, Rate, Spec

KernelName = Literal["exponential", "ard"]


class SoftmaxOptions(Spec):
    """Deterministic scaled dot-product attention (Pei et al. 2022, Eq. 7–8)."""

    kind: Literal["softmax"] = "softmax"
    tau: Positive | None = None
    """a = softmax(q kᵀ / τ); unset: τ = √d_head."""
    dropout: Rate = 0.0
    """Dropout on the attention weights (training, or MC dropout)."""


class StochasticOptions(Spec):
    """STO-TRANS: Gumbel-softmax attention weights (Pei et al. 2022, Eq. 9–11)."""

    kind: Literal["sto"] = "sto"
    tau: Positive = 1.0
    """Temperature of the relaxed attention over values (no 1/√d scaling: τ absorbs it)."""
    hard: bool = False
    """Straight-through one-hot samples (the authors' CoLA setting)."""
    dropout: Rate = 0.0
    """Dropout on the sampled attention weights."""


class HierarchicalOptions(Spec):
    """H-STO-TRANS: keys attend over learned centroids, queries over values (Pei et al. 2022,
    Eq. 14–17)."""

    kind: Literal["h_sto"] = "h_sto"
    tau1: Positive = 1.0
    """Temperature of the attention of keys over centroids."""
    tau2: Positive = 1.0
    """Temperature of the attention of queries over values."""
    n_centroids: PositiveInt = 2
    centroids: Literal["layer", "head"] = "layer"
    """One centroid matrix per layer shared by the heads (the authors' code), or per head."""
    hard: bool = False
    """Straight-through one-hot samples at both levels."""
    dropout: Rate = 0.0
    """Dropout on the sampled value attention."""


class SGPAOptions(Spec):
    """Decoupled sparse Gaussian-process attention (Chen & Li 2023, §3.3–3.4)."""

    kind: Literal["sgpa"] = "sgpa"
    kernel: KernelName = "exponential"
    """``exponential`` (text) or ``ard`` (ARD-RBF, images)."""
    n_inducing: PositiveInt = 16
    """M_g global inducing points per layer and head."""
    lengthscale: Positive = 1.0
    """Initial ARD length scales ℓ_i."""
    outputscale: Positive = 1.0
    """Initial signal variance σ_f²."""
    jitter: Positive = 1e-6
    """Added to K_gg's diagonal; ten times more after every failed Cholesky."""
    sampling: Literal["marginal", "full"] = "marginal"
    """F | u_g per token (the authors'), or jointly over tokens."""


class StandardSGPAOptions(Spec):
    """Standard SGPA, the keys as inducing points (Chen & Li 2023, §3.2); O(T³), for the
    complexity comparison."""

    kind: Literal["sgpa_standard"] = "sgpa_standard"
    kernel: KernelName = "exponential"
    lengthscale: Positive = 1.0
    outputscale: Positive = 1.0
    jitter: Positive = 1e-6
    """Added to K_aa's diagonal; ten times more after every failed Cholesky."""


class GaussianMixtureOptions(Spec):
    """Probabilistic Transformers: attention as MAP inference in a Gaussian mixture (Movellan &
    Gabbur 2020, Eq. 13–21)."""

    kind: Literal["gaussian_mixture"] = "gaussian_mixture"
    alpha: Positive | None = None
    """Query precision α (initial value); unset: 1/√d_head."""
    beta: Positive | None = None
    """Value precision β (initial value); unset: the limit β → 0."""
    precision: Literal["fixed", "shared", "head", "unit"] = "fixed"
    """Where α and β live: constants, one learned value per layer, per head, or per head and
    unit (a learned function of the unit's key and value)."""
    prior: Literal["length", "uniform", "learned"] = "length"
    """π: length-linked (Eq. 16–17), uniform, or learned from the unit's key and value."""
    n_iter: PositiveInt = 1
    """EM iterations of value inference (Eq. 14–15)."""


#: every attention kind's options, in the order the docs list them
KINDS: tuple[type[Spec], ...] = (
    SoftmaxOptions,
    StochasticOptions,
    HierarchicalOptions,
    SGPAOptions,
    StandardSGPAOptions,
    GaussianMixtureOptions,
)


def kind_of(options: type[Spec] | Spec) -> str:
    """The ``kind`` an options class (or instance) stands for."""
    cls = options if isinstance(options, type) else type(options)
    return cls.model_fields["kind"].default


def attention_options(default: str) -> Any:
    """The type of an attention table: the options class its ``kind`` names, ``default`` when
    the table has no ``kind`` (a pydantic discriminated union)."""

    def tag(value: object) -> object:
        return (
            value.get("kind", default) if isinstance(value, dict) else getattr(value, "kind", None)
        )

    members = tuple(Annotated[cls, Tag(kind_of(cls))] for cls in KINDS)
    return Annotated[Union[members], Discriminator(tag)]  # noqa: UP007 (a runtime tuple)


#: ``[model.attention]`` of a model spec: ``softmax`` when ``kind`` is not given
AttentionOptions = attention_options("softmax")
