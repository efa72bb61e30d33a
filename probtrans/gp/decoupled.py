"""Decoupled sparse variational GP with amortised mean keys: the heart of decoupled SGPA.

Chen & Li (ICLR 2023), §3.3 Eq. (11). Per layer and head, with amortised keys
x_a = q (T of them, from the input sequence; queries are the same points, W_q = W_k), amortised
values v_a (T × d_v), and M_g global keys x_g shared by all inputs:

    m_d = K_aa [v_a]_d − K_ag K_gg⁻¹ K_ga [v_a]_d + K_ag [v_g]_d
    Σ_d = K_aa + K_ag K_gg⁻¹ (S_g^d − K_gg) K_gg⁻¹ K_ga

Whitened parameterisation (as in the authors' code): L_K L_Kᵀ = K_gg + jitter·I, global inducing
values u_g = L_K ε with prior ε ~ N(0, I) and, per output dimension d, q(ε_d) = N(μ_d, L_d L_dᵀ),
i.e. v_g = L_K⁻ᵀ μ_d and S_g^d = L_K L_d L_dᵀ L_Kᵀ. With A = L_K⁻¹ K_ga (M_g × T) the layer
output given ε is the Gaussian

    F_d | ε_d ~ N(m_a,d + Aᵀ ε_d,  K_aa − AᵀA),      m_a,d = (K_aa − AᵀA) [v_a]_d,

and integrating ε_d out gives back m_d = m_a,d + Aᵀ μ_d and Σ_d = K_aa − AᵀA + Aᵀ L_d L_dᵀ A.
The amortised part shapes the mean only. The KL divergence splits into the global part
Σ_{h,d} KL(q(ε_d) ‖ N(0, I)) (the Pyro site of ε carries it) and the amortised part
½ Σ_{h,d} [v_a]_dᵀ (K_aa − K_ag K_gg⁻¹ K_ga) [v_a]_d = ½ Σ_{h,d} [v_a]_dᵀ m_a,d, one per input
sequence (:attr:`DecoupledConditional.amortised_kl`).

Cost per layer: O(B T² d + B T M_g (d + M_g) + M_g³) time, the T × T part in float32 and in
chunks of bounded memory ("Precision" below), the float64 parts, and the mean and variance of
F given ε drawn from them, on pieces of whole sequences of bounded size (the device's
``residual_chunk``, :mod:`probtrans.runtime.paths`: on a CPU, float64 intermediates of the whole
batch, 32 MiB at B = 128, T = 256, 8 heads of 16 dimensions, were mapped and page-faulted in
afresh by every operation that wrote them, in the forward and the backward pass), against
O(B T³) for standard SGPA (:mod:`probtrans.gp.standard`).

Precision. K_aa − AᵀA is a difference of two nearly equal matrices whenever the M_g global points
explain the amortised keys well, as they do for the exponential kernel at the authors' length
scales (≈ 55: the kernel is then close to rank d + 1, and K_gg nearly singular). In float32 the
whitened projection A = L_K⁻¹ K_ga carries an error set by K_gg's condition number, the same for
every batch, so training can find the directions where the computed K_aa − AᵀA is negative: on
IMDB (M_g = 50, T ≤ 512) the second layer's amortised KL went to −0.35 nats per review, with the
values v_a inflated until the amortised mean was rounding noise. K_aa in float32 is not enough
either: at the IMDB kernel (σ_f² = 0.0183) the rounding of its entries (≈ 1e-9) is as large as
the entries of K_aa − AᵀA (conditional variances 3e-9 to 2e-7 on layer-normalised inputs), so
with K_aa and K_aa v_a in float32 and the rest in float64 the amortised mean (K_aa − AᵀA) v_a
was 50 % off and the conditional variances up to 40 %.

:func:`decoupled_conditional` avoids the cancellation instead of computing it in float64. With
the kernel written as an explicit rank-(d + 1) part Φ Φᵀ plus a small remainder R
(:mod:`probtrans.gp.residual`: k = σ_f² a(x) a(y) exp(x̃ · ỹ), Φ(x) = σ_f a(x) [1, x̃],
R = σ_f² a(x) a(y) (exp(s) − 1 − s)),

    (K_aa − AᵀA) v_a = [Φ_a (Φ_aᵀ v_a) − Aᵀ (A v_a)] + R_aa v_a,

the bracket holds all of the cancellation and is of rank d + 1 + M: it runs in float64 at
O(T (d + M) d_v) cost, with K_ga, K_gg, its Cholesky factor and A (O(T M d + M³)); the only
O(T²) part, R_aa v_a, is a sum of small terms without cancellation, computed in float32 (in
chunks, recomputed in the backward pass). Its float32 error is about 10⁻⁷ of |R_aa| |v_a|, and
|R| ≤ |K|: never worse than the all-float32 computation, and where the cancellation is severe
(the IMDB scales: s = x̃ · ỹ ≈ 10⁻³, |R| ≈ 10⁻⁵ |K|) about 10⁵ times better, which is what the
residual needs. Measured on the IMDB layer (σ_f² = 0.0183, ℓ = 54.6, M_g = 50, T = 512,
layer-normalised inputs) against the float64 computation: amortised mean 1.4 × 10⁻⁷ relative,
conditional variances and amortised KL to float32 rounding, and the gradients with respect to
the inputs and the hyperparameters within 7 × 10⁻⁷ of those of a float64 layer
(``tests/test_sgpa.py``). The conditional variances diag(K_aa) − Σ_m A_mt² need no T × T
work and stay in float64. The results come back in the layer's precision, float32 at least;
under mixed precision (a bfloat16 autocast region) autocast is off for all of this (the layer
computes its keys and values in float32 too). :func:`decoupled_conditional_reference` keeps
the earlier all-float64 computation, T × T matrices included, as the tests' reference; the
full sampler (``sampling = "full"``) and :meth:`DecoupledConditional.moments` form K_aa − AᵀA
in float64 (their O(T³) Cholesky dominates anyway).

GPyTorch's ``OrthogonallyDecoupledVariationalStrategy`` keeps its mean inducing points fixed and
shared, so the amortised (input-dependent) mean keys need this small strategy of our own; the
global part follows GPyTorch's whitened ``VariationalStrategy`` conventions (the tests check the
KL against it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import pyro.distributions as dist
import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from probtrans.gp.kernels import gram
from probtrans.gp.linalg import decouple_padding, jittered_cholesky
from probtrans.gp.residual import FactoredKernel, Points
from probtrans.runtime.paths import SgpaConditional, paths_for
from probtrans.runtime.precision import autocast_off

Sampling = Literal["marginal", "full"]


@dataclass
class DecoupledConditional:
    """p(F | ε) of one decoupled SGPA layer on a batch, for every head h and output dim d.

    Shapes: B sequences, H heads, T tokens, d output dims per head, M global inducing points;
    *S sample dimensions of the inputs (those of vectorised plates), absent for a batch (B, …).
    The float64 parts are kept as the pieces of whole sequences they were computed on
    (:func:`decoupled_conditional`): with ``batch`` = (*S, B), pieces (n, H, …) whose n add up to
    the product of (*S, B), in order; with ``batch`` None, one piece of the whole shape. The
    methods work piece by piece where they can, so that no float64 tensor of the whole batch is
    formed (see "Cost per layer" in the module docstring); the properties join the pieces.
    """

    amortised_means: tuple[Tensor, ...]  # m_a = (K_aa − AᵀA) v_a, (n, H, d, T) each, float64
    crosses: tuple[Tensor, ...]  # A = L_K⁻¹ K_ga, (n, H, M, T) each, float64
    k_aa_diagonals: tuple[Tensor, ...]  # diag K_aa, (n, H, T) each, float64
    batch: torch.Size | None  # (*S, B) of the pieces' n; None: one piece of the whole shape
    prior_covariance: Callable[[], Tensor]  # K_aa, (*S, B, H, T, T), float64, on demand
    amortised_kl: Tensor  # ½ Σ_{h,d} v_aᵀ (K_aa − K_ag K_gg⁻¹ K_ga) v_a, (*S, B), in ``dtype``
    key_mask: Tensor | None  # (B, T), True for real tokens
    jitter: float
    dtype: torch.dtype  # of the layer's inputs (float32 at least) and of every method's result
    prior_mean: Tensor | None = None  # m(x_a), the prior mean function, (*S, B, H, d, T); None: 0

    @property
    def amortised_mean(self) -> Tensor:
        """m_a (*S, B, H, d, T), float64."""
        return self._joined(self.amortised_means)

    @property
    def cross(self) -> Tensor:
        """A (*S, B, H, M, T), float64."""
        return self._joined(self.crosses)

    @property
    def k_aa_diagonal(self) -> Tensor:
        """diag K_aa (*S, B, H, T), float64."""
        return self._joined(self.k_aa_diagonals)

    def _joined(self, pieces: tuple[Tensor, ...]) -> Tensor:
        """Pieces (n, *rest) as one tensor (*S, B, *rest)."""
        if self.batch is None:
            return pieces[0]
        return torch.cat(pieces).view(*self.batch, *pieces[0].shape[1:])

    def mean(self, eps: Tensor) -> Tensor:
        """E[F | ε] = m(x_a) + m_a + Aᵀ ε: eps (*E, H, d, M) → (*, H, d, T), the batch
        dimensions *E of eps and (*S, B) of the inputs broadcast right-aligned: eps (H, d, M) →
        (*S, B, H, d, T); eps (S, 1, H, d, M), one draw per sample of a vectorised plate →
        (S, B, H, d, T). A GP with a prior mean function m is m plus a zero-mean GP: m shifts
        the mean and leaves the covariances and the KL divergences as they are."""
        eps = eps.to(torch.float64)
        if eps.dim() > 3:  # batch dimensions of its own: on the joined pieces
            mean = (self.amortised_mean + eps @ self.cross).to(self.dtype)  # (*, H, d, T)
        else:
            pieces = zip(self.amortised_means, self.crosses, strict=True)
            mean = self._joined(tuple((m + eps @ a).to(self.dtype) for m, a in pieces))
        return mean if self.prior_mean is None else mean + self.prior_mean

    def variance(self) -> Tensor:
        """diag(K_aa − AᵀA): the per-token variance of F given ε, shared by all d, (*S, B, H, T)."""
        pieces = zip(self.k_aa_diagonals, self.crosses, strict=True)
        return self._joined(
            tuple((k - a.pow(2).sum(-2)).clamp_min(self.jitter).to(self.dtype) for k, a in pieces)
        )

    def covariance(self) -> Tensor:
        """K_aa − AᵀA: the covariance over tokens of F given ε, shared by all d,
        (*S, B, H, T, T)."""
        return self._covariance64().to(self.dtype)

    def _covariance64(self) -> Tensor:  # O(T²) in float64: the full sampler and the moments
        return self.prior_covariance() - self.cross.transpose(-1, -2) @ self.cross

    def distribution(self, eps: Tensor, sampling: Sampling = "marginal") -> dist.Distribution:
        """p(F | ε) as a distribution with event shape (H, d, T) and batch shape the broadcast
        of eps's and the inputs' batch dimensions (see :meth:`mean`): (*S, B) for eps (H, d, M).

        ``marginal`` (the authors' choice): tokens independent given ε, each with its exact
        conditional variance. ``full``: the joint Gaussian over tokens (a T × T Cholesky per
        sequence and head, O(B T³)). Both have the same mean and per-token variance given ε, and
        hence the same marginal mean m_d and variance diag Σ_d once ε ~ q(ε) is integrated out;
        ``full`` also has the exact cross-token covariance Σ_d.
        """
        loc = self.mean(eps)  # (*, H, d, T)
        if sampling == "marginal":
            scale = self.variance().sqrt().unsqueeze(-2).expand_as(loc)
            return dist.Normal(loc, scale).to_event(3)
        covariance = decouple_padding(self._covariance64(), self.key_mask)
        scale_tril = jittered_cholesky(covariance, self.jitter).to(self.dtype).unsqueeze(-3)
        return dist.MultivariateNormal(loc, scale_tril=scale_tril).to_event(2)

    def moments(self, loc: Tensor, scale_tril: Tensor) -> tuple[Tensor, Tensor]:
        """Mean m_d (*S, B, H, d, T) and covariance Σ_d (*S, B, H, d, T, T) of F once the
        whitened inducing values are integrated out under q(ε_d) = N(loc_d, L_d L_dᵀ).

        loc: (H, d, M); scale_tril: (H, d, M, M).
        """
        cross = self.cross.to(self.dtype)
        with autocast_off(cross):
            a_l = torch.einsum("...hmt,hdmn->...hdtn", cross, scale_tril)  # Aᵀ L_d, (…, T, M)
            covariance = self.covariance().unsqueeze(-3)  # (*S, B, H, 1, T, T)
            return self.mean(loc), covariance + a_l @ a_l.transpose(-1, -2)


def decoupled_conditional(
    kernel: Kernel,
    x_a: Tensor,
    x_g: Tensor,
    v_a: Tensor,
    jitter: float,
    key_mask: Tensor | None = None,
) -> DecoupledConditional:
    """Kernel matrices and whitened projections of one decoupled SGPA layer.

    kernel: per-head kernel (batch shape (H,)) of :func:`~probtrans.gp.kernels.head_kernel`;
    x_a: amortised keys = queries (*S, B, H, T, d_k); x_g: global keys (H, M, d_k); v_a:
    amortised values (*S, B, H, T, d), zero at padding tokens; key_mask: (B, T), True for real
    tokens. K_gg gets ``jitter`` on its diagonal, ten times more after every failed Cholesky
    (:func:`~probtrans.gp.linalg.jittered_cholesky`). The O(T²) product R_aa v_a runs in the
    dtype of ``x_a`` (float32 at least), everything else in float64, with autocast off (see
    "Precision" in the module docstring); ``amortised_kl`` and the methods' results come back in
    the dtype of ``x_a``, or in float32 if that is narrower (a bfloat16 autocast region's).
    :func:`decoupled_conditional_reference` computes the same in float64 throughout.
    """
    dtype = torch.promote_types(x_a.dtype, torch.float32)
    with autocast_off(x_a):
        # contiguous once, so that the batched products below reshape without copying
        x_a, v_a = x_a.contiguous(), v_a.contiguous()  # (*S, B, H, T, ·)
        k64, fast = FactoredKernel.of(kernel, torch.float64), FactoredKernel.of(kernel, dtype)
        inducing = k64.scaled(x_g)  # in float64
        chol_gg = jittered_cholesky(k64.cross(inducing, inducing), jitter)  # L_K, (H, M, M)
        pieces = _sequences(x_a, v_a)
        if pieces is None:  # batch dimensions broadcast between x_a and v_a, or none
            batch = None
            parts = [(t,) for t in _factored_part(k64, fast, inducing, chol_gg, x_a, v_a)]
        else:
            batch = x_a.shape[:-3]  # (*S, B)
            parts = zip(
                *(_factored_part(k64, fast, inducing, chol_gg, *p) for p in pieces), strict=True
            )
        residual_vs, crosses, diagonals, kls = parts
        amortised_kl = kls[0] if batch is None else torch.cat(kls).view(batch)
    return DecoupledConditional(
        amortised_means=tuple(r.transpose(-1, -2) for r in residual_vs),
        crosses=tuple(crosses),
        k_aa_diagonals=tuple(diagonals),
        batch=batch,
        prior_covariance=lambda: k64.gram(x_a),
        amortised_kl=amortised_kl.to(dtype),
        key_mask=key_mask,
        jitter=jitter,
        dtype=dtype,
    )


def _sequences(x_a: Tensor, v_a: Tensor) -> list[tuple[Tensor, Tensor]] | None:
    """x_a and v_a (*S, B, H, T, ·) as pieces (n, H, T, ·) of whole sequences, each holding
    about the device's ``residual_chunk`` float64 elements per (n, H, T, d) intermediate (on a
    CPU 2 MiB: an allocation of that size is reused from the heap, while one of 32 MiB or more
    is mapped afresh and page-faulted in by every operation that writes it); None where the
    batch dimensions of x_a and v_a differ (broadcast) or there are none."""
    if x_a.dim() < 4 or x_a.shape[:-1] != v_a.shape[:-1]:
        return None
    x, v = x_a.flatten(0, -4), v_a.flatten(0, -4)  # (N, H, T, ·), views of contiguous tensors
    per_sequence = x.shape[1] * x.shape[2] * max(x.shape[3] + 1, v.shape[3])
    step = max(1, paths_for(x.device).residual_chunk // per_sequence)
    return list(zip(x.split(step), v.split(step), strict=True))


def _factored_part(
    k64: FactoredKernel,
    fast: FactoredKernel,
    inducing: Points,
    chol_gg: Tensor,
    x_a: Tensor,
    v_a: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(K_aa − AᵀA) v_a (…, H, T, d), A (…, H, M, T), diag K_aa (…, H, T) and the amortised
    KL (…) of amortised keys x_a and values v_a (…, H, T, ·): the body of
    :func:`decoupled_conditional` on some of its sequences."""
    amortised = k64.scaled(x_a)  # in float64
    v_a64 = v_a.double()
    k_ga = k64.cross(inducing, amortised)  # (…, H, M, T)
    cross = torch.linalg.solve_triangular(chol_gg, k_ga, upper=False)  # A, (…, H, M, T)
    features = k64.linear_features(amortised)  # Φ_a, (…, H, T, d_k + 1)
    explicit = features @ (features.transpose(-1, -2) @ v_a64)  # Φ_a Φ_aᵀ v_a
    remainder = fast.residual_product(x_a.to(fast.outputscale.dtype), v_a)  # R_aa v_a, O(T²)
    residual_v = explicit.add_(remainder).sub_(cross.transpose(-1, -2) @ (cross @ v_a64))
    amortised_kl = 0.5 * (v_a64 * residual_v).sum((-3, -2, -1))  # (…,)
    return residual_v, cross, k64.diagonal(amortised), amortised_kl


def decoupled_conditional_reference(
    kernel: Kernel,
    x_a: Tensor,
    x_g: Tensor,
    v_a: Tensor,
    jitter: float,
    key_mask: Tensor | None = None,
) -> DecoupledConditional:
    """:func:`decoupled_conditional` with every matrix in float64, K_aa included (O(T²)
    float64 work and memory): the reference the fast path is tested against, and the
    ``"float64"`` path of :mod:`probtrans.runtime.paths` (on a GPU with fast float64 it can be
    the faster one)."""
    dtype = torch.promote_types(x_a.dtype, torch.float32)
    x_a, x_g, v_a = x_a.double(), x_g.double(), v_a.double()
    with autocast_off(x_a):
        k_aa = gram(kernel, x_a, x_a)  # (*S, B, H, T, T)
        k_ga = gram(kernel, x_g, x_a)  # (*S, B, H, M, T)
        chol_gg = jittered_cholesky(gram(kernel, x_g, x_g), jitter)  # L_K, (H, M, M)
        cross = torch.linalg.solve_triangular(chol_gg, k_ga, upper=False)  # A, (*S, B, H, M, T)
        residual_v = k_aa @ v_a - cross.transpose(-1, -2) @ (cross @ v_a)  # (K_aa − AᵀA) v_a
        amortised_kl = 0.5 * (v_a * residual_v).sum((-3, -2, -1))  # (*S, B)
    return DecoupledConditional(
        amortised_means=(residual_v.transpose(-1, -2),),
        crosses=(cross,),
        k_aa_diagonals=(k_aa.diagonal(dim1=-2, dim2=-1),),
        batch=None,
        prior_covariance=lambda: k_aa,
        amortised_kl=amortised_kl.to(dtype),
        key_mask=key_mask,
        jitter=jitter,
        dtype=dtype,
    )


#: the decoupled conditional of each ``sgpa_conditional`` path (:mod:`probtrans.runtime.paths`)
CONDITIONALS: dict[SgpaConditional, Callable[..., DecoupledConditional]] = {
    "factored": decoupled_conditional,
    "float64": decoupled_conditional_reference,
}
