"""Deterministic scaled dot-product attention: the TRANS baseline (Pei et al. 2022, Eq. 7–8)."""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor

from probtrans.attention.kinds import register_attention
from probtrans.attention.multihead import MultiHeadAttention, scaled_dot_product
from probtrans.specs.attention import SoftmaxOptions


class SoftmaxAttention(MultiHeadAttention):
    """a = softmax(q kᵀ / τ), h = a v (Eq. 7–8), through PyTorch's fused
    ``scaled_dot_product_attention``; no sample site.

    ``SoftmaxAttention(d_model, n_heads, **options)``, options by name (defaults and bounds:
    :class:`~probtrans.specs.attention.SoftmaxOptions`): ``tau`` (τ; unset: √d_head),
    ``dropout`` (on the attention weights).
    """

    options_class = SoftmaxOptions

    def __init__(self, d_model: int, n_heads: int, **options: Any) -> None:
        super().__init__(d_model, n_heads, **options)
        self.tau = self.options.tau or math.sqrt(self.d_head)
        self.dropout = self.options.dropout

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> Tensor:
        mask = None if key_mask is None else key_mask[..., None, None, :]  # (B, 1, 1, L)
        return scaled_dot_product(
            q,
            k,
            v,
            mask,
            dropout_p=self.dropout if self.training else 0.0,
            scale=1.0 / self.tau,
        )


register_attention(SoftmaxAttention)
