"""Figures and terminal tables of a run's metrics (see :mod:`probtrans.metrics`).

Figures are built on :class:`matplotlib.figure.Figure` objects, never on pyplot's global state,
so no GUI backend is needed and a notebook's backend is left alone; PNGs are rendered by Agg.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from probtrans.io import save_png
from probtrans.metrics import calibration_bins, ece, ood_scores, predictive_entropy, predictive_mean


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
    score_out: np.ndarray,
    name: str = "predictive entropy",
) -> None:
    """Draw overlaid density histograms of an uncertainty score, in-domain vs out-of-domain.

    Both histograms share the same bins; the title gives the OOD AUROC of the score (OOD
    positive, higher score = more likely OOD; :func:`probtrans.metrics.ood_scores`). Without
    out-of-domain examples, the in-domain histogram alone.
    """
    score_in = np.asarray(score_in, dtype=np.float64)
    score_out = np.asarray(score_out, dtype=np.float64)
    edges = np.histogram_bin_edges(np.concatenate([score_in, score_out]), bins=30)
    ax.hist(score_in, bins=edges, density=True, alpha=0.6, label="in-domain")
    if len(score_out):
        ax.hist(score_out, bins=edges, density=True, alpha=0.6, label="out-of-domain")
        ax.set_title(f"OOD AUROC = {ood_scores(score_in, score_out)['auroc']:.4f}")
    else:
        ax.set_title("no out-of-domain examples")
    ax.set_xlabel(name)  # the score names the x axis
    ax.set_ylabel("density")
    ax.legend()


def save_run_figure(
    path: str | os.PathLike[str],
    probs_in: np.ndarray,
    labels_in: np.ndarray,
    probs_out: np.ndarray,
    title: str = "",
) -> Path:
    """Write a two-panel PNG: the in-domain reliability diagram and the in- vs out-of-domain
    predictive-entropy histograms. ``probs_in`` (S, N_in, C) and ``probs_out`` (S', N_out, C) are
    posterior-predictive samples.

    The file is written atomically (:func:`probtrans.io.save_png`). Returns ``path`` as a
    :class:`~pathlib.Path`.
    """
    fig = Figure(figsize=(11.0, 4.5), layout="constrained")
    reliability_ax, entropy_ax = fig.subplots(1, 2)
    reliability_diagram(reliability_ax, predictive_mean(probs_in), labels_in)
    entropy_out = predictive_entropy(probs_out) if probs_out.shape[1] else np.zeros(0)
    uncertainty_histograms(entropy_ax, predictive_entropy(probs_in), entropy_out)
    if title:
        fig.suptitle(title)
    return save_png(fig, path)


def format_table(metrics: dict[str, float], keys: Iterable[str] | None = None) -> str:
    """A two-column text table, one ``metric  value`` row per key (values with 4 decimals,
    right-aligned). ``keys`` picks and orders the rows; by default all keys, in dict order."""
    keys = list(metrics) if keys is None else list(keys)
    missing = [key for key in keys if key not in metrics]
    if missing:
        raise ValueError(f"format_table: keys not in metrics: {', '.join(missing)}")
    rows = [("metric", "value"), *((key, f"{float(metrics[key]):.4f}") for key in keys)]
    name_width = max(len(name) for name, _ in rows)
    value_width = max(len(value) for _, value in rows)
    return "\n".join(f"{name:<{name_width}}  {value:>{value_width}}" for name, value in rows)
