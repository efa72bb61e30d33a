"""Test-time adaptation (TTA) of a trained classifier to each unlabelled test batch, before
predicting it (``probtrans evaluate --adapt``, ``Run.predict(adapt=...)``).

The extension point, the context and the loop over a split are in :mod:`~probtrans.tta.method`;
each built-in method is a module of its own, registered on import: ``em``
(:mod:`~probtrans.tta.em`) and ``tent`` (:mod:`~probtrans.tta.tent`). A plugin adds one with an
:class:`AdaptationMethod` subclass, its options class and one :func:`register_adaptation` call.
"""

# isort: off
# the built-in methods, registered on import
from probtrans.tta import em, tent  # noqa: F401

# isort: on
from probtrans.tta.em import EmOptions
from probtrans.tta.method import (
    ADAPTATION_METHODS,
    Adaptation,
    AdaptationMethod,
    AdaptationOptions,
    adaptation_options,
    adapted_predictive,
    register_adaptation,
    test_time_adaptation,
)
from probtrans.tta.tent import TentOptions, predictive_mean_entropy

__all__ = [
    "ADAPTATION_METHODS",
    "Adaptation",
    "AdaptationMethod",
    "AdaptationOptions",
    "EmOptions",
    "TentOptions",
    "adaptation_options",
    "adapted_predictive",
    "predictive_mean_entropy",
    "register_adaptation",
    "test_time_adaptation",
]
