"""Transformer encoder: :class:`EncoderBlock` and :class:`Encoder`, (B, L, D) → (B, L, D).

Both are ``PyroModule``\\ s built by keywords, so they can sit in a user's own Pyro model: the
sample sites of their attention layers are named after the module path, e.g.
``encoder.layers.0.attn.a_v`` for an :class:`Encoder` held as ``self.encoder``. Attention is
pluggable: a kind name of the registry (:data:`probtrans.attention.ATTENTION`) with its options
as keywords, an options object of :mod:`probtrans.specs.attention`, an attention class, or (for
one block) an attention module. The defaults of ``d_ff``, ``dropout`` and ``norm`` are those of
a model spec's ``[model]`` table (:class:`~probtrans.specs.NetworkSpec`). Embeddings and pooling
belong to the model around the encoder (:class:`probtrans.classifier.Classifier`).
"""

from __future__ import annotations

from typing import Any, Literal

from pyro.nn import PyroModule
from torch import Tensor, nn

from probtrans.attention import ATTENTION, MultiHeadAttention
from probtrans.specs import NetworkSpec, Spec

#: an attention kind for :class:`EncoderBlock` and :class:`Encoder`: a kind name (``"sto"``), an
#: options object (``StochasticOptions(tau=0.5)``), an attention class, or a built module
Attention = str | Spec | type[MultiHeadAttention] | MultiHeadAttention


def _network_default(name: str) -> Any:
    """The default of the ``[model]`` field ``name``: written once, in NetworkSpec."""
    return NetworkSpec.model_fields[name].default


D_FF: int = _network_default("d_ff")
DROPOUT: float = _network_default("dropout")
NORM: Literal["pre", "post"] = _network_default("norm")


def make_attention(
    attention: Attention, d_model: int, n_heads: int, **options: Any
) -> MultiHeadAttention:
    """The attention layer that ``attention`` and ``options`` describe (see :data:`Attention`);
    keywords add to or replace those of an options object."""
    if isinstance(attention, MultiHeadAttention):
        if options:
            raise TypeError(
                f"attention options {sorted(options)} given with an already built "
                f"{type(attention).__name__}"
            )
        return attention
    if isinstance(attention, str):
        if attention not in ATTENTION.names():
            raise ValueError(
                f"attention = {attention!r}: unknown attention kind "
                f"(known: {', '.join(ATTENTION.names())})"
            )
        module = ATTENTION.get(attention, "attention")
    elif isinstance(attention, Spec) and "kind" in type(attention).model_fields:
        module = ATTENTION.get(attention.kind, "attention.kind")
        options = {**attention.model_dump(exclude={"kind"}), **options}
    elif isinstance(attention, type) and issubclass(attention, MultiHeadAttention):
        module = attention
    else:
        raise TypeError(
            f"attention = {attention!r}: must be a kind name ({', '.join(ATTENTION.names())}), "
            "an attention options object, an attention class or an attention module"
        )
    return module(d_model, n_heads, **options)


class EncoderBlock(PyroModule):
    """Self-attention and MLP sub-layers with residual connections and LayerNorm.

    Pre-LN: x + attn(LN(x)), then x + mlp(LN(x)); post-LN: LN(x + attn(x)), then LN(x + mlp(x)).

    Args:
        d_model: width of the token representations.
        n_heads: attention heads; must divide ``d_model``.
        d_ff: hidden width of the MLP.
        dropout: dropout rate after each sub-layer and inside the MLP.
        norm: ``"pre"`` or ``"post"`` LayerNorm.
        attention: the attention kind (see :data:`Attention`), by default softmax attention.
        **attention_options: the kind's options by name, e.g. ``tau=0.5`` for ``"sto"``. (The
            attention's own ``dropout`` option, on its weights, goes in an options object,
            ``attention=StochasticOptions(dropout=0.1)``: ``dropout`` here is the block's.)

    Call as ``block(x, mask)``: x (B, L, d_model), mask (B, L) bool, True for real tokens, or
    None → (B, L, d_model). The attention layer is ``block.attn``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        d_ff: int = D_FF,
        dropout: float = DROPOUT,
        norm: Literal["pre", "post"] = NORM,
        attention: Attention = "softmax",
        **attention_options: Any,
    ) -> None:
        if norm not in ("pre", "post"):
            raise ValueError(f"{type(self).__name__}: norm = {norm!r}: must be 'pre' or 'post'")
        attn = make_attention(attention, d_model, n_heads, **attention_options)
        super().__init__()
        self.pre_norm = norm == "pre"
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = attn
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, d_ff), nn.GELU(), nn.Dropout(dropout), nn.Linear(d_ff, d_model)
        )
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        if self.pre_norm:
            x = x + self.drop(self.attn(self.ln1(x), mask))
            return x + self.drop(self.mlp(self.ln2(x)))
        x = self.ln1(x + self.drop(self.attn(x, mask)))
        return self.ln2(x + self.drop(self.mlp(x)))


class Encoder(PyroModule):
    """``n_layers`` :class:`EncoderBlock`\\ s (``encoder.layers``), then a final LayerNorm if
    pre-LN: (B, L, d_model) → (B, L, d_model).

    Args:
        d_model, n_heads, d_ff, dropout, norm, attention, **attention_options: as for
            :class:`EncoderBlock`; every block gets its own attention layer of the same kind and
            options (so ``attention`` is a kind name, options object or class, not a module).
        n_layers: number of blocks.

    Call as ``encoder(x, mask)``: x (B, L, d_model), mask (B, L) bool, True for real tokens, or
    None. Sites of block i's attention: ``{path}.layers.{i}.attn.*``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_layers: int,
        *,
        d_ff: int = D_FF,
        dropout: float = DROPOUT,
        norm: Literal["pre", "post"] = NORM,
        attention: Attention = "softmax",
        **attention_options: Any,
    ) -> None:
        if isinstance(attention, MultiHeadAttention):
            raise TypeError(
                f"{type(self).__name__}: attention = {type(attention).__name__} module: give a "
                "kind name, options object or class, from which every layer builds its own"
            )
        super().__init__()
        block = dict(d_ff=d_ff, dropout=dropout, norm=norm, attention=attention)
        self.layers = PyroModule[nn.ModuleList](
            EncoderBlock(d_model, n_heads, **block, **attention_options) for _ in range(n_layers)
        )
        self.ln_f = nn.LayerNorm(d_model) if norm == "pre" else nn.Identity()

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        for layer in self.layers:
            x = layer(x, mask)
        return self.ln_f(x)
