"""``knn``: ‖z(x) − z_(k)‖, the Euclidean distance from the L2-normalised input z(x) = x / ‖x‖ to
its k-th nearest L2-normalised training feature (Sun et al., ICML 2022, "Out-of-Distribution
Detection with Deep Nearest Neighbors", Sec. 3, whose confidence is its negative).

The search is exact (every training row), in float64, in chunks of query rows so that a chunk's
distance matrix stays below :data:`KNN_CHUNK_BYTES`; k is ``[predictive] knn_neighbours``,
capped at the training rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from probtrans.analysis.feature_scores.score import (
    FeatureScore,
    TrainingFeatures,
    register_feature_score,
)

#: the most bytes a chunk of the k-NN distance matrix (query rows × training rows) may take
KNN_CHUNK_BYTES = 256 * 2**20


def normalised(features: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (an all-zero row stays zero); (N, D) → (N, D)."""
    norms = np.linalg.norm(features, axis=1, keepdims=True)
    return features / np.maximum(norms, 1e-12)


@register_feature_score
@dataclass(frozen=True)
class KNearestNeighbour(FeatureScore):
    """``knn_train`` (N, D): the L2-normalised training features; ``k``: the k of k-NN."""

    name = "knn"
    label = "distance to k-th nearest neighbour"

    knn_train: np.ndarray
    k: int

    @classmethod
    def fit(cls, train: TrainingFeatures) -> KNearestNeighbour:
        return cls(normalised(train.x), min(train.knn_neighbours, len(train.x)))

    @property
    def dim(self) -> int:
        return self.knn_train.shape[1]

    def score(self, x: np.ndarray) -> np.ndarray:
        train = torch.from_numpy(self.knn_train)  # (N, D)
        queries = torch.from_numpy(normalised(x))  # (M, D)
        rows = max(1, KNN_CHUNK_BYTES // (train.element_size() * train.shape[0]))
        kth = [
            torch.kthvalue(torch.cdist(chunk, train), self.k, dim=1).values  # (rows,)
            for chunk in torch.split(queries, rows)
        ]
        return torch.cat(kth).numpy()

    def problems(self) -> list[str]:
        if self.knn_train.ndim != 2 or 0 in self.knn_train.shape:
            return [f"knn_train of shape {self.knn_train.shape}, not (rows, dimensions)"]
        if not 1 <= self.k <= len(self.knn_train):
            return [f"k = {self.k} for {len(self.knn_train)} training rows"]
        return super().problems()
