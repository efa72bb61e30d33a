"""Deterministic scaled dot-product attention: the TRANS baseline (Pei et al. 2022, Eq. 7–8)."""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor

from probtrans.attention.base import MultiHeadAttention
from probtrans.specs import SoftmaxOptions


class SoftmaxAttention(MultiHeadAttention):
    """a = softmax(q kᵀ / τ), h = a v, through PyTorch's fused ``scaled_dot_product_attention``."""

    def __init__(self, d_model: int, n_heads: int, options: SoftmaxOptions) -> None:
        super().__init__(d_model, n_heads)
        self.tau = options.tau or math.sqrt(self.d_head)
        self.dropout = options.dropout

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> Tensor:
        mask = None if key_mask is None else key_mask[:, None, None, :]
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            scale=1.0 / self.tau,
        )
