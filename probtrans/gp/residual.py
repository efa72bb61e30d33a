"""The kernel of an SGPA layer split into an explicit low-rank part and a small remainder, so that
its O(T²) work runs in float32 without losing the decoupled conditional's accuracy.

Both kernels of :mod:`probtrans.gp.kernels` are, with scaled inputs x̃ = x / ℓ (per dimension),

    k(x, y) = σ_f² a(x) a(y) exp(x̃ · ỹ),     a ≡ 1 (exponential),  a(x) = exp(−|x̃|² / 2) (ARD-RBF).

The first two terms of exp(s) = 1 + s + e₂(s) give an explicit rank-(d + 1) kernel
Φ(x) Φ(y)ᵀ with features Φ(x) = σ_f a(x) [1, x̃], and a remainder

    R(x, y) = σ_f² a(x) a(y) e₂(x̃ · ỹ),      e₂(s) = exp(s) − 1 − s = s²/2 + s³/6 + …

so K_aa v = Φ_a (Φ_aᵀ v) + R_aa v. The decoupled layer needs (K_aa − AᵀA) v, a difference of two
nearly equal terms at the authors' length scales (:mod:`probtrans.gp.decoupled`); written as
Φ_a (Φ_aᵀ v) − Aᵀ (A v) + R_aa v, its cancelling part is of rank d + 1 + M and costs
O(T (d + M) d_v) in float64, and the only O(T²) part, R_aa v, is a product of small numbers:
float32 gives it to a relative error of about 10⁻⁷ of its own size, |R| ≤ |K|, so the error of
the result is at most that of the all-float32 computation and, where the cancellation is severe
(R small: s = x̃ · ỹ ≈ 10⁻³ at the IMDB scales, |R| ≈ 10⁻⁵ |K|), orders of magnitude below it
(see the error analysis in :mod:`probtrans.gp.decoupled`).

e₂ is evaluated as its Taylor series where |s| ≤ 1 (as many terms as the chunk's largest |s|
needs for 10⁻⁸ relative: three at the IMDB scales, at most ten) and as expm1(s) − s above; for
the ARD kernel, where exp(s) alone could overflow (s > 80), as exp(c + s) − exp(c) (1 + s),
c = log a(x) + log a(y), which never does (c + s ≤ 0). Elsewhere the amplitudes multiply the
values rather than the T × T matrix: R v = σ_f² a ⊙ (E (a ⊙ v)), E_ij = e₂(s_ij). The product
runs over the sequences and heads in chunks of T × T buffers, allocated once and reused, of the
device's ``residual_chunk`` elements (:mod:`probtrans.runtime.paths`: on a CPU 1 MiB of float32,
so that their elementwise passes stay in a core's cache), and recomputes E in its
backward pass instead of keeping it: what it keeps is O(T (d + d_v)) per sequence and head,
whatever T.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from gpytorch.kernels import Kernel, RBFKernel
from torch import Tensor

from probtrans.runtime.paths import paths_for

#: up to this |s|, e₂(s) is evaluated as its Taylor series (at most ten terms; a few passes over
#: the chunk in cache cost less than one expm1)
SERIES_BELOW = 1.0
#: above this s, exp(s) would overflow float32; the ARD kernel's remainder is then formed in
#: log space
LARGEST_EXPONENT = 80.0


#: scaled points: x̃ (..., H, N, d) and log a(x) (..., H, N) (:meth:`FactoredKernel.scaled`)
Points = tuple[Tensor, Tensor]


@dataclass(frozen=True)
class FactoredKernel:
    """A per-head kernel of :func:`~probtrans.gp.kernels.head_kernel` in the factored form of the
    module docstring, its hyperparameters read once in one dtype (so that the gradients of the
    float64 parts, which cancel, are summed in float64 before they reach the float32
    parameters)."""

    outputscale: Tensor  # σ_f², (H,)
    lengthscale: Tensor  # ℓ, (H, 1, d)
    rbf: bool  # ARD-RBF (a(x) = exp(−|x̃|²/2)), else exponential (a ≡ 1)

    @classmethod
    def of(cls, kernel: Kernel, dtype: torch.dtype) -> FactoredKernel:
        base = kernel.base_kernel
        rbf = isinstance(base, RBFKernel)
        return cls(kernel.outputscale.to(dtype), base.lengthscale.to(dtype), rbf)

    def scaled(self, x: Tensor) -> Points:
        """x (..., H, N, d) → x̃ = x / ℓ (..., H, N, d) and log a(x) (..., H, N) in the kernel's
        dtype (or x's, if wider), computed once for the methods below."""
        scaled = x / self.lengthscale  # promoted to the wider dtype in the same pass
        if self.rbf:
            return scaled, -0.5 * scaled.pow(2).sum(-1)
        return scaled, scaled.new_zeros(scaled.shape[:-1])

    def cross(self, p1: Points, p2: Points) -> Tensor:
        """k(x1, x2) (..., H, N, M) of scaled points x1 (N of them) and x2 (M)."""
        (s1, log_a1), (s2, log_a2) = p1, p2
        log_scale1 = log_a1 + self.outputscale.log()[:, None]  # log σ_f² a(x1), (..., H, N)
        exponent = s1 @ s2.transpose(-1, -2) + log_scale1[..., :, None] + log_a2[..., None, :]
        return exponent.exp()

    def gram(self, x: Tensor) -> Tensor:
        """k(x, x) (..., H, N, N) of points x (..., H, N, d), scaled once."""
        points = self.scaled(x)
        return self.cross(points, points)

    def diagonal(self, points: Points) -> Tensor:
        """k(x_i, x_i) (..., H, N): σ_f² for the ARD kernel, σ_f² exp(|x̃_i|²) for the
        exponential one."""
        scaled, log_a = points
        if self.rbf:
            return self.outputscale[:, None].expand(log_a.shape)
        return self.outputscale[:, None] * scaled.pow(2).sum(-1).exp()

    def linear_features(self, points: Points) -> Tensor:
        """Φ(x) = σ_f a(x) [1, x̃] (..., H, N, d + 1): the explicit part Φ(x) Φ(y)ᵀ."""
        scaled, log_a = points
        amplitude = self.outputscale[:, None].sqrt() * log_a.exp()  # (..., H, N)
        return torch.cat([amplitude[..., None], scaled * amplitude[..., None]], -1)

    def residual_product(self, x: Tensor, v: Tensor) -> Tensor:
        """R_xx v: x (..., H, T, d), v (..., H, T, d_v) → (..., H, T, d_v), the batch
        dimensions of x and v broadcast; O(T²) time in the dtype of x, O(T) memory kept for the
        backward pass (module docstring)."""
        scaled, log_a = self.scaled(x)
        batch = torch.broadcast_shapes(scaled.shape[:-2], v.shape[:-2])  # (..., H)
        scaled = scaled.expand(*batch, *scaled.shape[-2:]).reshape(-1, *scaled.shape[-2:])
        values = v.to(x.dtype).expand(*batch, *v.shape[-2:]).reshape(-1, *v.shape[-2:])
        if self.rbf:
            log_a = log_a.expand(*batch, log_a.shape[-1]).reshape(-1, log_a.shape[-1])
        product = _ResidualProduct.apply(scaled, log_a if self.rbf else None, values)
        product = product.view(*batch, *product.shape[1:])  # (..., H, T, d_v)
        return self.outputscale[:, None, None].to(product.dtype) * product


def _series_terms(largest: float) -> int:
    """How many terms n of e₂(s) / s² = Σ_{k<n} s^k / (k + 2)! + … keep the truncation below
    10⁻⁸ of the sum (≥ 0.36 for |s| ≤ 1), under float32's resolution, for |s| ≤ ``largest`` ≤
    :data:`SERIES_BELOW`."""
    terms = 1
    while largest**terms / math.factorial(terms + 2) > 0.25e-8:
        terms += 1
    return terms


def _series(s: Tensor, terms: int, out: Tensor) -> Tensor:
    """s² Σ_{k<n} s^k / (k + 2)! by Horner's rule (n = ``terms``), written into ``out``: each
    step c_k + out · s one fused pass (``addcmul``, one rounding: half the passes of a product
    then a sum, and no less accurate)."""
    out.fill_(1 / math.factorial(terms + 1))  # the term k = n − 1
    for k in range(terms - 2, -1, -1):  # 1/2! + s (1/3! + s (…))
        coefficient = s.new_tensor(1 / math.factorial(k + 2))
        torch.addcmul(coefficient, out, s, out=out)
    return out.mul_(s).mul_(s)


class _Workspace:
    """The two T × T buffers of a chunk, s and E, allocated once per product and reused by every
    chunk (fresh buffers per chunk cost more in page faults than the arithmetic)."""

    def __init__(self, scaled: Tensor, rows: int) -> None:
        length = scaled.shape[1]
        self.s = scaled.new_empty(rows, length, length)
        self.e = torch.empty_like(self.s)

    def products(self, x: Tensor) -> Tensor:
        """s = x̃ x̃ᵀ (n, T, T) of the chunk's scaled points x̃ (n, T, d)."""
        return torch.bmm(x, x.transpose(-1, -2), out=self.s[: len(x)])

    def remainder(self, s: Tensor, largest: float) -> Tensor:
        """e₂(s) = exp(s) − 1 − s elementwise, s (n, T, T) with |s| ≤ ``largest``, to float32's
        relative precision: the Taylor series with the terms ``largest`` needs where it is at
        most :data:`SERIES_BELOW`; above it, the series for |s| < 1 and expm1(s) − s elsewhere."""
        out = self.e[: len(s)]
        if largest <= SERIES_BELOW:
            return _series(s, _series_terms(largest), out)
        _series(s.clamp(-SERIES_BELOW, SERIES_BELOW), _series_terms(SERIES_BELOW), out)
        return torch.where(s.abs() < SERIES_BELOW, out, torch.expm1(s).sub_(s), out=out)


def _log_space_terms(s: Tensor, log_a: Tensor, slope: bool = False) -> Tensor:
    """a_i a_j e₂(s_ij), or with ``slope`` its derivative a_i a_j (exp(s_ij) − 1), for the ARD
    kernel where exp(s) alone could overflow (s > :data:`LARGEST_EXPONENT`): formed as
    exp(c + s) − exp(c) (1 + s), c = log a_i + log a_j, which never does (c + s ≤ 0); from
    log a itself, as a = exp(log a) underflows float32 where |x̃|² > 174."""
    log_w = log_a[:, :, None] + log_a[:, None, :]
    if slope:
        return (log_w + s).exp_() - log_w.exp()
    return (log_w + s).exp_() - log_w.exp() * (1 + s)


class _ResidualProduct(torch.autograd.Function):
    """(R / σ_f²) v over chunks of rows, R recomputed in the backward pass (module docstring).

    Inputs: x̃ (n, T, d), log a (n, T) or None (exponential kernel), v (n, T, d_v). Per chunk,
    s = x̃ x̃ᵀ and E = e₂(s); the amplitudes a_i a_j multiply the values instead of E,
    (R / σ_f²) v = a ⊙ (E (a ⊙ v)), so the T × T passes are those of e₂ alone (in log space,
    where exp(s) could overflow, E holds them). Backward adds the products with the output's
    gradient and with e₂'(s) = exp(s) − 1 = s + e₂(s)."""

    @staticmethod
    def forward(ctx: Any, scaled: Tensor, log_a: Tensor | None, v: Tensor) -> Tensor:
        amplitude = None if log_a is None else log_a.exp()
        weighted = _weighted(v, amplitude)  # a ⊙ v
        out = torch.empty_like(v)
        ctx.elements = paths_for(scaled.device).residual_chunk  # the backward's chunks too
        chunks = _chunks(scaled, ctx.elements)
        work = _Workspace(scaled, chunks[0][0].stop)
        for rows, largest in chunks:
            s = work.products(scaled[rows])
            if _in_log_space(amplitude, largest):
                out[rows] = _log_space_terms(s, log_a[rows]) @ v[rows]
            else:
                product = torch.bmm(work.remainder(s, largest), weighted[rows], out=out[rows])
                _weighted(product, _rows(amplitude, rows), inplace=True)
        ctx.save_for_backward(scaled, log_a, v, out)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        scaled, log_a, v, out = ctx.saved_tensors
        amplitude = None if log_a is None else log_a.exp()
        grad_x, grad_v = torch.empty_like(scaled), torch.empty_like(v)
        weighted_v, weighted_g = _weighted(v, amplitude), _weighted(grad_out, amplitude)
        chunks = _chunks(scaled, ctx.elements)
        work = _Workspace(scaled, chunks[0][0].stop)
        for rows, largest in chunks:
            x, s = scaled[rows], work.products(scaled[rows])
            if _in_log_space(amplitude, largest):  # E and its slope hold a_i a_j
                g, values = grad_out[rows], v[rows]
                grad_v[rows] = _log_space_terms(s, log_a[rows]).transpose(-1, -2) @ g  # Eᵀ g
                slope = _log_space_terms(s, log_a[rows], slope=True)
            else:
                g, values = weighted_g[rows], weighted_v[rows]
                e = work.remainder(s, largest)
                product = torch.bmm(e.transpose(-1, -2), g, out=grad_v[rows])  # Eᵀ (a ⊙ g)
                _weighted(product, _rows(amplitude, rows), inplace=True)
                slope = s.add_(e)  # e₂'(s) = s + e₂(s), overwriting s
            by_s = torch.bmm(g, values.transpose(-1, -2), out=work.e[: len(x)])  # ∂L/∂s, (n, T, T)
            by_s.mul_(slope)
            grad_x[rows] = by_s @ x + by_s.transpose(-1, -2) @ x
        grad_log_a = None
        if amplitude is not None and ctx.needs_input_grad[1]:
            # ∂L/∂log a_i = Σ_j (∂L/∂E_ij) E_ij + Σ_j (∂L/∂E_ji) E_ji = g_i·(E v)_i + v_i·(Eᵀ g)_i
            grad_log_a = (grad_out * out).sum(-1) + (v * grad_v).sum(-1)
        return grad_x, grad_log_a, grad_v


def _weighted(values: Tensor, amplitude: Tensor | None, inplace: bool = False) -> Tensor:
    """a_i values_i (values (n, T, k), a (n, T)); unchanged for the exponential kernel (a ≡ 1)."""
    if amplitude is None:
        return values
    return values.mul_(amplitude[..., None]) if inplace else values * amplitude[..., None]


def _rows(amplitude: Tensor | None, rows: slice) -> Tensor | None:
    """The chunk's amplitudes a (n, T), or None for the exponential kernel."""
    return None if amplitude is None else amplitude[rows]


def _in_log_space(amplitude: Tensor | None, largest: float) -> bool:
    """Whether a chunk's E is formed in log space: the ARD kernel where exp(s) could overflow."""
    return amplitude is not None and largest > LARGEST_EXPONENT


def _chunks(scaled: Tensor, elements: int) -> list[tuple[slice, float]]:
    """Row slices of x̃ (n, T, d) holding about ``elements`` T × T elements each (the device's
    ``residual_chunk``, :mod:`probtrans.runtime.paths`), with a bound on their
    |s_ij| = |x̃_i · x̃_j| ≤ max_i |x̃_i|² (Cauchy–Schwarz)."""
    n, length = scaled.shape[0], scaled.shape[1]
    step = max(1, elements // max(1, length * length))
    norms = scaled.detach().pow(2).sum(-1).amax(-1)  # (n,)
    starts = range(0, n, step)
    largest = [norms[i : i + step].max() for i in starts]
    return [
        (slice(i, min(i + step, n)), bound)
        for i, bound in zip(starts, torch.stack(largest).tolist(), strict=True)
    ]
