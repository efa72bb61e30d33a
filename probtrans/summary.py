"""The metrics of one posterior predictive: one row of a run's ``metrics.json`` or of a
comparison table.

In-domain metrics are computed on the test split, detection metrics on test vs out-of-domain.
When the out-of-domain split has labels of the same classes (CR sentiment for an IMDB model,
CoLA out-of-domain sentences), its accuracy and MCC are reported too (``ood_accuracy``,
``ood_mcc``), as the H-STO paper does. ``ts_*`` are the same metrics after temperature scaling
fitted on the validation split (:mod:`probtrans.calibration`).
"""

from __future__ import annotations

import numpy as np

from probtrans import calibration, metrics

SPLITS = ("val", "test", "ood")


def has_class_labels(labels: np.ndarray, n_classes: int) -> bool:
    return len(labels) > 0 and int(labels.min()) >= 0 and int(labels.max()) < n_classes


def summarise(probs: dict[str, np.ndarray], labels: dict[str, np.ndarray]) -> dict[str, float]:
    """probs: split → (S, N, C) for ``val``, ``test`` and ``ood``; labels: split → (N,)."""
    n_classes = probs["test"].shape[-1]
    scores = metrics.classification_metrics(probs["test"], labels["test"])
    if len(labels["ood"]):  # a data set may have no out-of-domain examples
        scores.update(metrics.ood_metrics(probs["test"], probs["ood"]))
    ood_labelled = has_class_labels(labels["ood"], n_classes)
    if ood_labelled:
        mean_ood = metrics.predictive_mean(probs["ood"])
        scores["ood_accuracy"] = metrics.accuracy(mean_ood, labels["ood"])
        scores["ood_mcc"] = metrics.mcc(mean_ood, labels["ood"])
    temperature = calibration.fit_temperature(probs["val"], labels["val"])
    scores["temperature"] = temperature
    tempered = calibration.temperature_scaled(probs["test"], temperature)
    for key, value in metrics.classification_metrics(tempered, labels["test"]).items():
        if key in ("nll", "brier", "ece", "mce"):
            scores[f"ts_{key}"] = value
    return scores
