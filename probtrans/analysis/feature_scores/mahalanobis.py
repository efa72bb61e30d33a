"""Mahalanobis scores: class-conditional Gaussians N(μ_c, Σ) with one shared (tied) covariance.

* ``mahalanobis``: min_c MD_c(x), MD_c(x) = (x − μ_c)ᵀ Σ⁻¹ (x − μ_c) (Lee et al., NeurIPS 2018,
  Eq. 2, whose confidence is its negative; Podolskiy et al., AAAI 2021, for transformers).
* ``relative_mahalanobis``: min_c [MD_c(x) − MD_0(x)] = min_c MD_c(x) − MD_0(x), with MD_0 the
  distance under one class-agnostic Gaussian N(μ_0, Σ_0) fitted on all training features
  (Ren et al., 2021, "A Simple Fix to Mahalanobis Distance for Improving Near-OOD Detection",
  Eq. 4, whose confidence is its negative).

Σ is the Ledoit–Wolf covariance of the class-centred rows
(:attr:`~probtrans.analysis.feature_scores.score.TrainingFeatures.shared_cholesky`), Σ_0 that of
the rows centred on their mean μ_0. MD(x) = ‖L⁻¹(x − μ)‖² by a triangular solve with the Cholesky
factor Σ = L Lᵀ. A class with no training row has no Gaussian: the minimum runs over the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from probtrans.analysis.feature_scores.score import (
    FeatureScore,
    TrainingFeatures,
    register_feature_score,
    shrunk_cholesky,
)


def squared_mahalanobis(x: torch.Tensor, mean: torch.Tensor, chol: torch.Tensor) -> torch.Tensor:
    """MD(x) = (x − μ)ᵀ Σ⁻¹ (x − μ) = ‖L⁻¹(x − μ)‖² per row; x (M, D), μ (D,), L (D, D) → (M,)."""
    whitened = torch.linalg.solve_triangular(chol, (x - mean).T, upper=False)  # (D, M)
    return (whitened**2).sum(dim=0)


def gaussian_problems(means: np.ndarray, **cholesky: np.ndarray) -> list[str]:
    """Shape problems of class means (K, D) and Cholesky factors, each (D, D) or (K, D, D)."""
    if means.ndim != 2 or 0 in means.shape:
        return [f"means of shape {means.shape}, not (classes, dimensions)"]
    n_known, dim = means.shape
    return [
        f"{name} of shape {value.shape}, not {shape}"
        for name, value in cholesky.items()
        for shape in [(dim, dim) if value.ndim == 2 else (n_known, dim, dim)]
        if value.shape != shape
    ]


@register_feature_score
@dataclass(frozen=True)
class Mahalanobis(FeatureScore):
    """min_c MD_c(x) under the shared Σ; ``means`` (K, D) μ_c, ``shared_cholesky`` (D, D) L."""

    name = "mahalanobis"
    label = "Mahalanobis distance"

    means: np.ndarray
    shared_cholesky: np.ndarray

    @classmethod
    def fit(cls, train: TrainingFeatures) -> Mahalanobis:
        return cls(train.means, train.shared_cholesky)

    @property
    def dim(self) -> int:
        return self.means.shape[1]

    def score(self, x: np.ndarray) -> np.ndarray:
        x_t, chol = torch.from_numpy(x), torch.from_numpy(self.shared_cholesky)
        per_class = [squared_mahalanobis(x_t, mean, chol) for mean in torch.from_numpy(self.means)]
        return torch.stack(per_class, dim=1).min(dim=1).values.numpy()  # (M, K) → (M,)

    def problems(self) -> list[str]:
        return gaussian_problems(self.means, shared_cholesky=self.shared_cholesky) or (
            super().problems()
        )


@register_feature_score
@dataclass(frozen=True)
class RelativeMahalanobis(Mahalanobis):
    """min_c MD_c(x) − MD_0(x); ``background_mean`` (D,) μ_0, ``background_cholesky`` (D, D)
    L_0 with L_0 L_0ᵀ = Σ_0."""

    name = "relative_mahalanobis"
    label = "relative Mahalanobis distance"

    background_mean: np.ndarray
    background_cholesky: np.ndarray

    @classmethod
    def fit(cls, train: TrainingFeatures) -> RelativeMahalanobis:
        background_mean = train.x.mean(axis=0)
        background = shrunk_cholesky(train.x - background_mean, "class-agnostic")
        return cls(train.means, train.shared_cholesky, background_mean, background)

    def score(self, x: np.ndarray) -> np.ndarray:
        background = squared_mahalanobis(
            torch.from_numpy(x),
            torch.from_numpy(self.background_mean),
            torch.from_numpy(self.background_cholesky),
        )
        return super().score(x) - background.numpy()

    def problems(self) -> list[str]:
        problems = super().problems()  # the class means and the shared covariance first
        if problems:
            return problems
        shape = (self.dim,)
        if self.background_mean.shape != shape:
            problems.append(f"background_mean of shape {self.background_mean.shape}, not {shape}")
        if self.background_cholesky.shape != shape * 2:
            problems.append(
                f"background_cholesky of shape {self.background_cholesky.shape}, not {shape * 2}"
            )
        return problems
