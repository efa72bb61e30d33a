"""Figures and terminal tables of a run's metrics (see :mod:`probtrans.metrics`).

Figures are built on :class:`matplotlib.figure.Figure` objects, never on pyplot's global state,
so no GUI backend is needed and a notebook's backend is left alone; PNGs are rendered by Agg.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from probtrans.io import save_png
from probtrans.metrics import (
    UNCERTAINTY_SCORES,
    calibration_bins,
    ece,
    ood_detection,
    predictive_entropy,
    predictive_mean,
)

#: out-of-domain sets whose histograms the run figure overlays; more are shown as box plots
MAX_OVERLAID = 5


def reliability_diagram(
    ax: Axes,
    mean_probs: np.ndarray,
    labels: np.ndarray,
    n_bins: int = 15,
    label: str | None = None,
) -> None:
    """Draw the top-label reliability diagram (Guo et al. 2017) on ``ax``.

    One bar per non-empty bin of :func:`probtrans.metrics.calibration_bins`, spanning the bin and
    as high as the bin's accuracy; the diagonal is perfect calibration. The legend gives the ECE.
    """
    bins = calibration_bins(mean_probs, labels, n_bins)
    filled = bins["count"] > 0
    edges = bins["edges"]
    error = ece(mean_probs, labels, n_bins)
    bar_label = f"ECE = {error:.4f}" if label is None else f"{label} (ECE = {error:.4f})"
    ax.bar(
        edges[:-1][filled],
        bins["accuracy"][filled],
        width=np.diff(edges)[filled],
        align="edge",
        edgecolor="black",
        alpha=0.7,
        label=bar_label,
    )
    ax.plot([0.0, 1.0], [0.0, 1.0], linestyle="--", color="grey", label="perfect calibration")
    ax.set_xlim(0.0, 1.0)
    ax.set_ylim(0.0, 1.0)
    ax.set_xlabel("confidence (top-label probability)")
    ax.set_ylabel("accuracy")
    ax.set_title("reliability diagram")
    ax.legend(loc="upper left")


def uncertainty_histograms(
    ax: Axes,
    score_in: np.ndarray,
    scores_out: dict[str, np.ndarray],
    name: str = "predictive entropy",
) -> None:
    """Draw overlaid density histograms of an uncertainty score: the in-domain test split and
    each out-of-domain set, on shared bins; each set's legend entry gives its AUROC
    (:func:`probtrans.metrics.ood_detection`). Without out-of-domain sets, in-domain alone.
    """
    score_in = np.asarray(score_in, dtype=np.float64)
    scores_out = {k: np.asarray(v, dtype=np.float64) for k, v in scores_out.items() if len(v)}
    edges = np.histogram_bin_edges(np.concatenate([score_in, *scores_out.values()]), bins=30)
    ax.hist(score_in, bins=edges, density=True, alpha=0.6, label="in-domain test")
    for set_name, score_out in scores_out.items():
        auroc = ood_detection(score_in, score_out)["auroc"]
        ax.hist(
            score_out,
            bins=edges,
            density=True,
            alpha=0.45,
            histtype="stepfilled",
            label=f"{set_name} (AUROC {auroc:.3f})",
        )
    ax.set_title("in-domain vs out-of-domain" if scores_out else "no out-of-domain examples")
    ax.set_xlabel(name)  # the score names the x axis
    ax.set_ylabel("density")
    ax.legend()


def uncertainty_boxes(
    ax: Axes,
    score_in: np.ndarray,
    scores_out: dict[str, np.ndarray],
    name: str = "predictive entropy",
) -> None:
    """Draw one horizontal box plot of an uncertainty score per set — the in-domain test split
    on top, then each out-of-domain set with its AUROC — for more sets than histograms can show
    (boxes: quartiles; whiskers: 1.5 interquartile ranges)."""
    score_in = np.asarray(score_in, dtype=np.float64)
    scores_out = {k: np.asarray(v, dtype=np.float64) for k, v in scores_out.items() if len(v)}
    labels = ["in-domain test"] + [
        f"{k} ({ood_detection(score_in, v)['auroc']:.3f})" for k, v in scores_out.items()
    ]
    ax.boxplot([score_in, *scores_out.values()], orientation="horizontal", showfliers=False)
    ax.set_yticks(range(1, len(labels) + 1), labels, fontsize="small")
    ax.invert_yaxis()
    ax.set_xlabel(name)
    ax.set_title("in-domain vs out-of-domain (AUROC)")


def save_run_figure(
    path: str | os.PathLike[str],
    probs_in: np.ndarray,
    labels_in: np.ndarray,
    probs_out: dict[str, np.ndarray],
    title: str = "",
) -> Path:
    """Write a two-panel PNG: the in-domain reliability diagram and the predictive-entropy
    histograms of the in-domain test split and each out-of-domain set (box plots beyond
    :data:`MAX_OVERLAID` sets). ``probs_in``
    (S, N_in, C) and each of ``probs_out`` (S', N_out, C) are posterior-predictive samples.

    The file is written atomically (:func:`probtrans.io.save_png`). Returns ``path`` as a
    :class:`~pathlib.Path`.
    """
    entropy_out = {k: predictive_entropy(p) for k, p in probs_out.items() if p.shape[1]}
    height = max(4.5, 0.25 * len(entropy_out)) if len(entropy_out) > MAX_OVERLAID else 4.5
    fig = Figure(figsize=(11.0, height), layout="constrained")
    reliability_ax, entropy_ax = fig.subplots(1, 2)
    reliability_diagram(reliability_ax, predictive_mean(probs_in), labels_in)
    draw = uncertainty_boxes if len(entropy_out) > MAX_OVERLAID else uncertainty_histograms
    draw(entropy_ax, predictive_entropy(probs_in), entropy_out)
    if title:
        fig.suptitle(title)
    return save_png(fig, path)


#: how to read :func:`format_ood_table`
OOD_NOTE = (
    "OOD detection against the in-domain test split; scores higher = more uncertain; AUROC and "
    "AUPR with out-of-domain positive, FPR@95 with in-domain positive at 95% recall"
)


def format_ood_table(ood: dict[str, dict]) -> str:
    """The out-of-domain detection of ``metrics["ood"]`` as a text table: one row per set and
    measure (AUROC, AUPR, FPR@95), one column per uncertainty score, and a line per labelled
    set with its accuracy, NLL and ECE."""
    scores = [s for s in UNCERTAINTY_SCORES if any(s in report for report in ood.values())]
    rows = [["set", "measure", *scores]]
    shifted = []
    for set_name, report in ood.items():
        for measure in ("auroc", "aupr", "fpr95"):
            cells = [f"{report[s][measure]:.4f}" if s in report else "–" for s in scores]
            rows.append([set_name, measure, *cells])
        if "accuracy" in report:
            shifted.append(
                f"{set_name} (labelled, n = {report['n']}): accuracy {report['accuracy']:.4f}, "
                f"NLL {report['nll']:.4f}, ECE {report['ece']:.4f}"
            )
    return "\n".join([text_table(rows, [False, False] + [True] * len(scores)), *shifted])


def variants(metrics: dict[str, Any]) -> list[str]:
    """The post-hoc variants whose metrics ``metrics`` holds (keys ``{variant}.accuracy``)."""
    return sorted(key.removesuffix(".accuracy") for key in metrics if key.endswith(".accuracy"))


def format_run_table(metrics: dict[str, Any], keys: Iterable[str]) -> str:
    """The ``keys`` of a run's ``metrics.json`` side by side for the plain predictive, its
    temperature-scaled version (``ts_*``) and each post-hoc variant (``{variant}.*``), "–"
    where a predictive has no such metric (temperature scaling keeps the accuracy); then the
    epoch kept and the number of posterior samples, when the run has them."""
    columns = {"plain": "", "temperature-scaled": "ts_"} | {v: f"{v}." for v in variants(metrics)}
    rows = [["metric", *columns]]
    for key in keys:
        cells = [metrics.get(prefix + key) for prefix in columns.values()]
        rows.append([key, *(f"{float(c):.4f}" if c is not None else "–" for c in cells)])
    lines = [text_table(rows, [False] + [True] * len(columns))]
    if "best_epoch" in metrics and "epochs" in metrics:
        lines.append(
            f"weights of epoch {metrics['best_epoch']} of {metrics['epochs']} (best validation)"
            f", {metrics.get('posterior_samples', '?')} posterior samples"
        )
    return "\n".join(lines)


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
