"""The metrics of one posterior predictive: one row of a run's ``metrics.json`` or of a
comparison table.

In-domain metrics are computed on the test split. Each named out-of-domain set (split
``ood:NAME``) gets ``metrics["ood"][NAME]``: its size ``n`` and, for every uncertainty score of
:data:`probtrans.metrics.UNCERTAINTY_SCORES` (higher = more uncertain), how well it separates the
set from the in-domain test split — ``metrics["ood"][NAME][SCORE]`` holds ``auroc``, ``aupr``
(out-of-domain positive) and ``fpr95`` (in-domain positive, at 95 % in-domain recall), see
:func:`probtrans.metrics.ood_detection`. A set whose rows all carry classes of the task (CR
sentiment for an IMDB model, CoLA's out-of-domain sentences, corrupted digits) also gets its
``accuracy``, ``mcc``, ``nll`` and ``ece``, as the H-STO paper reports for CR and CoLA. ``ts_*``
are the in-domain metrics after temperature scaling fitted on the validation split
(:mod:`probtrans.calibration`).
"""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np

from probtrans import calibration, metrics

#: the in-domain splits a run is evaluated on; each out-of-domain set NAME is the split ood:NAME
SPLITS = ("val", "test")
OOD_PREFIX = "ood:"
#: the metrics of a labelled out-of-domain set
SHIFTED_METRICS = ("accuracy", "mcc", "nll", "ece")
T = TypeVar("T")


def ood_split(name: str) -> str:
    """The split name of the out-of-domain set ``name``."""
    return OOD_PREFIX + name


def is_ood_split(split: str) -> bool:
    return split.startswith(OOD_PREFIX)


def ood_sets(by_split: dict[str, T]) -> dict[str, T]:
    """The out-of-domain sets among ``by_split`` (split → value), by set name."""
    return {s.removeprefix(OOD_PREFIX): v for s, v in by_split.items() if is_ood_split(s)}


def has_class_labels(labels: np.ndarray, n_classes: int) -> bool:
    return len(labels) > 0 and int(labels.min()) >= 0 and int(labels.max()) < n_classes


def summarise(
    probs: dict[str, np.ndarray],
    labels: dict[str, np.ndarray],
    energy: dict[str, np.ndarray] | None = None,
) -> dict[str, Any]:
    """probs: split → (S, N, C) for ``val``, ``test`` and every ``ood:NAME``; labels: split →
    (N,); energy: split → (N,) free energies where the predictive has logits (adds the
    ``energy`` score)."""
    n_classes = probs["test"].shape[-1]
    scores: dict[str, Any] = metrics.classification_metrics(probs["test"], labels["test"])
    temperature = calibration.fit_temperature(probs["val"], labels["val"])
    scores["temperature"] = temperature
    tempered = calibration.temperature_scaled(probs["test"], temperature)
    for key, value in metrics.classification_metrics(tempered, labels["test"]).items():
        if key in ("nll", "brier", "ece", "mce"):
            scores[f"ts_{key}"] = value
    energy = energy or {}
    scores["ood"] = {}
    for name, probs_out in ood_sets(probs).items():
        split = ood_split(name)
        report: dict[str, Any] = {"n": int(probs_out.shape[1])}
        if report["n"]:
            report.update(
                metrics.ood_report(probs["test"], probs_out, energy.get("test"), energy.get(split))
            )
        if has_class_labels(labels[split], n_classes):
            mean = metrics.predictive_mean(probs_out)
            for key in SHIFTED_METRICS:
                report[key] = getattr(metrics, key)(mean, labels[split])
        scores["ood"][name] = report
    return scores
