"""Feature-space out-of-distribution scores, fitted on the training split's pooled features.

The extension point and the fitted set are in :mod:`~probtrans.analysis.feature_scores.score`; each
built-in score is a module of its own, registered on import: ``mahalanobis`` and
``relative_mahalanobis`` (:mod:`~probtrans.analysis.feature_scores.mahalanobis`),
``feature_density`` (:mod:`~probtrans.analysis.feature_scores.density`) and ``knn``
(:mod:`~probtrans.analysis.feature_scores.knn`). A plugin adds one with a :class:`FeatureScore`
subclass and one :func:`register_feature_score` call.
"""

# isort: off
# the built-in scores, registered on import in the order the reports show them
from probtrans.analysis.feature_scores import mahalanobis, density, knn  # noqa: F401

# isort: on
from probtrans.analysis.feature_scores.score import (
    FEATURE_SCORES,
    FeatureScore,
    FittedScores,
    TrainingFeatures,
    fit_feature_scores,
    register_feature_score,
)

__all__ = [
    "FEATURE_SCORES",
    "FeatureScore",
    "FittedScores",
    "TrainingFeatures",
    "fit_feature_scores",
    "register_feature_score",
]
