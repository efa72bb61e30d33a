"""``[model.attention]``: the options of each attention kind, chosen by ``kind``.

Each options class is registered under its ``kind`` in :data:`ATTENTION_OPTIONS`, and a table
that holds attention options is read with the union of the registered classes
(:func:`attention_options`). A kind registered later (a plugin's, through
:func:`probtrans.attention.register_attention`) joins that union in every spec class
(:func:`follow_kinds`), so spec files, the JSON Schema and ``describe`` know it. Each kind's
module lives in :mod:`probtrans.attention` and registers itself under the same ``kind``; the
equations are in the modules' docstrings.
"""

from __future__ import annotations

import typing
from collections.abc import Iterator
from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Tag, model_validator

from probtrans.registry import Registry
from probtrans.specs.base import Positive, PositiveInt, Rate, Spec, rule

KernelName = Literal["exponential", "ard"]

#: ``kind`` → the options class of every attention kind
ATTENTION_OPTIONS: Registry[type[Spec]] = Registry("attention kind")


def kind_of(options: type[Spec] | Spec) -> str:
    """The ``kind`` an options class (or instance) stands for."""
    cls = options if isinstance(options, type) else type(options)
    return cls.model_fields["kind"].default


class KindTag:
    """The discriminator of an attention table: its ``kind``, ``default`` when it has none."""

    def __init__(self, default: str) -> None:
        self.default = default
        self.__name__ = "kind"  # pydantic names the discriminator in its messages

    def __call__(self, value: object) -> object:
        if isinstance(value, dict):
            return value.get("kind", self.default)
        return getattr(value, "kind", None)


def attention_union() -> Any:
    """The union of the registered options classes, each tagged with its ``kind``."""
    members = tuple(
        Annotated[ATTENTION_OPTIONS.get(kind, "kind"), Tag(kind)] for kind in ATTENTION_OPTIONS
    )
    return Union[members]  # noqa: UP007 (a runtime tuple)


def attention_options(default: str) -> Any:
    """The type of an attention table: the options class its ``kind`` names, ``default`` when
    the table has no ``kind`` (a pydantic discriminated union of the registered kinds)."""
    return Annotated[attention_union(), Discriminator(KindTag(default))]


def _spec_classes(cls: type[Spec] = Spec) -> Iterator[type[Spec]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _spec_classes(sub)


def _tables(annotation: Any) -> Iterator[type[Spec]]:
    """The spec classes an annotation names (also inside unions, lists, ``Annotated``)."""
    if isinstance(annotation, type) and issubclass(annotation, Spec):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from _tables(arg)


def follow_kinds() -> None:
    """Give every spec class's attention tables the union of the kinds registered now, and
    rebuild the classes that hold one, directly or in a table (inner tables first: pydantic
    reuses a table's built schema)."""
    holds: dict[type[Spec], bool] = {}

    def rebuild(cls: type[Spec]) -> bool:
        if cls in holds:
            return holds[cls]
        holds[cls] = False  # a table that holds itself holds no union through itself
        fields = cls.model_fields.values()
        direct = False
        for info in fields:
            if any(
                isinstance(m, Discriminator) and isinstance(m.discriminator, KindTag)
                for m in info.metadata
            ):
                info.annotation = attention_union()
                direct = True
        nested = [rebuild(table) for info in fields for table in _tables(info.annotation)]
        holds[cls] = direct or any(nested)
        if holds[cls]:
            cls.model_rebuild(force=True)
        return holds[cls]

    for cls in list(_spec_classes()):
        rebuild(cls)


#: SGPA's initial σ_f² in a pretrained backbone: the unit prior variance of the GP of corrections.
#: It was 10⁻³ while the amortised values were v itself (that amortised KL grew about linearly
#: with σ_f², 4,878 nats per sentence at 1 on all-MiniLM-L6-v2 and CoLA, and drowned the labels)
#: and while the global inducing points explained none of the tokens (a larger σ_f² then only
#: added noise everywhere: CR, seed 0, test NLL 0.303 at 10⁻³, 0.316 at 1). With the corrections
#: v R_h (amortised KL under 0.011 nats a sentence at 1) and the inducing points at the keys
#: (``inducing_map``, ``lengthscale = "keys"``), q(u_g)'s scales set how much of σ_f² reaches
#: the tokens, and σ_f² = 1 lowers the NLL and the ECE against 10⁻³ on the mean of 3 seeds of
#: CoLA and of CR (results/README.md, "SGPA with its inducing points at the keys")
BACKBONE_OUTPUTSCALE = 1.0


def in_backbone(options: Spec, d_head: int) -> Spec:
    """``options`` for a layer swapped into a pretrained backbone whose heads have ``d_head``
    dimensions: every option of the kind's ``backbone_defaults`` that the user did not set takes
    that value (temperatures √d_head and exponential-kernel length scales d_head^¼: the scale
    of the backbone's own logits q·k / √d_head; SGPA's ARD length scales measured on the
    pretrained keys, its prior mean the block's softmax attention)."""
    defaults = getattr(options, "backbone_defaults", None)
    if defaults is None:
        return options
    update = {
        name: value
        for name, value in defaults(d_head).items()
        if name not in options.model_fields_set
    }
    return options.model_copy(update=update) if update else options


def attention_kind(options: type[Spec]) -> type[Spec]:
    """Register the options class ``options`` under its ``kind`` (a class decorator) and let
    every attention table choose it (:func:`follow_kinds`)."""
    ATTENTION_OPTIONS.register(kind_of(options), options)
    follow_kinds()
    return options


@attention_kind
class SoftmaxOptions(Spec):
    """Deterministic scaled dot-product attention (Pei et al. 2022, Eq. 7–8)."""

    kind: Literal["softmax"] = "softmax"
    tau: Positive | None = None
    """a = softmax(q kᵀ / τ); unset: τ = √d_head."""
    dropout: Rate = 0.0
    """Dropout on the attention weights (training, or MC dropout)."""


@attention_kind
class StochasticOptions(Spec):
    """STO-TRANS: Gumbel-softmax attention weights (Pei et al. 2022, Eq. 9–11)."""

    kind: Literal["sto"] = "sto"
    tau: Positive = 1.0
    """Temperature of the relaxed attention over values (no 1/√d scaling: τ absorbs it).
    Swapped into a pretrained backbone, unset: √d_head, the backbone's own softmax scale."""
    hard: bool = False
    """Straight-through one-hot samples (the authors' CoLA setting)."""
    dropout: Rate = 0.0
    """Dropout on the sampled attention weights."""

    @staticmethod
    def backbone_defaults(d_head: int) -> dict[str, float | str]:
        """The options that, unset, a block swapped into a pretrained backbone with heads of
        ``d_head`` dimensions takes (:func:`in_backbone`)."""
        return {"tau": d_head**0.5}


@attention_kind
class HierarchicalOptions(Spec):
    """H-STO-TRANS: keys attend over learned centroids, queries over values (Pei et al. 2022,
    Eq. 14–17)."""

    kind: Literal["h_sto"] = "h_sto"
    tau1: Positive = 1.0
    """Temperature of the attention of keys over centroids (in a backbone, unset: √d_head)."""
    tau2: Positive = 1.0
    """Temperature of the attention of queries over values (in a backbone, unset: √d_head)."""
    n_centroids: PositiveInt = 2
    centroids: Literal["layer", "head"] = "layer"
    """One centroid matrix per layer shared by the heads (the authors' code), or per head."""
    hard: bool = False
    """Straight-through one-hot samples at both levels."""
    dropout: Rate = 0.0
    """Dropout on the sampled value attention."""

    @staticmethod
    def backbone_defaults(d_head: int) -> dict[str, float | str]:
        return {"tau1": d_head**0.5, "tau2": d_head**0.5}


@attention_kind
class SGPAOptions(Spec):
    """Decoupled sparse Gaussian-process attention (Chen & Li 2023, §3.3–3.4)."""

    kind: Literal["sgpa"] = "sgpa"
    kernel: KernelName = "ard"
    """``ard`` (ARD-RBF; the authors' for images) or ``exponential`` (the authors' for text).
    In a pretrained backbone prefer ``ard``: it is bounded by σ_f², where the exponential
    kernel of pretrained keys is not (exp(23.8) on all-MiniLM-L6-v2's top blocks)."""
    n_inducing: PositiveInt = 16
    """M_g global inducing points per layer and head."""
    lengthscale: Positive | Literal["keys"] = 8.0
    """Initial length scales ℓ_i. The default (the digits and CIFAR-10 specs') is a smooth
    kernel over layer-normalised tokens; the authors' text setting, with the exponential
    kernel, is ℓ = 54.6. ``"keys"``, for the ``ard`` kernel in a pretrained backbone: per head,
    the median distance between the keys of the block's pretrained tokens (the median
    heuristic), measured when the layer starts from them. Swapped into a pretrained backbone,
    unset: ``"keys"`` with the ``ard`` kernel (on all-MiniLM-L6-v2's top blocks, 6.2 and 7.1,
    where d_head ** 0.25 = 2.4 left a typical key with a kernel of 0.02 to its nearest global
    key), d_head ** 0.25 with the exponential one, so that ℓ² = √d_head, the scale of the
    backbone's own logits q·k / √d_head."""
    outputscale: Positive = 0.1
    """Initial signal variance σ_f²: small, so the layer's noise starts small next to the
    residual stream (the authors' text setting: 0.0183). At σ_f² = 1 with the exponential
    kernel at ℓ = 1 the amortised KL of a new layer is thousands of nats per example.
    Swapped into a pretrained backbone, unset: :data:`BACKBONE_OUTPUTSCALE` (1: the GP there
    models corrections to the block's softmax attention, whose amortised KL stays small)."""
    jitter: Positive = 1e-6
    """Added to K_gg's diagonal; ten times more after every failed Cholesky."""
    inducing_map: Literal["layernorm", "identity"] = "layernorm"
    """G, the map of the global inducing locations Z_g before the key projection: a LayerNorm
    of the layer's own (for pre-LN blocks, whose attention receives layer-normalised tokens),
    or the identity, Z_g in the space of the block's input tokens. Swapped into a pretrained
    backbone, unset: identity, so that Z_g, started at pretrained tokens, gives their keys (a
    new LayerNorm maps the tokens of a post-LN block such as BERT's elsewhere: on
    all-MiniLM-L6-v2 they moved by 52–78 %)."""
    sampling: Literal["marginal", "full"] = "marginal"
    """F | u_g per token (the authors'), or jointly over tokens."""
    prior_mean: Literal["zero", "softmax"] | None = None
    """The GP's prior mean function m(x): ``zero`` (the paper's), or ``softmax``, the softmax
    attention softmax(q kᵀ / √d_head) v of the layer's own queries, keys and values, so that
    the GP models corrections to it (their amortised values v R_h, R_h learned from zero).
    Unset: zero; swapped into a pretrained backbone,
    softmax, so that the layer starts at what the pretrained block computed (the kernel part
    alone is far from it: on all-MiniLM-L6-v2's top blocks the keys' exponential kernel reaches
    exp(23.8), and even the key-to-key softmax is 120–190 % away from the block's output)."""

    def backbone_defaults(self, d_head: int) -> dict[str, float | str]:
        return {
            "lengthscale": "keys" if self.kernel == "ard" else d_head**0.25,
            "outputscale": BACKBONE_OUTPUTSCALE,
            "prior_mean": "softmax",
            "inducing_map": "identity",
        }

    @model_validator(mode="after")
    def _keys_need_ard(self) -> SGPAOptions:
        if self.lengthscale == "keys" and self.kernel != "ard":
            raise rule(
                "lengthscale",
                "keys",
                f"the median distance between keys is a length scale of the 'ard' kernel, "
                f"not of {self.kernel!r}: give a number",
            )
        return self


@attention_kind
class StandardSGPAOptions(Spec):
    """Standard SGPA, the keys as inducing points (Chen & Li 2023, §3.2); O(T³), for the
    complexity comparison."""

    kind: Literal["sgpa_standard"] = "sgpa_standard"
    kernel: KernelName = "ard"
    lengthscale: Positive = 8.0
    outputscale: Positive = 0.1
    jitter: Positive = 1e-6
    """Added to K_aa's diagonal; ten times more after every failed Cholesky."""


@attention_kind
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


#: ``[model.attention]`` of a model spec: ``softmax`` when ``kind`` is not given
AttentionOptions = attention_options("softmax")
