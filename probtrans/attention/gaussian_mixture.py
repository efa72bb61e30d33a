"""Gaussian-mixture attention: Probabilistic Transformers (Movellan & Gabbur 2020).

Every token is a *unit* j of a Gaussian mixture with key ξ_j, expected value μ_j, query precision
α_j, value precision β_j and prior π_ij (Eq. 2, 7–11):

    p_i(q, v) = Σ_j π_ij N(q; ξ_j, α_j⁻¹ I_d) N(v; μ_j, β_j⁻¹ I_m)

Attention is MAP inference of the value v_i of the unit that received query q_i, by EM:

    E-step  w_ij ∝ π_ij N(q_i; ξ_j, α_j⁻¹ I) N(v_i^t; μ_j, β_j⁻¹ I)          (Eq. 15)
    M-step  v_i^{t+1} = Σ_j w_ij β_j μ_j / Σ_j w_ij β_j                       (Eq. 13)

which is Eq. 14, v_i = Σ_j w_ij μ_j, whenever β is equal across units. Where this module is more
explicit than the paper's equations:

- w keeps the Gaussian normalisers α_j^{d/2} β_j^{m/2} of Eq. 10–11 (Eq. 15 prints β_j); they
  cancel when the precisions are equal across units and keep EM exact when they are not.
- The first E-step has no value estimate yet, so it uses the query alone, w_ij = p(u_j | q_i)
  (as in Eq. 27); later E-steps use Eq. 15 with the current estimate v^t.

Length-linked priors (Eq. 16–17), π_ij = exp(α/2 ‖ξ_j‖² + β/2 ‖μ_j‖²) / k, with shared
precisions give w_ij = softmax_j(α ξ_j·q_i + β μ_j·v_i) (Eq. 19), and as β → 0 the softmax
attention softmax_j(α ξ_j·q_i) (Eq. 20–21), for which one EM step is exact. Standard scaled
dot-product attention softmax(q·kᵀ/√d_h) is therefore α = 1/√d_h (the default here), i.e.
α = 1/τ for the τ of :class:`~probtrans.specs.attention.SoftmaxOptions`. ``beta = None`` is the
β → 0 limit: the value term is dropped.

Per-unit precisions and learned priors depend on the input through the unit's own key and value
(the paper lets α, β, π be any function of x). Padding units get exactly zero responsibility.

In a bfloat16 autocast region the projections run in bfloat16 and the mixture (precisions,
priors, square distances ‖q‖² + ‖ξ‖² − 2 q·ξ, whose terms cancel, and the EM iterations) in
float32, with autocast off.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from probtrans.attention.kinds import register_attention
from probtrans.attention.multihead import MultiHeadAttention
from probtrans.runtime.precision import autocast_off, full_precision
from probtrans.specs.attention import GaussianMixtureOptions


@dataclass
class Mixture:
    """The parameters of one layer's units for a batch, per head.

    Precisions have a last dimension of size n (per unit) or 1 (equal across units). Every
    tensor may have sample dimensions *S left of B (:mod:`probtrans.attention.multihead`).
    """

    keys: Tensor  # ξ (B, H, n, d)
    values: Tensor  # μ (B, H, n, m)
    alpha: Tensor  # α, broadcastable to (B, H, n)
    beta: Tensor | None  # β, broadcastable to (B, H, n); None is the limit β → 0
    log_prior: Tensor  # log π (B, H, n_q or 1, n); −inf at padding units
    mask: Tensor | None = None  # (B, n) bool, True for real units

    def replace(self, **changes: Tensor | None) -> Mixture:
        return dataclasses.replace(self, **changes)


def square_distance(a: Tensor, b: Tensor) -> Tensor:
    """‖a_i − b_j‖² for a (..., L, d) and b (..., n, d) → (..., L, n)."""
    cross = a @ b.transpose(-1, -2)
    squares = a.pow(2).sum(-1, keepdim=True) + b.pow(2).sum(-1).unsqueeze(-2)
    return (squares - 2 * cross).clamp_min(0)


def mask_units(scores: Tensor, mask: Tensor | None) -> Tensor:
    """Set scores (*S, B, H, L, n) of padding units to −inf; mask (B, n), True for real units."""
    if mask is None:
        return scores
    return scores.masked_fill(~mask[..., None, None, :], float("-inf"))


def log_joint(q: Tensor, mix: Mixture, v: Tensor | None = None) -> Tensor:
    """log π_ij + log N(q_i; ξ_j, α_j⁻¹ I) [+ log N(v_i; μ_j, β_j⁻¹ I)] (Eq. 2, 7–11).

    q: (B, H, L, d); v: (B, H|1, L, m) or None (value marginalised) → (B, H, L, n).
    """
    d = q.shape[-1]
    alpha = mix.alpha.unsqueeze(-2)  # (B|1, H|1, 1, n|1)
    scores = mix.log_prior + 0.5 * d * torch.log(alpha / (2 * math.pi))
    scores = scores - 0.5 * alpha * square_distance(q, mix.keys)
    if v is not None and mix.beta is not None:
        m = v.shape[-1]
        beta = mix.beta.unsqueeze(-2)
        scores = scores + 0.5 * m * torch.log(beta / (2 * math.pi))
        scores = scores - 0.5 * beta * square_distance(v, mix.values)
    return mask_units(scores, mix.mask)


def responsibilities(q: Tensor, mix: Mixture, v: Tensor | None = None) -> Tensor:
    """w_ij = p(u_j | q_i [, v_i]) (Eq. 5, 15, 27, 36): (B, H, L, n), rows sum to one."""
    return log_joint(q, mix, v).softmax(-1)


def value_m_step(w: Tensor, mix: Mixture) -> Tensor:
    """v_i = Σ_j w_ij β_j μ_j / Σ_j w_ij β_j (Eq. 13); Eq. 14 when β is equal across units."""
    if mix.beta is None or mix.beta.shape[-1] == 1:
        return w @ mix.values
    wb = w * mix.beta.unsqueeze(-2)
    return (wb @ mix.values) / wb.sum(-1, keepdim=True)


def infer_values(q: Tensor, mix: Mixture, n_iter: int) -> Tensor:
    """MAP values of the queried units by ``n_iter`` EM iterations (Eq. 13–15).

    q: (B, H, L, d) → v: (B, H, L, m). The first E-step uses the query alone; with β → 0
    (``mix.beta is None``) that step is exact and the rest are skipped.
    """
    v = value_m_step(responsibilities(q, mix), mix)
    for _ in range(n_iter - 1 if mix.beta is not None else 0):
        v = value_m_step(responsibilities(q, mix, v), mix)
    return v


class MixtureUnits(nn.Module):
    """Priors and precisions of a layer of mixture units, and their EM value inference.

    Args:
        options: the layer's :class:`GaussianMixtureOptions`.
        n_heads: number of heads H (each head is its own mixture).
        d_key: dimension d of queries and keys.
        d_value: dimension m of values.

    ``adaptation``, when set (see :func:`probtrans.attention.em_adaptation.adapting`), maps (q,
    mixture) to an adapted mixture before value inference: inference-time adaptation of a trained
    layer.
    """

    def __init__(self, options: GaussianMixtureOptions, n_heads: int, d_key: int, d_value: int):
        super().__init__()
        self.n_iter = options.n_iter
        self.prior = options.prior
        self.per_unit = options.precision == "unit"
        self.adaptation: Callable[[Tensor, Mixture], Mixture] | None = None
        alpha = options.alpha if options.alpha is not None else d_key**-0.5
        size = n_heads if options.precision in ("head", "unit") else 1
        learned = options.precision != "fixed"
        self._precision("log_alpha", math.log(alpha), size, learned)
        if options.beta is None:
            self.log_beta = None
        else:
            self._precision("log_beta", math.log(options.beta), size, learned)
        if self.per_unit:  # log α_j = log α_h + a_h·ξ_j, log β_j = log β_h + b_h·μ_j
            self.alpha_weight = nn.Parameter(torch.zeros(n_heads, d_key))
            self.beta_weight = nn.Parameter(torch.zeros(n_heads, d_value))
        if self.prior == "learned":  # log π_j = c_h·[ξ_j; μ_j] + const
            self.prior_weight = nn.Parameter(torch.zeros(n_heads, d_key + d_value))

    def _precision(self, name: str, log_value: float, size: int, learned: bool) -> None:
        value = torch.full((size,), log_value)
        if learned:
            self.register_parameter(name, nn.Parameter(value))
        else:
            self.register_buffer(name, value)

    def mixture(self, keys: Tensor, values: Tensor, mask: Tensor | None) -> Mixture:
        """Units with keys (*S, B, H, n, d), values (*S, B, H, n, m), mask (B, n) →
        :class:`Mixture`."""
        log_alpha = self.log_alpha.view(1, -1, 1)  # (1, H|1, 1)
        if self.per_unit:
            log_alpha = log_alpha + torch.einsum("...hnd,hd->...hn", keys, self.alpha_weight)
        alpha = log_alpha.exp()
        beta = None
        if self.log_beta is not None:
            log_beta = self.log_beta.view(1, -1, 1)
            if self.per_unit:
                log_beta = log_beta + torch.einsum("...hnm,hm->...hn", values, self.beta_weight)
            beta = log_beta.exp()
        if self.prior == "uniform":
            logits = keys.new_zeros(keys.shape[:-1])  # (*S, B, H, n)
        elif self.prior == "length":  # Eq. 16–17
            logits = 0.5 * alpha * keys.pow(2).sum(-1)
            if beta is not None:
                logits = logits + 0.5 * beta * values.pow(2).sum(-1)
        else:
            units = torch.cat([keys, values], dim=-1)
            logits = torch.einsum("...hnk,hk->...hn", units, self.prior_weight)
        log_prior = mask_units(logits.unsqueeze(-2), mask).log_softmax(-1)  # (*S, B, H, 1, n)
        return Mixture(keys, values, alpha, beta, log_prior, mask)

    def forward(self, q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None) -> Tensor:
        """q (B, H, L, d), keys (B, H, n, d), values (B, H, n, m) → MAP values (B, H, L, m),
        computed in float32 at least, with autocast off (see the module docstring)."""
        q, keys, values = full_precision(q), full_precision(keys), full_precision(values)
        with autocast_off(q):
            mix = self.mixture(keys, values, mask)
            if self.adaptation is not None:
                mix = self.adaptation(q, mix)
            return infer_values(q, mix, self.n_iter)


class GaussianMixtureAttention(MultiHeadAttention):
    """Multi-head self-attention whose heads are Gaussian mixtures of the tokens (units).

    Per head: queries q_i, keys ξ_j and expected values μ_j are the usual projections of the
    tokens; the output is the EM estimate of the values (Eq. 13–15). No sample site.

    ``GaussianMixtureAttention(d_model, n_heads, **options)``, options by name (defaults and
    bounds: :class:`~probtrans.specs.attention.GaussianMixtureOptions`): ``alpha`` (query
    precision α; unset: 1/√d_head), ``beta`` (value precision β; unset: β → 0), ``precision``
    (``"fixed"``, ``"shared"``, ``"head"``, ``"unit"``), ``prior`` (π: ``"length"``,
    ``"uniform"``, ``"learned"``), ``n_iter`` (EM iterations).
    """

    options_class = GaussianMixtureOptions

    def __init__(self, d_model: int, n_heads: int, **options: Any) -> None:
        super().__init__(d_model, n_heads, **options)
        self.units = MixtureUnits(self.options, n_heads, self.d_head, self.d_head)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> Tensor:
        if self.units.adaptation is not None and q.dim() > 4:
            raise ValueError(
                f"{type(self).__name__}: queries of shape {tuple(q.shape)}: inference-time "
                f"adaptation (probtrans.attention.em_adaptation) adapts one batch (B, H, L, d) "
                f"at a time, without sample dimensions on the left"
            )
        return self.units(q, k, v, key_mask)


register_attention(GaussianMixtureAttention)
