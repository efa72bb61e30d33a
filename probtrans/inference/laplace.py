"""Last-layer Laplace approximation around a trained classifier's head (MacKay 1992; Daxberger
et al., NeurIPS 2021), a baseline of the SGPA paper (Chen & Li 2023, §5).

With pooled features φ(x) (the ``features`` site), φ̃ = [φ; 1] and the head θ = [W b] ∈ R^{C×(D+1)}
flattened row by row, the softmax likelihood's Hessian (equal to its generalised Gauss–Newton
matrix, the head being linear) summed over the training set is

    H = Σ_n (diag(p_n) − p_n p_nᵀ) ⊗ φ̃_n φ̃_nᵀ,          p_n = softmax(θ φ̃_n),

and the posterior over the head is N(θ_MAP, (H + λ I)⁻¹), full covariance. The prior precision λ
is the value of a log grid with the lowest validation NLL (Daxberger et al. §3: "marginal
likelihood or validation"; we use validation as the issue asks). Predictive draws combine a
head draw with one posterior-predictive draw of the features (attention noise included).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from probtrans.analysis import metrics

#: prior precisions tried on validation
PRIOR_PRECISIONS = tuple(10.0**k for k in np.arange(-4.0, 4.5, 0.5))


def _augment(features: Tensor) -> Tensor:
    """φ (…, D) → φ̃ = [φ; 1] (…, D+1)."""
    return torch.cat([features, torch.ones_like(features[..., :1])], dim=-1)


def head_matrix(weight: Tensor, bias: Tensor, device: torch.device | str) -> Tensor:
    """θ = [W b] (C, D+1) from the head's ``weight`` (C, D) and ``bias`` (C,), detached, in
    float64 on ``device``."""
    return torch.cat([weight, bias[:, None]], dim=1).detach().to(device, torch.float64)


def hessian(features: Tensor, head: Tensor) -> Tensor:
    """H = Σ_n (diag(p_n) − p_n p_nᵀ) ⊗ φ̃_n φ̃_nᵀ; features (N, D), head (C, D+1) → (C(D+1))²."""
    phi = _augment(features.double())
    probs = torch.softmax(phi @ head.double().T, dim=-1)  # (N, C)
    curvature = torch.diag_embed(probs) - probs[:, :, None] * probs[:, None, :]  # (N, C, C)
    classes, width = head.shape
    blocks = phi.new_empty(classes, width, classes, width)
    for a in range(
        classes
    ):  # block (a, b) = Σ_n curvature_nab φ̃_n φ̃_nᵀ, without an N·C²·D² temporary
        for b in range(classes):
            blocks[a, :, b, :] = (phi * curvature[:, a, b, None]).T @ phi
    return blocks.reshape(head.numel(), head.numel())


def hessian_diagonal(features: Tensor, head: Tensor) -> Tensor:
    """The diagonal of :func:`hessian`, shaped as the head: H_(c, j)(c, j) = Σ_n p_nc (1 − p_nc)
    φ̃_nj²; features (N, D), head (C, D+1) → (C, D+1), without the (C(D+1))² matrix."""
    phi = _augment(features.double())
    probs = torch.softmax(phi @ head.double().T, dim=-1)  # (N, C)
    return (probs * (1 - probs)).T @ phi.square()


@dataclass
class LastLayerLaplace:
    """N(θ_MAP, (H + λ I)⁻¹) over the head θ = [W b] (C, D+1)."""

    head: Tensor  # θ_MAP, (C, D+1)
    hessian: Tensor  # H, (C(D+1), C(D+1))
    prior_precision: float = 1.0

    @classmethod
    def fit(cls, features: Tensor, weight: Tensor, bias: Tensor) -> LastLayerLaplace:
        """From training features (N, D) and the MAP head ``weight`` (C, D), ``bias`` (C,) (on
        any device: the approximation lives on the device of the features)."""
        head = head_matrix(weight, bias, features.device)
        return cls(head, hessian(features, head))

    def sample_heads(self, samples: int, generator: torch.Generator) -> Tensor:
        """θ_s = θ_MAP + L⁻ᵀ ε_s with L Lᵀ = H + λI; → (S, C, D+1). ε is drawn by
        ``generator`` on its own device, so a seed gives the same heads on every device."""
        eye = torch.eye(len(self.hessian), dtype=self.hessian.dtype, device=self.hessian.device)
        precision = self.hessian + self.prior_precision * eye
        chol = torch.linalg.cholesky(precision)
        shape = (len(precision), samples)
        eps = torch.randn(shape, generator=generator, dtype=torch.float64, device=generator.device)
        eps = eps.to(chol.device)
        offsets = torch.linalg.solve_triangular(chol.T, eps, upper=True)  # (P, S)
        return self.head + offsets.T.reshape(samples, *self.head.shape)

    def predictive(self, features: Tensor, seed: int = 0) -> np.ndarray:
        """Class probabilities (S, N, C) for posterior draws of the features (S, N, D), one
        head draw per feature draw."""
        heads = self.sample_heads(len(features), torch.Generator().manual_seed(seed))
        logits = _augment(features.to(heads.device, torch.float64)) @ heads.transpose(-1, -2)
        return torch.softmax(logits, dim=-1).float().cpu().numpy()  # (S, N, C)

    def fit_prior_precision(
        self,
        val_features: Tensor,
        val_labels: np.ndarray,
        grid: tuple[float, ...] = PRIOR_PRECISIONS,
    ) -> float:
        """Set λ to the grid value with the lowest validation NLL (same head noise for every λ)."""
        scores = {}
        for precision in grid:
            self.prior_precision = precision
            probs = self.predictive(val_features)
            scores[precision] = metrics.nll(metrics.predictive_mean(probs), val_labels)
        self.prior_precision = min(scores, key=scores.get)
        return self.prior_precision
