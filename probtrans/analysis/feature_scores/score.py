"""The feature-score extension point, and every registered score fitted on one run.

A :class:`FeatureScore` reads the representation the classifier head reads (the pooled
features, one row per example), not the output distribution: fitted once on the training
split's features (:class:`TrainingFeatures`), it scores new rows, higher = more
out-of-distribution, as every score of :data:`probtrans.analysis.metrics.UNCERTAINTY_SCORES`.
:func:`register_feature_score` adds a score class to :data:`FEATURE_SCORES` and to those
uncertainty scores, so every out-of-domain report, ``probtrans predict`` column and comparison
shows it. :func:`fit_feature_scores` fits every registered score (:class:`FittedScores`), which
a run keeps in its ``feature_scores.npz`` (:meth:`FittedScores.to_arrays`).

The algebra is in float64: normalised features are often close to one another, and float32
distances would lose digits to cancellation.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar, Self

import numpy as np
from sklearn.covariance import ledoit_wolf

from probtrans.analysis.metrics import Score, check_labels, register_score
from probtrans.errors import ProbtransError
from probtrans.registry import Registry

#: a score's arrays in ``feature_scores.npz`` are named ``{score}{SEPARATOR}{field}``
SEPARATOR = "."


def check_features(features: np.ndarray, name: str = "features") -> np.ndarray:
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


def shrunk_cholesky(centred: np.ndarray, what: str) -> np.ndarray:
    """The lower Cholesky factor L (D, D) of the Ledoit–Wolf covariance (Ledoit & Wolf, 2004)
    Σ̂ = (1 − α) S + α (tr S / D) I of centred rows (n, D), S = (1/n) Σ_i r_i r_iᵀ, with α
    chosen by :func:`sklearn.covariance.ledoit_wolf` (on rows centred by the caller)."""
    covariance, _ = ledoit_wolf(centred, assume_centered=True)
    try:
        return np.linalg.cholesky(covariance)
    except np.linalg.LinAlgError:
        raise ProbtransError(
            f"the {what} covariance of the features (shape {centred.shape}) is singular even "
            "after shrinkage: are the features constant?"
        ) from None


class TrainingFeatures:
    """The training split's pooled features x (N, D) and labels y (N,) in [0, n_classes),
    checked, with the statistics several scores share, each computed once when first read.

    With K the classes present (those with at least one row): ``classes`` (K,) ascending,
    ``counts`` (K,), ``means`` (K, D) μ_c, and ``shared_cholesky`` (D, D): L with L Lᵀ = Σ, the
    Ledoit–Wolf covariance of r_i = x_i − μ_{y_i} over all N rows (the within-class one)."""

    def __init__(
        self, features: np.ndarray, labels: np.ndarray, n_classes: int, knn_neighbours: int = 50
    ) -> None:
        self.x = check_features(features)
        n = len(self.x)
        if n < 2:
            raise ProbtransError(
                f"feature scores need at least 2 training rows, got shape {self.x.shape}"
            )
        if knn_neighbours < 1:
            raise ProbtransError(f"the k of k-NN must be at least 1, got {knn_neighbours}")
        try:
            self.y = check_labels(labels, n, n_classes, against="the features").astype(np.int64)
        except ValueError as err:
            raise ProbtransError(str(err)) from None
        self.n_classes = n_classes
        self.knn_neighbours = knn_neighbours
        self.classes, self.counts = np.unique(self.y, return_counts=True)  # (K,), (K,)

    @cached_property
    def means(self) -> np.ndarray:
        return np.stack([self.x[self.y == c].mean(axis=0) for c in self.classes])  # (K, D)

    @cached_property
    def shared_cholesky(self) -> np.ndarray:
        position = np.searchsorted(self.classes, self.y)  # (N,): each row's class in `means`
        return shrunk_cholesky(self.x - self.means[position], "shared within-class")


@dataclass(frozen=True)
class FeatureScore(ABC):
    """One feature-space score: its fitted state is the dataclass's fields (arrays, ints, lists
    of ints), which :meth:`to_arrays` and :meth:`from_arrays` keep without pickle."""

    #: its key in the out-of-domain reports and the predictions
    name: ClassVar[str]
    #: in words, for axis labels
    label: ClassVar[str]

    @classmethod
    @abstractmethod
    def fit(cls, train: TrainingFeatures) -> Self:
        """The score fitted on the training split's features."""

    @abstractmethod
    def score(self, x: np.ndarray) -> np.ndarray:
        """Scores (M,) float64 of checked features x (M, D) float64, higher = more OOD."""

    @property
    @abstractmethod
    def dim(self) -> int:
        """D, the feature dimension it was fitted on."""

    def problems(self) -> list[str]:
        """What no fit gives (read from a damaged or edited file): by default, float arrays
        holding NaN or infinite values. A score adds its shape checks."""
        return [
            f"{field} holds NaN or infinite values"
            for field, value in self.arrays().items()
            if value.dtype.kind == "f" and not np.isfinite(value).all()
        ]

    def notes(self) -> list[tuple[list[int], str]]:
        """(class ids, what about them) worth a note when the score is fitted."""
        return []

    def arrays(self) -> dict[str, np.ndarray]:
        """The fitted state as plain arrays, by field name."""
        return {
            field.name: np.asarray(getattr(self, field.name)) for field in dataclasses.fields(self)
        }

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], prefix: str) -> Self:
        """The inverse of :meth:`arrays`, each field read from ``prefix + name``."""
        fields = dataclasses.fields(cls)
        missing = [prefix + f.name for f in fields if prefix + f.name not in arrays]
        if missing:
            raise ProbtransError(f"feature scores: the saved arrays lack {', '.join(missing)}")
        values = {}
        for field in fields:
            value = np.asarray(arrays[prefix + field.name])
            if field.type == "int":
                values[field.name] = int(value)
            elif str(field.type).startswith("list"):
                values[field.name] = value.tolist()
            else:
                values[field.name] = value
        return cls(**values)


#: the feature-score classes by name, in the order of the reports
FEATURE_SCORES: Registry[type[FeatureScore]] = Registry("feature score")


def register_feature_score(score: type[FeatureScore]) -> type[FeatureScore]:
    """Add ``score`` to :data:`FEATURE_SCORES` and to the uncertainty scores every
    out-of-domain report and prediction shows (a plugin's one call; usable as a decorator)."""
    FEATURE_SCORES.register(score.name, score)
    register_score(Score(name=score.name, function=None, label=score.label, column=True))
    return score


@dataclass(frozen=True)
class FittedScores:
    """Every registered feature score, fitted on one training split of ``n_classes`` classes
    of which ``classes`` (K,) have rows; ``fitted``: name → score, in registry order."""

    n_classes: int
    classes: np.ndarray
    fitted: dict[str, FeatureScore]

    def __getitem__(self, name: str) -> FeatureScore:
        return self.fitted[name]

    @property
    def dim(self) -> int:
        """D, the feature dimension."""
        return next(iter(self.fitted.values())).dim

    @property
    def missing_classes(self) -> list[int]:
        """The class ids with no training row, left out of every score."""
        return sorted(set(range(self.n_classes)) - set(self.classes.tolist()))

    def scores(self, features: np.ndarray) -> dict[str, np.ndarray]:
        """Every score of features (M, D), each (M,) float64, higher = more out-of-distribution."""
        x = check_features(features)
        if x.shape[1] != self.dim:
            raise ProbtransError(
                f"features must have {self.dim} dimensions, as the features the scores were "
                f"fitted on, got shape {x.shape}"
            )
        return {name: score.score(x) for name, score in self.fitted.items()}

    def notes(self) -> list[tuple[list[int], str]]:
        """(class ids, what about them) worth a note: each score's, then the missing classes."""
        notes = [note for score in self.fitted.values() for note in score.notes()]
        if self.missing_classes:
            notes.append((self.missing_classes, "no training example: the scores leave them out"))
        return notes

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The fitted state as plain arrays (for ``np.savez``, loaded without pickle): the
        classes, then each score's arrays as ``{score}.{field}``."""
        arrays = {"n_classes": np.asarray(self.n_classes), "classes": self.classes}
        for name, score in self.fitted.items():
            arrays |= {f"{name}{SEPARATOR}{key}": v for key, v in score.arrays().items()}
        return arrays

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> FittedScores:
        """The inverse of :meth:`to_arrays` (``arrays`` may be an opened ``.npz`` file), for
        the registered scores the arrays hold (a file of probtrans 0.1, whose arrays have no
        score prefix, holds the four built-in ones); checked (:meth:`check`)."""
        for name in ("n_classes", "classes"):
            if name not in arrays:
                raise ProbtransError(f"feature scores: the saved arrays lack {name}")
        unprefixed = not any(SEPARATOR in key for key in arrays)
        saved = {key.split(SEPARATOR)[0] for key in arrays if SEPARATOR in key}
        fitted = {
            name: score.from_arrays(arrays, "" if unprefixed else name + SEPARATOR)
            for name, score in FEATURE_SCORES.items()
            if (unprefixed and score.__module__.startswith("probtrans.")) or name in saved
        }
        if not fitted:
            raise ProbtransError("feature scores: the saved arrays hold no registered score")
        scores = cls(int(arrays["n_classes"]), np.asarray(arrays["classes"]), fitted)
        scores.check()
        return scores

    def check(self) -> None:
        """Refuse a state that no fit gives: a score's own problems (shapes, k, values that are
        not finite), scores of different feature dimensions, class ids outside 0 … C − 1."""
        problems = [f"{name}: {p}" for name, s in self.fitted.items() for p in s.problems()]
        if problems:
            raise ProbtransError(f"feature scores: {'; '.join(problems)}")
        dims = {name: score.dim for name, score in self.fitted.items()}
        if len(set(dims.values())) > 1:
            listed = ", ".join(f"{name} {dim}" for name, dim in dims.items())
            raise ProbtransError(f"feature scores fitted on different feature widths: {listed}")
        classes = self.classes
        if classes.ndim != 1 or (
            classes.size and not 0 <= classes.min() <= classes.max() < self.n_classes
        ):
            raise ProbtransError(
                f"feature scores: class ids {classes.tolist()} for {self.n_classes} classes"
            )


def fit_feature_scores(
    features: np.ndarray, labels: np.ndarray, n_classes: int, k: int = 50
) -> FittedScores:
    """Every registered feature score fitted on training features (N, D) and labels (N,) in
    [0, n_classes); ``k``: the k of k-NN (capped at N)."""
    train = TrainingFeatures(features, labels, n_classes, k)
    fitted = {name: score.fit(train) for name, score in FEATURE_SCORES.items()}
    return FittedScores(n_classes, train.classes, fitted)
