"""Multi-head self-attention skeleton shared by every attention kind.

An attention kind subclasses :class:`MultiHeadAttention`, names its options class (a
:class:`~probtrans.specs.base.Spec` of :mod:`probtrans.specs.attention`, where the defaults and
bounds are written) as :attr:`~MultiHeadAttention.options_class`, and implements :meth:`attend`
on per-head queries, keys and values. It is built by keywords, ``StochasticAttention(64, 4,
tau=0.5)``; the options are checked by the options class and kept as ``layer.options``.
Stochastic kinds draw their weights as self-guided Pyro sample sites
(:func:`probtrans.contract.sample_attention`). A layer is a ``PyroModule``, so its sites are
named after where it sits in the model: ``encoder.layers.0.attn.a_v`` in a
:class:`~probtrans.classifier.Classifier`, ``attn1.a_v`` as the attribute ``attn1`` of a user's
``PyroModule``, ``a_v`` on its own.

Extra batch dimensions. A layer takes x (*S, B, L, d_model) with a mask (B, L): the dimensions
left of (B, L) are sample dimensions, those of Pyro's vectorised plates
(``Predictive(..., parallel=True)``, vectorised ELBO particles) in a user's model whose data
plate is at dim −1; every kind computes on negative dimensions and broadcasts its weights, sites
and the mask over them. A layer that gets x (B, L, D) while its sample sites (or SGPA's
``u_g``) carry a vectorised plate's dimension returns (S, B, L, D).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from pydantic import ValidationError
from pyro.nn import PyroModule
from torch import Tensor, nn

from probtrans.specs import Spec
from probtrans.specs.base import explain


def masked_logits(logits: Tensor, key_mask: Tensor | None) -> Tensor:
    """Give padding keys logit −∞ so they get exactly zero attention weight.

    logits: (*S, B, H, L_q, L_k); key_mask: (B, L_k), True for real tokens.
    """
    if key_mask is None:
        return logits
    return logits.masked_fill(~key_mask[..., None, None, :], float("-inf"))


def scaled_dot_product(
    q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, **kwargs: Any
) -> Tensor:
    """PyTorch's ``scaled_dot_product_attention`` over any batch dimensions.

    q: (*, H, L_q, d); k, v: (*, H, L_k, d|d_v); attn_mask: (*, H|1, L_q|1, L_k) or None; the
    batch dimensions ``*`` broadcast against each other → (*, H, L_q, d_v). Inputs of one batch
    dimension go to PyTorch as they are; others are expanded and flattened to one batch
    dimension, the 4-D shape its fused kernels take. ``kwargs``: PyTorch's (``dropout_p``,
    ``scale``).
    """
    tensors = [q, k, v] if attn_mask is None else [q, k, v, attn_mask]
    if all(t.dim() == 4 for t in tensors):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **kwargs)
    batch = torch.broadcast_shapes(*(t.shape[:-3] for t in tensors))
    flat = [t.expand(*batch, *t.shape[-3:]).flatten(0, -4) if batch else t for t in tensors]
    h = F.scaled_dot_product_attention(
        *flat[:3], attn_mask=None if attn_mask is None else flat[3], **kwargs
    )
    return h.unflatten(0, batch) if batch else h


def check_options(cls: type, options_class: type[Spec], options: dict[str, Any]) -> Any:
    """``options`` (keywords) validated by ``options_class``; an unknown keyword raises
    TypeError and a bad value ValueError, both starting with the name of ``cls``."""
    names = [name for name in options_class.model_fields if name != "kind"]
    unknown = [name for name in options if name not in names]
    if unknown:
        raise TypeError(
            f"{cls.__name__}: unknown option {unknown[0]!r} (options: {', '.join(names)})"
        )
    try:
        return options_class(**options)
    except ValidationError as err:
        raise ValueError(f"{cls.__name__}: {explain(options_class, err)}") from None


def check_tokens(layer: MultiHeadAttention, x: Tensor, mask: Tensor | None) -> None:
    """Refuse inputs that are not (*S, B, L, d_model) with a mask (B, L) (the mask broadcasts
    over the sample dimensions *S)."""
    width = layer.n_heads * layer.d_head
    if x.dim() < 3 or x.shape[-1] != width:
        raise ValueError(
            f"{type(layer).__name__}: x of shape {tuple(x.shape)}: must be (B, L, {width}), "
            f"or (*S, B, L, {width}) with sample dimensions *S on the left"
        )
    if mask is not None and tuple(mask.shape) != tuple(x.shape[-3:-1]):
        raise ValueError(
            f"{type(layer).__name__}: mask of shape {tuple(mask.shape)}: must be "
            f"{tuple(x.shape[-3:-1])}, that of x's last two dimensions before d_model"
        )


class MultiHeadAttention(PyroModule):
    """Query/key/value/output projections around a per-head :meth:`attend`.

    Args:
        d_model: width of the token representations.
        n_heads: number of heads; must divide ``d_model``.
        **options: the options of the kind, by name (see :attr:`options_class`); checked and
            kept as :attr:`options`.

    Call as ``layer(x, mask)``: x (B, L, d_model), mask (B, L) bool, True for real tokens
    (padding keys get zero weight), or None → (B, L, d_model); x may have sample dimensions on
    the left, (*S, B, L, d_model) → (*S, B, L, d_model), the mask staying (B, L) (see the module
    docstring).
    """

    #: the kind's options (pydantic, :mod:`probtrans.specs.attention`): names, defaults, bounds
    options_class: ClassVar[type[Spec]]
    #: whether the layer has the fused query/key/value projection ``qkv``; kinds with their own
    #: projections (SGPA's shared W_qk) set False and override :meth:`forward`
    fused_qkv: ClassVar[bool] = True
    #: local sample sites :meth:`attend` draws (names within the layer)
    sample_sites: ClassVar[tuple[str, ...]] = ()
    #: global inducing-variable sites of the layer (names within the layer)
    inducing_sites: ClassVar[tuple[str, ...]] = ()
    #: why the kind cannot form the weights of a pretrained block (None: it can,
    #: :meth:`attend_projected`)
    backbone_refusal: ClassVar[str | None] = None

    def __init__(
        self, d_model: int, n_heads: int, *, projections: bool = True, **options: Any
    ) -> None:
        checked = check_options(type(self), self.options_class, options)
        if d_model % n_heads:
            raise ValueError(
                f"{type(self).__name__}: n_heads = {n_heads} must divide d_model = {d_model}"
            )
        super().__init__()
        #: the validated options (an instance of :attr:`options_class`)
        self.options = checked
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        #: whether the layer has its own projections (False: it sits in a pretrained block,
        #: whose projections it uses through :meth:`attend_projected`)
        self.projections = projections
        if projections and self.fused_qkv:
            self.qkv = nn.Linear(d_model, 3 * d_model)
        if projections:
            self.out = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """x: (*S, B, L, D); mask: (B, L) bool, True for real tokens → (*S, B, L, D), or
        (S, B, L, D) for x (B, L, D) when sample sites carry a vectorised plate's dimension."""
        check_tokens(self, x, mask)
        qkv = self.qkv(x).unflatten(-1, (3, self.n_heads, self.d_head))  # (*S, B, L, 3, H, d)
        q, k, v = (t.transpose(-2, -3) for t in qkv.unbind(-3))  # (*S, B, H, L, d) each
        h = self.attend(q, k, v, mask)  # (*S', B, H, L, d)
        return self.out(h.transpose(-2, -3).flatten(-2))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> Tensor:
        """q, k, v: (*S, B, H, L, d_head), key_mask (B, L) → (*S', B, H, L, d_head), *S' the
        sample dimensions of the inputs broadcast with those of the layer's sites."""
        raise NotImplementedError

    def attend_projected(
        self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, key_map: nn.Module
    ) -> Tensor:
        """The weights of a pretrained block formed by this kind: q, k, v (B, H, L, d_head)
        from the block's own projections; ``key_map`` the block's key projection (for kinds
        that map more than the tokens to keys) → (B, H, L, d_head)."""
        return self.attend(q, k, v, key_mask)

    def start_from(self, tokens: Tensor, key_map: nn.Module) -> None:
        """Initial values from a pretrained block: the tokens (N, D) it receives and its key
        projection. Kinds with parameters of their own (centroids, inducing locations) take
        them from there; the rest keep theirs."""

    def site(self, name: str) -> str:
        """The model-wide name of this layer's site ``name``: its module path and ``name``, as
        Pyro names a ``PyroSample`` attribute."""
        path = self._pyro_name
        return f"{path}.{name}" if path else name


def attention_sites(model: nn.Module) -> list[str]:
    """Names of the local attention sites of every attention layer in ``model``."""
    return [
        layer.site(name)
        for layer in model.modules()
        if isinstance(layer, MultiHeadAttention)
        for name in layer.sample_sites
    ]


def inducing_sites(model: nn.Module) -> list[str]:
    """Names of the global inducing-variable sites in ``model``, e.g.
    ``encoder.layers.0.attn.u_g``."""
    return [
        layer.site(name)
        for layer in model.modules()
        if isinstance(layer, MultiHeadAttention)
        for name in layer.inducing_sites
    ]
