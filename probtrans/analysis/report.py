"""Terminal tables of a run's metrics (see :mod:`probtrans.analysis.metrics`); the figures are in
:mod:`probtrans.analysis.figures`."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from probtrans.analysis.metrics import METRICS, UNCERTAINTY_SCORES
from probtrans.analysis.results import PLAIN, TEMPERATURE_SCALED, RunMetrics

#: how to read :func:`format_ood_table` (two lines, under 100 columns)
OOD_NOTE = (
    "OOD detection against the in-domain test split; scores higher = more uncertain;\n"
    "AUROC and AUPR with out-of-domain positive, FPR@95 with in-domain positive at 95% recall"
)


def format_ood_table(ood: dict[str, dict], first: str | None = None) -> str:
    """The out-of-domain detection of ``metrics["ood"]`` as a text table: one row per set and
    measure (AUROC, AUPR, FPR@95), one column per uncertainty score (``first``, the recommended
    one, leading), and a line per labelled set with its metrics (those of
    :data:`probtrans.analysis.metrics.METRICS` marked ``shifted``)."""
    scores = [s for s in UNCERTAINTY_SCORES if any(s in report for report in ood.values())]
    if first in scores:
        scores = [first, *(s for s in scores if s != first)]
    rows = [["set", "measure", *scores]]
    shifted = []
    for set_name, report in ood.items():
        for measure in ("auroc", "aupr", "fpr95"):
            cells = [f"{report[s][measure]:.4f}" if s in report else "–" for s in scores]
            rows.append([set_name, measure, *cells])
        labelled = [m for m in METRICS.entries() if m.shifted and m.name in report]
        if labelled:
            values = ", ".join(f"{m.label} {_cell(report[m.name])}" for m in labelled)
            shifted.append(f"{set_name} (labelled, n = {report['n']}): {values}")
    return "\n".join([text_table(rows, [False, False] + [True] * len(scores)), *shifted])


def format_run_table(metrics: dict[str, Any], keys: Iterable[str]) -> str:
    """The ``keys`` of a run's ``metrics.json`` side by side for the plain predictive, its
    temperature-scaled version and each post-hoc variant, "–" where a predictive has no such
    metric (temperature scaling keeps the accuracy) or it has no value (``null``, NaN:
    ``cov_at_5_risk`` when no coverage reaches 5 % risk); a key that no predictive has
    (``test_elpd`` of an older run) gets no row. Then the epoch kept and the number of
    posterior samples, when the run has them."""
    run = RunMetrics.from_json(metrics)
    columns = {
        PLAIN: run.plain.get,
        "temperature-scaled": run.plain.scaled,
        **{name: run.predictives[name].get for name in run.variants},
    }
    rows = [["metric", *columns]]
    for key in keys:
        if not any(p.has(key) or p.has(TEMPERATURE_SCALED + key) for p in run.predictives.values()):
            continue
        rows.append([key, *(_cell(value(key)) for value in columns.values())])
    lines = [text_table(rows, [False] + [True] * len(columns))]
    if "best_epoch" in run.run and "epochs" in run.run:
        lines.append(
            f"weights of epoch {run.run['best_epoch']} of {run.run['epochs']} (best validation)"
            f", {run.posterior_samples or '?'} posterior samples"
        )
    return "\n".join(lines)


def _cell(value: Any) -> str:
    """A metric with 4 decimals, or "–" for none (None, NaN)."""
    return "–" if value is None or math.isnan(float(value)) else f"{float(value):.4f}"


def format_table(metrics: dict[str, float], keys: Iterable[str] | None = None) -> str:
    """A two-column text table, one ``metric  value`` row per key (values with 4 decimals,
    right-aligned). ``keys`` picks and orders the rows; by default all keys, in dict order."""
    keys = list(metrics) if keys is None else list(keys)
    missing = [key for key in keys if key not in metrics]
    if missing:
        raise ValueError(f"format_table: keys not in metrics: {', '.join(missing)}")
    rows = [["metric", "value"], *([key, f"{float(metrics[key]):.4f}"] for key in keys)]
    return text_table(rows, [False, True])


def text_table(rows: list[list[str]], right: list[bool]) -> str:
    """``rows`` of cells as text lines, columns two spaces apart and padded to their widest
    cell: right-aligned where ``right`` says (numbers), else left-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(right))]
    return "\n".join(
        "  ".join(
            cell.rjust(width) if r else cell.ljust(width)
            for cell, width, r in zip(row, widths, right, strict=True)
        ).rstrip()
        for row in rows
    )
