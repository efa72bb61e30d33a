"""STO-TRANS: stochastic attention weights (Pei et al. 2022, Eq. 9–11).

Per head, â ~ RelaxedOneHotCategorical(τ, logits = q kᵀ) row-wise and h = â v; equivalently
â = softmax((q kᵀ + g) / τ) with g iid Gumbel(0, 1). As in the authors' code there is no 1/√d
scaling: τ absorbs it. Under :func:`~probtrans.contract.fused_attention` (training, and
Predictive without attention sites) â v comes from the fused kernel of
:mod:`probtrans.attention.gumbel`, with the same noise and gradients as the site.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor

from probtrans.attention.gumbel import fused_relaxed_attention, relaxed_one_hot, takes_fused_path
from probtrans.attention.kinds import register_attention
from probtrans.attention.multihead import MultiHeadAttention, masked_logits
from probtrans.contract import sample_attention
from probtrans.specs.attention import StochasticOptions


class StochasticAttention(MultiHeadAttention):
    """STO-TRANS attention (Eq. 9–11): the weights are the sample site ``a_v``, event shape
    (H, L, L).

    ``StochasticAttention(d_model, n_heads, **options)``, options by name (defaults and bounds:
    :class:`~probtrans.specs.attention.StochasticOptions`): ``tau`` (τ), ``hard``
    (straight-through one-hot samples), ``dropout`` (on the sampled weights).
    """

    options_class = StochasticOptions
    sample_sites = ("a_v",)

    def __init__(self, d_model: int, n_heads: int, **options: Any) -> None:
        super().__init__(d_model, n_heads, **options)
        self.tau = self.options.tau
        self.hard = self.options.hard
        self.dropout = self.options.dropout

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> Tensor:
        if takes_fused_path(q, self.hard):
            dropout = self.dropout if self.training else 0.0
            return fused_relaxed_attention(q, k, v, self.tau, key_mask, dropout)
        logits = masked_logits(q @ k.transpose(-1, -2), key_mask)  # (*S, B, H, L, L)
        a_v = sample_attention(self.site("a_v"), relaxed_one_hot(self.tau, logits, self.hard))
        return F.dropout(a_v, self.dropout, self.training) @ v


register_attention(StochasticAttention)
