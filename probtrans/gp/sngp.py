"""The two pieces of SNGP (Liu et al., "Simple and Principled Uncertainty Estimation with
Deterministic Deep Learning via Distance Awareness", NeurIPS 2020), a baseline of the SGPA paper
(Chen & Li 2023, §5):

- a spectral-norm bound on the encoder's hidden maps, so that distances between inputs survive
  in the features (Liu et al. §3.2, eq. 7): W ↦ W · min(1, c / σ̂(W)), σ̂ the largest singular
  value estimated by power iteration (Miyato et al., ICLR 2018, Algorithm 1);
- a Gaussian-process output layer with an RBF kernel, approximated by M random Fourier features
  (Rahimi & Recht, NeurIPS 2007; Liu et al. eq. 8): φ(h) = √(2/M) cos(Ω h / ℓ + b), Ω ~ N(0, I),
  b ~ U(0, 2π), fixed, so that φ(h)ᵀφ(h') ≈ exp(−‖h − h'‖² / 2ℓ²). The logits are φ(h)ᵀβ with
  β ~ N(0, I).

SNGP's posterior over β is the Laplace approximation N(β_MAP, (Σ_n Φᵀ diag(p(1−p)) Φ + I)⁻¹)
(Liu et al. eq. 9); here it is :class:`probtrans.inference.laplace.LastLayerLaplace` over the
random-feature layer with the prior precision of the model's prior
(``[predictive] laplace_prior_precision``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from probtrans.runtime.precision import autocast_off, full_precision


class SpectralNormBound(nn.Module):
    """Parametrisation W ↦ W · min(1, c / σ̂(W)) of a (out, in) weight; the power iteration
    advances by ``iterations`` steps on every forward pass in training mode."""

    def __init__(self, weight: Tensor, bound: float, iterations: int = 1) -> None:
        super().__init__()
        self.bound, self.iterations = bound, iterations
        out_features, in_features = weight.shape
        like = {"dtype": weight.dtype, "device": weight.device}
        self.register_buffer("u", nn.functional.normalize(torch.randn(out_features, **like), dim=0))
        self.register_buffer("v", nn.functional.normalize(torch.randn(in_features, **like), dim=0))
        self.power_iteration(weight, steps=20)  # start from a converged estimate

    @torch.no_grad()
    def power_iteration(self, weight: Tensor, steps: int) -> None:
        """u, v ← the leading left and right singular vectors of ``weight``, ``steps`` closer."""
        for _ in range(steps):
            self.v = nn.functional.normalize(weight.T @ self.u, dim=0)
            self.u = nn.functional.normalize(weight @ self.v, dim=0)

    def forward(self, weight: Tensor) -> Tensor:
        """The bounded weight; in an autocast region too, u, v and σ̂ stay in the weight's
        dtype (autocast off)."""
        with autocast_off(weight):
            if self.training:
                self.power_iteration(weight, self.iterations)
            sigma = self.u @ weight @ self.v  # σ̂(W), differentiable in W (Miyato et al. eq. 13)
            return weight * torch.clamp(self.bound / sigma, max=1.0)


def spectral_normalise(module: nn.Module, bound: float, iterations: int = 1) -> nn.Module:
    """Bound the spectral norm of every ``nn.Linear`` weight inside ``module`` by ``bound``."""
    for layer in list(module.modules()):
        if isinstance(layer, nn.Linear):
            parametrize.register_parametrization(
                layer, "weight", SpectralNormBound(layer.weight.detach(), bound, iterations)
            )
    return module


class RandomFeatures(nn.Module):
    """φ(h) = √(2/M) cos(Ω h / ℓ + b): (…, D) → (…, M), with Ω (M, D), b (M,) and ℓ fixed
    buffers (ℓ is kept in the checkpoint: a backbone's is measured on its features,
    :func:`~probtrans.gp.kernels.median_distance`)."""

    def __init__(self, d_in: int, n_features: int, lengthscale: float) -> None:
        super().__init__()
        self.register_buffer("omega", torch.randn(n_features, d_in))
        self.register_buffer("phase", 2 * math.pi * torch.rand(n_features))
        self.register_buffer("lengthscale", torch.tensor(float(lengthscale)))
        self.register_load_state_dict_pre_hook(_lengthscale_of_older_checkpoints)

    def forward(self, h: Tensor) -> Tensor:
        """φ(h), in float32 at least, with autocast off: the phases Ω h / ℓ + b, several times
        2π, would lose their fractional part to bfloat16."""
        h = full_precision(h)
        with autocast_off(h):
            projection = h @ self.omega.T / self.lengthscale.to(h.dtype) + self.phase
            return math.sqrt(2.0 / len(self.phase)) * torch.cos(projection)


def _lengthscale_of_older_checkpoints(
    module: nn.Module, state: dict, prefix: str, *_: object
) -> None:
    """A checkpoint written before ℓ was a buffer keeps the ℓ the module was built with."""
    state.setdefault(prefix + "lengthscale", module.lengthscale.detach().clone())
