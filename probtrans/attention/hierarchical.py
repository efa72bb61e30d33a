"""H-STO-TRANS: hierarchical stochastic attention over learned centroids (Pei et al. 2022).

Equations 14–17 of the paper.

Per head, with centroids C ∈ R^{d_h × c}:
    â_c ~ RelaxedOneHotCategorical(τ₁, logits = k C)      (Eq. 14)   (*S, B, H, L, c)
    k̂   = â_c Cᵀ                                          (Eq. 15)   (*S, B, H, L, d_h)
    â_v ~ RelaxedOneHotCategorical(τ₂, logits = q k̂ᵀ)     (Eq. 16)   (*S, B, H, L, L)
    h   = â_v v                                            (Eq. 17)
(*S: sample dimensions, those of vectorised plates; see :mod:`probtrans.attention.multihead`.)
The authors' code shares one centroid matrix per layer across heads with c = 2; ``centroids =
"head"`` gives each head its own. Under :func:`~probtrans.contract.fused_attention`, Eq.
16–17 run as one fused kernel (:mod:`probtrans.attention.gumbel`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from probtrans.attention.gumbel import (
    fused_relaxed_attention,
    relaxed_draw,
    relaxed_one_hot,
    takes_fused_path,
)
from probtrans.attention.kinds import register_attention
from probtrans.attention.multihead import MultiHeadAttention, masked_logits
from probtrans.contract import sample_attention
from probtrans.specs.attention import HierarchicalOptions


class HierarchicalStochasticAttention(MultiHeadAttention):
    """H-STO-TRANS attention (Eq. 14–17): two sample sites per layer, ``a_c`` (H, L, c) and
    ``a_v`` (H, L, L).

    ``HierarchicalStochasticAttention(d_model, n_heads, **options)``, options by name (defaults
    and bounds: :class:`~probtrans.specs.attention.HierarchicalOptions`): ``tau1`` (τ₁, keys over
    centroids), ``tau2`` (τ₂, queries over values), ``n_centroids`` (c), ``centroids`` (one
    matrix per ``"layer"`` or per ``"head"``), ``hard`` (straight-through samples), ``dropout``
    (on the value attention).
    """

    options_class = HierarchicalOptions
    sample_sites = ("a_c", "a_v")

    def __init__(self, d_model: int, n_heads: int, **options: Any) -> None:
        super().__init__(d_model, n_heads, **options)
        opts = self.options
        self.tau1, self.tau2 = opts.tau1, opts.tau2
        self.hard = opts.hard
        self.dropout = opts.dropout
        shape = (self.d_head, opts.n_centroids)
        if opts.centroids == "head":
            shape = (n_heads, *shape)
        self.centroids = nn.Parameter(torch.randn(shape) * self.d_head**-0.5)

    def start_from(self, tokens: Tensor, key_map: nn.Module) -> None:
        """Centroids from the pretrained keys: the keys of ``c`` tokens drawn at random (one
        head's keys, of a random head, for a matrix shared by the layer's heads)."""
        keys = key_map(tokens).unflatten(-1, (self.n_heads, self.d_head))  # (N, H, d)
        c = self.centroids.shape[-1]
        rows = torch.randint(len(keys), (self.n_heads, c), device=keys.device)
        picked = keys[rows, torch.arange(self.n_heads, device=keys.device)[:, None]]  # (H, c, d)
        if self.centroids.dim() == 2:  # shared: one head
            picked = picked[int(torch.randint(self.n_heads, ()))]
        self.centroids.data.copy_(picked.transpose(-1, -2))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> Tensor:
        C = self.centroids  # (d_h, c) or (H, d_h, c); broadcasts over (*S, B, H)
        fused = takes_fused_path(q, self.hard)
        if fused:  # the site is hidden: draw it without the sample statement, as Pyro would
            a_c = relaxed_draw(self.tau1, k @ C)
        else:
            a_c = sample_attention(self.site("a_c"), relaxed_one_hot(self.tau1, k @ C, self.hard))
        k_hat = a_c @ C.transpose(-1, -2)  # (*S, B, H, L, d_h)
        if fused:
            dropout = self.dropout if self.training else 0.0
            return fused_relaxed_attention(q, k_hat, v, self.tau2, key_mask, dropout)
        logits = masked_logits(q @ k_hat.transpose(-1, -2), key_mask)
        a_v = sample_attention(self.site("a_v"), relaxed_one_hot(self.tau2, logits, self.hard))
        return F.dropout(a_v, self.dropout, self.training) @ v


register_attention(HierarchicalStochasticAttention)
