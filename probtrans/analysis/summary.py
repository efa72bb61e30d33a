"""The metrics of one posterior predictive: one row of a run's ``metrics.json`` or of a
comparison table.

In-domain metrics, every :class:`probtrans.analysis.metrics.Metric` of
:data:`probtrans.analysis.metrics.METRICS` in its order, are computed on the test split. Each named
out-of-domain set (split ``ood:NAME``) gets ``metrics["ood"][NAME]``: its size ``n`` and, for
every uncertainty score of :data:`probtrans.analysis.metrics.UNCERTAINTY_SCORES` (higher = more
uncertain), how well it separates the set from the in-domain test split —
``metrics["ood"][NAME][SCORE]`` holds ``auroc``, ``aupr`` (out-of-domain positive) and ``fpr95``
(in-domain positive, at 95 % in-domain recall), see
:func:`probtrans.analysis.metrics.ood_detection`. A set whose rows all carry classes of the task
(CR sentiment for an IMDB model, CoLA's out-of-domain sentences, corrupted digits) also gets the
metrics marked ``shifted`` (``accuracy``, ``mcc``, ``nll`` and ``ece``), as the H-STO paper reports
for CR and CoLA. ``ts_*`` are the metrics marked ``temperature_scaled`` after temperature scaling
fitted on the validation split (:mod:`probtrans.analysis.calibration`). A metric without a value
(``cov_at_5_risk`` when no coverage has a selective risk ≤ 5 %) is ``None``, ``null`` in
``metrics.json``.

``metrics["torch_uncertainty"]`` repeats the metrics under the names torch-uncertainty's
``ClassificationRoutine`` logs (its ``results.csv`` columns), so that runs of both can be put
side by side. Each metric's ``torch_uncertainty`` field gives its name there, prefixed with
``test/`` for the in-domain metrics, ``test/post/`` for the temperature-scaled ones (a
post-processing there) and ``shift/NAME/`` for a labelled out-of-domain set NAME, grouped as
:data:`TORCH_UNCERTAINTY_GROUPS`; :data:`TORCH_UNCERTAINTY_OOD` gives ``ood/NAME/AUROC`` and
``ood/NAME/AUPR`` of every set, with the score ``msp`` (their default ``ood_criterion``; both
with out-of-domain positive, as ours):

============  =================  ======================  ====================
ours          torch-uncertainty  ours                    torch-uncertainty
============  =================  ======================  ====================
``accuracy``  ``cls/Acc``        ``aurc``                ``sc/AURC``
``nll``       ``cls/NLL``        ``augrc``               ``sc/AUGRC``
``brier``     ``cls/Brier``      ``cov_at_5_risk``       ``sc/Cov@5Risk``
``entropy``   ``cls/Entropy``    ``risk_at_80_cov``      ``sc/Risk@80Cov``
``ece``       ``cal/ECE``        ``mutual_information``  ``ens_MI``
``aece``      ``cal/aECE``       ``disagreement``        ``ens_Disagreement``
============  =================  ======================  ====================

The values are ours (:mod:`probtrans.analysis.metrics`): the definitions are theirs, but AURC is
the mean selective risk over the N coverages where torch-uncertainty integrates by trapezoids from
coverage 1/N and divides by 1 - 1/N, and AUGRC is the trapezoidal area from coverage 0 where
torch-uncertainty starts at 1/N and divides by 1 - 1/N: the two differ by O(1/N). ``fpr95`` has
no alias: ours takes the in-domain inputs as positive (the share of out-of-domain inputs accepted
at 95 % in-domain recall), torch-uncertainty's ``FPR95`` the out-of-domain ones. ``mcc``,
``mce``, ``ece_all_classes`` and ``std_true_class`` have no torch-uncertainty counterpart.
"""

from __future__ import annotations

import math
import re
from typing import Any, TypeVar

import numpy as np

from probtrans.analysis import calibration, elpd, metrics
from probtrans.analysis.results import TEMPERATURE_SCALED

#: the in-domain splits a run is evaluated on; each out-of-domain set NAME is the split ood:NAME
SPLITS = ("val", "test")
OOD_PREFIX = "ood:"
#: the order of ``metrics["torch_uncertainty"]``: by torch-uncertainty's metric group
#: (classification, calibration, selective classification, ensemble), in each the order of METRICS
TORCH_UNCERTAINTY_GROUPS = ("cls", "cal", "sc", "ens")
#: out-of-domain detection: our measure → torch-uncertainty's, of the score ``OOD_SCORE``
TORCH_UNCERTAINTY_OOD = {"auroc": "AUROC", "aupr": "AUPR"}
OOD_SCORE = "msp"
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


def headline() -> list[str]:
    """The keys ``fit`` and ``evaluate`` print: the metrics marked ``headline``, then the held-out
    ELPD."""
    return [m.name for m in metrics.METRICS.entries() if m.headline] + ["test_elpd"]


def comparison_metrics() -> list[metrics.Metric]:
    """The metrics marked ``compared``: the columns of ``compare``'s table and the panels of its
    figure."""
    return [m for m in metrics.METRICS.entries() if m.compared]


def torch_uncertainty_metrics() -> list[metrics.Metric]:
    """The metrics that have a torch-uncertainty name, in the order of
    :data:`TORCH_UNCERTAINTY_GROUPS` (a group it does not list last)."""

    def group(metric: metrics.Metric) -> int:
        prefix = re.split("[/_]", metric.torch_uncertainty or "", maxsplit=1)[0]
        groups = TORCH_UNCERTAINTY_GROUPS
        return groups.index(prefix) if prefix in groups else len(groups)

    return sorted((m for m in metrics.METRICS.entries() if m.torch_uncertainty), key=group)


def constant_note(probs: dict[str, np.ndarray], class_names: list[str]) -> str | None:
    """A note when the predictive ``probs`` (split → (S, N, C)) gives its most probable class,
    the same for every example, to the whole validation split (at least two examples): the
    network ignores its inputs (its accuracy is the class's share, its MCC 0); else None."""
    val = probs.get("val")
    if val is None or val.shape[1] < 2:
        return None
    predicted = np.unique(val.mean(0).argmax(-1))
    if len(predicted) > 1:
        return None
    index = int(predicted[0])
    name = repr(class_names[index]) if class_names else f"class {index}"
    return (
        f"every one of the {val.shape[1]} validation examples is predicted {name}: the "
        f"network ignores its inputs (a constant predictor); try a warm-up (optim.warmup = 0.1), "
        f"another optim.lr, more train.epochs with train.monitor = 'mcc' or 'nll', "
        f"model.pooling = 'mean' for a pretrained backbone, or a smaller elbo.kl_weight where "
        f"the ELBO's KL terms dwarf its likelihood (history.csv)"
    )


def summarise(
    probs: dict[str, np.ndarray],
    labels: dict[str, np.ndarray],
    given: dict[str, dict[str, np.ndarray]] | None = None,
) -> dict[str, Any]:
    """probs: split → (S, N, C) for ``val``, ``test`` and every ``ood:NAME``; labels: split →
    (N,); given: split → score → (N,), the scores the network gives (the free energy where the
    predictive has logits, the feature-space scores where the run fitted them)."""
    n_classes = probs["test"].shape[-1]
    scores: dict[str, Any] = metrics.classification_metrics(probs["test"], labels["test"])
    scores["test_elpd"], scores["test_elpd_se"], _ = elpd.heldout_elpd(
        probs["test"], labels["test"]
    )
    temperature = calibration.fit_temperature(probs["val"], labels["val"])
    scores["temperature"] = temperature
    tempered = calibration.temperature_scaled(probs["test"], temperature)
    scaled = [m for m in metrics.METRICS.entries() if m.temperature_scaled]
    for key, value in metrics.classification_metrics(tempered, labels["test"], scaled).items():
        scores[TEMPERATURE_SCALED + key] = value
    shifted = [m for m in metrics.METRICS.entries() if m.shifted]
    given = given or {}
    scores["ood"] = {}
    for name, probs_out in ood_sets(probs).items():
        split = ood_split(name)
        report: dict[str, Any] = {"n": int(probs_out.shape[1])}
        if report["n"]:
            report.update(
                metrics.ood_report(probs["test"], probs_out, given.get("test"), given.get(split))
            )
        if has_class_labels(labels[split], n_classes):
            report.update(metrics.classification_metrics(probs_out, labels[split], shifted))
        scores["ood"][name] = report
    scores = {key: None if _missing(value) else value for key, value in scores.items()}
    scores["torch_uncertainty"] = torch_uncertainty_names(scores)
    return scores


def _missing(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def torch_uncertainty_names(scores: dict[str, Any]) -> dict[str, float | None]:
    """The metrics of one predictive (a :func:`summarise` dict) under torch-uncertainty's names
    (module docstring), in the order of :func:`torch_uncertainty_metrics`; a metric ``scores``
    does not hold (``disagreement`` of one sample, a set without labels) is left out."""
    named = torch_uncertainty_metrics()
    names: dict[str, Any] = {}
    for prefix, pick in (("test/", ""), ("test/post/", TEMPERATURE_SCALED)):
        for metric in named:
            if pick + metric.name in scores:
                names[f"{prefix}{metric.torch_uncertainty}"] = scores[pick + metric.name]
    for set_name, report in scores.get("ood", {}).items():
        for key, name in TORCH_UNCERTAINTY_OOD.items():
            if OOD_SCORE in report:
                names[f"ood/{set_name}/{name}"] = report[OOD_SCORE][key]
        for metric in named:
            if metric.shifted and metric.name in report:
                names[f"shift/{set_name}/{metric.torch_uncertainty}"] = report[metric.name]
    return names
