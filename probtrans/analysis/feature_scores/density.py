"""``feature_density``: −log q(x), with q(x) = Σ_c π_c N(x; μ_c, Σ_c) a Gaussian mixture of one
component per class, π_c = N_c / N and Σ_c the class's own covariance (DDU, Mukhoti et al.,
CVPR 2023, Sec. 4).

Σ_c is the Ledoit–Wolf covariance of the class's rows centred on μ_c. A class with N_c ≤ D or
N_c < 2 has too few rows for its own covariance and uses the shared within-class Σ instead
(noted when fitted); a class with no training row is left out of the mixture. The log density
is −½ [D log 2π + log|Σ_c| + MD_c(x)], log|Σ_c| = 2 Σ_d log (L_c)_dd, summed by log-sum-exp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from probtrans.analysis.feature_scores.mahalanobis import gaussian_problems, squared_mahalanobis
from probtrans.analysis.feature_scores.score import (
    FeatureScore,
    TrainingFeatures,
    register_feature_score,
    shrunk_cholesky,
)


@register_feature_score
@dataclass(frozen=True)
class ClassMixtureDensity(FeatureScore):
    """``means`` (K, D) μ_c, ``weights`` (K,) π_c, ``class_cholesky`` (K, D, D) L_c with
    L_c L_cᵀ = Σ_c, and ``shared_covariance_classes``: the class ids whose Σ_c is the shared Σ."""

    name = "feature_density"
    label = "−log feature density (GMM)"

    means: np.ndarray
    weights: np.ndarray
    class_cholesky: np.ndarray
    shared_covariance_classes: list[int]

    @classmethod
    def fit(cls, train: TrainingFeatures) -> ClassMixtureDensity:
        dim = train.x.shape[1]
        own = (train.counts > dim) & (train.counts >= 2)  # (K,): enough rows for their own Σ_c
        class_cholesky = np.stack(
            [
                shrunk_cholesky(train.x[train.y == c] - mean, f"class {c}")
                if has_own
                else train.shared_cholesky
                for c, mean, has_own in zip(train.classes, train.means, own, strict=True)
            ]
        )  # (K, D, D)
        weights = train.counts / len(train.x)
        return cls(train.means, weights, class_cholesky, train.classes[~own].tolist())

    @property
    def dim(self) -> int:
        return self.means.shape[1]

    def score(self, x: np.ndarray) -> np.ndarray:
        x_t, per_class = torch.from_numpy(x), torch.from_numpy(self.class_cholesky)
        class_md = torch.stack(
            [
                squared_mahalanobis(x_t, mean, chol)
                for mean, chol in zip(torch.from_numpy(self.means), per_class, strict=True)
            ],
            dim=1,
        )  # (M, K)
        log_det = 2 * torch.log(torch.diagonal(per_class, dim1=-2, dim2=-1)).sum(dim=-1)  # (K,)
        log_normal = -0.5 * (self.dim * math.log(2 * math.pi) + log_det + class_md)  # (M, K)
        log_density = torch.logsumexp(torch.log(torch.from_numpy(self.weights)) + log_normal, 1)
        return (-log_density).numpy()

    def problems(self) -> list[str]:
        shape = self.means.shape[:1]
        wrong = self.weights.shape != shape
        own = [f"weights of shape {self.weights.shape}, not {shape}"] * wrong
        return (
            gaussian_problems(self.means, class_cholesky=self.class_cholesky)
            + own
            + super().problems()
        )

    def notes(self) -> list[tuple[list[int], str]]:
        what = (
            "fewer training examples than feature dimensions for a covariance of their own: "
            "they use the shared one"
        )
        return [(self.shared_covariance_classes, what)] if self.shared_covariance_classes else []
