"""Standard SGPA: the input keys themselves are the inducing points, with amortised covariance.

Chen & Li (ICLR 2023), §3.2 Eq. (10). With queries = keys (W_q = W_k), the T keys
x_a of a sequence are the inducing inputs, and every sequence needs its own variational
parameters: the mean basis [v_a]_d = K_aa⁻¹ m_u and an input-dependent covariance S_d. Whitened,
as for the decoupled layer: L_K L_Kᵀ = K_aa + jitter·I, u_d = L_K ε_d and

    q(ε_d | x) = N(μ_d, diag σ_d²),   μ_d = L_K⁻¹ K_aa [v_a]_d,   σ_d = amortised scales,

so that m_d = L_K μ_d = K_aa [v_a]_d (plain kernel attention) and, since the queries are the
inducing inputs, Σ_d = S_d = L_K diag(σ_d²) L_Kᵀ. The KL divergence is per sequence,
½ Σ_{h,d,t} (σ² + μ² − 1 − log σ²). The T × T Cholesky per sequence and head makes the layer
O(B T³) in time and O(B T²) in memory: the inefficiency the decoupled form removes.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyro.distributions as dist
import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from probtrans.gp.kernels import gram
from probtrans.gp.linalg import decouple_padding, jittered_cholesky
from probtrans.runtime.precision import autocast_off, full_precision


@dataclass
class StandardPosterior:
    """Amortised q(ε | x) of one standard SGPA layer on a batch; F_d = L_K ε_d.

    Shapes: B sequences, H heads, T tokens, d output dims per head; *S sample dimensions of the
    inputs (those of vectorised plates), absent for a batch (B, …).
    """

    chol: Tensor  # L_K, (*S, B, H, T, T)
    loc: Tensor  # μ, (*S, B, H, d, T)
    scale: Tensor  # σ, (*S, B, H, d, T); 1 at padding tokens
    kl: Tensor  # KL(q(ε | x) ‖ N(0, I)) per sequence, (*S, B)

    def distribution(self) -> dist.Distribution:
        """q(ε | x) with batch shape (*S, B) and event shape (H, d, T)."""
        return dist.Normal(self.loc, self.scale).to_event(3)

    def output(self, eps: Tensor) -> Tensor:
        """F = L_K ε: eps (*E, B, H, d, T) → (*, B, H, d, T) (*E and *S broadcast), with
        autocast off."""
        with autocast_off(eps):
            return (self.chol @ eps.transpose(-1, -2)).transpose(-1, -2)

    def moments(self) -> tuple[Tensor, Tensor]:
        """Mean m_d = K_aa v_a (*S, B, H, d, T) and covariance Σ_d = S_d (*S, B, H, d, T, T)
        of F."""
        l_sigma = self.chol.unsqueeze(-3) * self.scale.unsqueeze(-2)  # L_K diag(σ_d)
        with autocast_off(l_sigma):
            return self.output(self.loc), l_sigma @ l_sigma.transpose(-1, -2)


def standard_posterior(
    kernel: Kernel,
    x_a: Tensor,
    v_a: Tensor,
    scale: Tensor,
    jitter: float,
    key_mask: Tensor | None = None,
) -> StandardPosterior:
    """x_a: keys = queries (*S, B, H, T, d_k); v_a: values (*S, B, H, T, d), zero at padding;
    scale: amortised σ (*S, B, H, T, d); key_mask: (B, T), True for real tokens. Computed with
    autocast off, in float32 (in float64 for float64 inputs)."""
    x_a, v_a, scale = full_precision(x_a), full_precision(v_a), full_precision(scale)
    with autocast_off(x_a):
        k_aa = decouple_padding(gram(kernel, x_a, x_a), key_mask)  # (*S, B, H, T, T)
        chol = jittered_cholesky(k_aa, jitter)
        loc = torch.linalg.solve_triangular(chol, k_aa @ v_a, upper=False).transpose(-1, -2)
        scale = scale.transpose(-1, -2)
        if key_mask is not None:
            scale = torch.where(key_mask[..., None, None, :], scale, torch.ones_like(scale))
        kl = 0.5 * (scale.pow(2) + loc.pow(2) - 1.0 - 2.0 * scale.log()).sum((-3, -2, -1))
    return StandardPosterior(chol=chol, loc=loc, scale=scale, kl=kl)
