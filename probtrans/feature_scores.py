"""Feature-space out-of-distribution scores, fitted on the training split's pooled features.

The scores read the representation the classifier head reads (the pooled features, one row
per example), not the output distribution. :func:`fit_feature_scores` fits them once on the
training features X (N, D) and labels y (N,), and :meth:`FeatureDensity.scores` gives four
per-example scores for new features, all oriented like
:data:`probtrans.metrics.UNCERTAINTY_SCORES`: higher = more uncertain / more out-of-distribution.

* ``mahalanobis``: class-conditional Gaussians N(μ_c, Σ) with one shared (tied) covariance,
  the score min_c MD_c(x) with MD_c(x) = (x − μ_c)ᵀ Σ⁻¹ (x − μ_c) (Lee et al., NeurIPS 2018,
  Eq. 2, whose confidence is its negative; Podolskiy et al., AAAI 2021, for transformers).
* ``relative_mahalanobis``: min_c [MD_c(x) − MD_0(x)] = min_c MD_c(x) − MD_0(x), with MD_0 the
  distance under one class-agnostic Gaussian N(μ_0, Σ_0) fitted on all training features
  (Ren et al., 2021, "A Simple Fix to Mahalanobis Distance for Improving Near-OOD Detection",
  Eq. 4, whose confidence is its negative).
* ``feature_density``: −log q(x) with q(x) = Σ_c π_c N(x; μ_c, Σ_c) a Gaussian mixture of one
  component per class, π_c = N_c / N and Σ_c the class's own covariance (DDU, Mukhoti et al.,
  CVPR 2023, Sec. 4).
* ``knn``: ‖z(x) − z_(k)‖, the Euclidean distance from the L2-normalised input z(x) = x / ‖x‖
  to its k-th nearest L2-normalised training feature (Sun et al., ICML 2022, "Out-of-Distribution
  Detection with Deep Nearest Neighbors", Sec. 3, whose confidence is its negative).

Covariances. Every covariance is the Ledoit–Wolf shrunk estimate (Ledoit & Wolf, 2004)
Σ̂ = (1 − α) S + α (tr S / D) I of a sample covariance S = (1/n) Σ_i r_i r_iᵀ over centred rows
r_i, with α chosen by :func:`sklearn.covariance.ledoit_wolf` (called with assume_centered=True
on rows we centre ourselves):

* the shared Σ: r_i = x_i − μ_{y_i} over all N rows (the within-class covariance);
* the background Σ_0: r_i = x_i − μ_0 over all N rows, μ_0 the mean of all rows;
* the class Σ_c: r_i = x_i − μ_c over the N_c rows of class c. A class with N_c ≤ D or N_c < 2
  has too few rows for its own covariance and uses the shared Σ instead; such classes are
  listed in :attr:`FeatureDensity.shared_covariance_classes` so the caller can print a note.

A class with no training row at all has no Gaussian: it is left out of every score (the
minimum over classes and the mixture run over the classes present) and listed in
:attr:`FeatureDensity.missing_classes`.

The covariance algebra is in float64 with Cholesky factors Σ = L Lᵀ: MD(x) = ‖L⁻¹(x − μ)‖²
by a triangular solve, log|Σ| = 2 Σ_d log L_dd, and the mixture's log density by log-sum-exp.
The k-NN search is exact (every training row), in float64 too: normalised features are often
close to one another, and float32 distances ‖a‖² + ‖b‖² − 2 aᵀb would lose digits to
cancellation. It runs in chunks of query rows so that a chunk's distance matrix stays below
:data:`KNN_CHUNK_BYTES`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.covariance import ledoit_wolf

from probtrans.errors import ProbtransError
from probtrans.metrics import check_labels

#: the scores of :meth:`FeatureDensity.scores`, in the order they are reported
FEATURE_SCORES = ("mahalanobis", "relative_mahalanobis", "feature_density", "knn")

#: the most bytes a chunk of the k-NN distance matrix (query rows × training rows) may take
KNN_CHUNK_BYTES = 256 * 2**20


# ----------------------------------------------------------------------------- input checks
def _check_features(features: np.ndarray, name: str = "features") -> np.ndarray:
    """features (N, D) as float64; refuses another rank, an empty array or non-finite values."""
    features = np.asarray(features)
    if features.ndim != 2 or 0 in features.shape:
        raise ProbtransError(
            f"{name} must be 2-D and non-empty (examples N, feature dimensions D), "
            f"got shape {features.shape}"
        )
    features = features.astype(np.float64)
    if not np.isfinite(features).all():
        bad = int((~np.isfinite(features)).any(axis=1).sum())
        raise ProbtransError(
            f"{name} of shape {features.shape} has non-finite values (NaN or inf) in {bad} rows"
        )
    return features


# ----------------------------------------------------------------------------- Gaussian algebra
def _shrunk_cholesky(centred: np.ndarray, what: str) -> np.ndarray:
    """The lower Cholesky factor L (D, D) of the Ledoit–Wolf covariance of centred rows (n, D)."""
    covariance, _ = ledoit_wolf(centred, assume_centered=True)
    try:
        return np.linalg.cholesky(covariance)
    except np.linalg.LinAlgError:
        raise ProbtransError(
            f"the {what} covariance of the features (shape {centred.shape}) is singular even "
            "after shrinkage: are the features constant?"
        ) from None


def _squared_mahalanobis(x: torch.Tensor, mean: torch.Tensor, chol: torch.Tensor) -> torch.Tensor:
    """MD(x) = (x − μ)ᵀ Σ⁻¹ (x − μ) = ‖L⁻¹(x − μ)‖² per row; x (M, D), μ (D,), L (D, D) → (M,)."""
    whitened = torch.linalg.solve_triangular(chol, (x - mean).T, upper=False)  # (D, M)
    return (whitened**2).sum(dim=0)


def _normalised(features: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (an all-zero row stays zero); (N, D) → (N, D)."""
    norms = np.linalg.norm(features, axis=1, keepdims=True)
    return features / np.maximum(norms, 1e-12)


# ----------------------------------------------------------------------------- fitted state
@dataclass(frozen=True)
class FeatureDensity:
    """Everything the feature scores need, fitted by :func:`fit_feature_scores`.

    With K the number of classes present in the training split (those with at least one row):

    * ``n_classes``: C, the classes of the model;
    * ``classes`` (K,): the class ids present, ascending;
    * ``means`` (K, D): μ_c; ``weights`` (K,): π_c = N_c / N;
    * ``shared_cholesky`` (D, D): L with L Lᵀ = Σ, the shared within-class covariance;
    * ``class_cholesky`` (K, D, D): L_c with L_c L_cᵀ = Σ_c (Σ for the classes that fell back);
    * ``background_mean`` (D,) and ``background_cholesky`` (D, D): μ_0 and L_0 L_0ᵀ = Σ_0;
    * ``shared_covariance_classes``: the class ids whose Σ_c is the shared Σ;
    * ``knn_train`` (N, D): the L2-normalised training features; ``k``: the k of k-NN.
    """

    n_classes: int
    classes: np.ndarray
    means: np.ndarray
    weights: np.ndarray
    shared_cholesky: np.ndarray
    class_cholesky: np.ndarray
    background_mean: np.ndarray
    background_cholesky: np.ndarray
    shared_covariance_classes: list[int]
    knn_train: np.ndarray
    k: int

    @property
    def dim(self) -> int:
        """D, the feature dimension."""
        return self.means.shape[1]

    @property
    def missing_classes(self) -> list[int]:
        """The class ids with no training row, left out of every score."""
        return sorted(set(range(self.n_classes)) - set(self.classes.tolist()))

    def scores(self, features: np.ndarray) -> dict[str, np.ndarray]:
        """The four scores of :data:`FEATURE_SCORES` for features (M, D), each (M,) float64,
        higher = more out-of-distribution."""
        x = _check_features(features)
        if x.shape[1] != self.dim:
            raise ProbtransError(
                f"features must have {self.dim} dimensions, as the features the scores were "
                f"fitted on, got shape {x.shape}"
            )
        x_t = torch.from_numpy(x)
        means = torch.from_numpy(self.means)
        shared = torch.from_numpy(self.shared_cholesky)
        per_class = torch.from_numpy(self.class_cholesky)

        # MD_c(x) under the shared Σ and under Σ_c: (M, K) each
        shared_md = torch.stack([_squared_mahalanobis(x_t, mean, shared) for mean in means], dim=1)
        class_md = torch.stack(
            [
                _squared_mahalanobis(x_t, mean, chol)
                for mean, chol in zip(means, per_class, strict=True)
            ],
            dim=1,
        )
        background_md = _squared_mahalanobis(
            x_t, torch.from_numpy(self.background_mean), torch.from_numpy(self.background_cholesky)
        )  # (M,)

        # log N(x; μ_c, Σ_c) = −½ [D log 2π + log|Σ_c| + MD_c(x)], log|Σ_c| = 2 Σ_d log (L_c)_dd
        log_det = 2 * torch.log(torch.diagonal(per_class, dim1=-2, dim2=-1)).sum(dim=-1)  # (K,)
        log_normal = -0.5 * (self.dim * math.log(2 * math.pi) + log_det + class_md)  # (M, K)
        log_density = torch.logsumexp(torch.log(torch.from_numpy(self.weights)) + log_normal, 1)

        mahalanobis = shared_md.min(dim=1).values
        return {
            "mahalanobis": mahalanobis.numpy(),
            "relative_mahalanobis": (mahalanobis - background_md).numpy(),
            "feature_density": (-log_density).numpy(),
            "knn": self._knn_distance(x),
        }

    def _knn_distance(self, x: np.ndarray) -> np.ndarray:
        """‖z(x) − z_(k)‖ for x (M, D) → (M,) float64, exact, in chunks of query rows."""
        train = torch.from_numpy(self.knn_train)  # (N, D)
        queries = torch.from_numpy(_normalised(x))  # (M, D)
        rows = max(1, KNN_CHUNK_BYTES // (train.element_size() * train.shape[0]))
        kth = [
            torch.kthvalue(torch.cdist(chunk, train), self.k, dim=1).values  # (rows,)
            for chunk in torch.split(queries, rows)
        ]
        return torch.cat(kth).numpy()

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The fitted state as plain arrays (for ``np.savez``, loaded without pickle)."""
        return {
            "n_classes": np.asarray(self.n_classes),
            "classes": self.classes,
            "means": self.means,
            "weights": self.weights,
            "shared_cholesky": self.shared_cholesky,
            "class_cholesky": self.class_cholesky,
            "background_mean": self.background_mean,
            "background_cholesky": self.background_cholesky,
            "shared_covariance_classes": np.asarray(self.shared_covariance_classes, np.int64),
            "knn_train": self.knn_train,
            "k": np.asarray(self.k),
        }

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> FeatureDensity:
        """The inverse of :meth:`to_arrays`; ``arrays`` may be an opened ``.npz`` file."""
        missing = [name for name in cls.__dataclass_fields__ if name not in arrays]
        if missing:
            raise ProbtransError(f"feature scores: the saved arrays lack {', '.join(missing)}")
        density = cls(
            n_classes=int(arrays["n_classes"]),
            classes=np.asarray(arrays["classes"]),
            means=np.asarray(arrays["means"]),
            weights=np.asarray(arrays["weights"]),
            shared_cholesky=np.asarray(arrays["shared_cholesky"]),
            class_cholesky=np.asarray(arrays["class_cholesky"]),
            background_mean=np.asarray(arrays["background_mean"]),
            background_cholesky=np.asarray(arrays["background_cholesky"]),
            shared_covariance_classes=np.asarray(arrays["shared_covariance_classes"]).tolist(),
            knn_train=np.asarray(arrays["knn_train"]),
            k=int(arrays["k"]),
        )
        density.check()
        return density

    def check(self) -> None:
        """Refuse a state that no fit gives (read from a damaged or edited file): shapes that
        disagree with K classes of D dimensions and N training rows, a k of k-NN outside
        1 … N, class ids outside 0 … C − 1, or values that are not finite."""
        n_known, dim = self.means.shape if self.means.ndim == 2 else (-1, -1)
        rows = len(self.knn_train) if self.knn_train.ndim == 2 else -1
        expected = {
            "classes": (n_known,),
            "weights": (n_known,),
            "shared_cholesky": (dim, dim),
            "class_cholesky": (n_known, dim, dim),
            "background_mean": (dim,),
            "background_cholesky": (dim, dim),
            "knn_train": (rows, dim),
        }
        problems = [
            f"{name} of shape {getattr(self, name).shape}, not {shape}"
            for name, shape in expected.items()
            if getattr(self, name).shape != shape
        ]
        if dim < 1 or n_known < 1:
            problems.insert(0, f"means of shape {self.means.shape}, not (classes, dimensions)")
        if problems:
            raise ProbtransError(f"feature scores: {'; '.join(problems)}")
        if not 1 <= self.k <= rows:
            raise ProbtransError(f"feature scores: k = {self.k} for {rows} training rows")
        if self.classes.size and not 0 <= self.classes.min() <= self.classes.max() < self.n_classes:
            raise ProbtransError(
                f"feature scores: class ids {self.classes.tolist()} for {self.n_classes} classes"
            )
        for name in expected.keys() | {"means"}:
            if not np.isfinite(getattr(self, name)).all():
                raise ProbtransError(f"feature scores: {name} holds NaN or infinite values")


def fit_feature_scores(
    features: np.ndarray, labels: np.ndarray, n_classes: int, k: int = 50
) -> FeatureDensity:
    """Fit the feature scores on training features (N, D) and labels (N,) in [0, n_classes);
    the k of k-NN is min(k, N)."""
    x = _check_features(features)
    n, dim = x.shape
    if n < 2:
        raise ProbtransError(f"feature scores need at least 2 training rows, got shape {x.shape}")
    if k < 1:
        raise ProbtransError(f"the k of k-NN must be at least 1, got {k}")
    try:
        y = check_labels(labels, n, n_classes, against="the features").astype(np.int64)
    except ValueError as err:
        raise ProbtransError(str(err)) from None

    classes, counts = np.unique(y, return_counts=True)  # (K,), (K,)
    means = np.stack([x[y == c].mean(axis=0) for c in classes])  # (K, D)
    position = np.searchsorted(classes, y)  # (N,): the row of each example's class in `means`
    shared = _shrunk_cholesky(x - means[position], "shared within-class")

    background_mean = x.mean(axis=0)
    background = _shrunk_cholesky(x - background_mean, "class-agnostic")

    own = (counts > dim) & (counts >= 2)  # (K,): classes with enough rows for their own Σ_c
    class_cholesky = np.stack(
        [
            _shrunk_cholesky(x[y == c] - mean, f"class {c}") if has_own else shared
            for c, mean, has_own in zip(classes, means, own, strict=True)
        ]
    )  # (K, D, D)

    return FeatureDensity(
        n_classes=n_classes,
        classes=classes,
        means=means,
        weights=counts / n,
        shared_cholesky=shared,
        class_cholesky=class_cholesky,
        background_mean=background_mean,
        background_cholesky=background,
        shared_covariance_classes=classes[~own].tolist(),
        knn_train=_normalised(x),
        k=min(k, n),
    )
