"""A comparison's ``figure.png``: methods overlaid, one panel per question
(:func:`comparison_figure`), built from the panels of :mod:`probtrans.analysis.figures` on a
:class:`matplotlib.figure.Figure` (no pyplot state).
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from sklearn.metrics import roc_curve

from probtrans.analysis.figures import SMALL, confidence_range, method_colours, note, risk_ylim
from probtrans.analysis.metrics import (
    METRICS,
    Metric,
    calibration_bins,
    predictive_mean,
    risk_coverage,
    uncertainty_scores,
)
from probtrans.analysis.summary import comparison_metrics, ood_sets, ood_split, summarise

#: the size of a comparison figure, whatever its number of methods
COMPARISON_FIGSIZE = (16.0, 10.0)
#: characters per line of a comparison figure's metric-panel titles (wrapped: no overlap)
PANEL_TITLE_WIDTH = 18
#: after a metric's label: which way is better
#: (:attr:`probtrans.analysis.metrics.Metric.higher_is_better`)
ARROWS = {True: " ↑", False: " ↓", None: ""}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h")


class Predictive(Protocol):
    """A posterior predictive over splits (:class:`probtrans.runs.compare.Instance`)."""

    probs: dict[str, np.ndarray]  # split → (S, N, C)
    labels: dict[str, np.ndarray]  # split → (N,)
    given: dict[str, dict[str, np.ndarray]]  # split → score → (N,): energy, feature scores


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    values = np.asarray(values, dtype=np.float64)
    return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0


def comparison_figure(
    title: str,
    methods: Mapping[str, Sequence[Predictive]],
    id_metric: str = "accuracy",
    ood_score: str = "entropy",
    n_bins: int = 15,
) -> Figure:
    """Methods overlaid, one panel per question, at a fixed size whatever their number.

    ``methods``: name → the method's predictives, one per seed (or one deep ensemble). Top
    subfigure, the first predictive of each method: reliability (bin accuracy against bin mean
    confidence, a line per method, marker area ∝ examples in the bin), risk–coverage, and the
    ROC of the first out-of-domain set by ``ood_score``. Bottom subfigure, mean ± standard
    deviation over the predictives of :func:`probtrans.analysis.summary.summarise`: ``id_metric``,
    the metrics of :func:`probtrans.analysis.summary.comparison_metrics` (NLL, Brier, ECE, MCE,
    AURC; an arrow says which way is better), the held-out ELPD and that set's AUROC, a row per
    method. One colour and marker per method in every panel; the legend is outside, right. The axes
    are in ``fig.subfigs[0].axes`` (curves) and ``fig.subfigs[1].axes`` (metrics).
    """
    names = list(methods)
    styles = dict(
        zip(names, zip(method_colours(len(names)), MARKERS * len(names), strict=False), strict=True)
    )
    fig = Figure(figsize=COMPARISON_FIGSIZE, layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[3, 2])
    first = {name: predictives[0] for name, predictives in methods.items()}
    sets = [k for k, p in ood_sets(first[names[0]].probs).items() if p.shape[1]]
    reliability_ax, risk_ax, roc_ax = top.subplots(1, 3)
    compared_reliability(reliability_ax, first, styles, n_bins)
    compared_risk_coverage(risk_ax, first, styles)
    compared_roc(roc_ax, first, styles, sets, ood_score)
    handles = [
        Line2D([], [], color=colour, marker=marker, label=name)
        for name, (colour, marker) in styles.items()
    ]
    top.legend(handles=handles, loc="outside right upper", fontsize=SMALL, title="method")
    compared_metrics(bottom, methods, styles, id_metric, ood_score, sets[0] if sets else None)
    fig.suptitle(title, fontsize="x-large")
    return fig


Styles = Mapping[str, tuple[Any, str]]  # method → (colour, marker)


#: the comparison figure's reliability curves leave out bins of fewer examples, whose accuracy
#: is that of a handful
MIN_BIN_EXAMPLES = 10


def compared_reliability(
    ax: Axes, first: Mapping[str, Predictive], styles: Styles, n_bins: int
) -> None:
    """Bin accuracy against bin mean confidence, a line per method, marker area ∝ bin size."""
    n_classes = next(iter(first.values())).probs["test"].shape[-1]
    low, high = confidence_range(n_classes)
    ax.plot([low, high], [low, high], linestyle="--", color="grey")
    for name, (colour, marker) in styles.items():
        labels = first[name].labels["test"]
        bins = calibration_bins(predictive_mean(first[name].probs["test"]), labels, n_bins)
        filled = bins["count"] >= MIN_BIN_EXAMPLES  # fewer: an accuracy of a handful
        x, y = bins["confidence"][filled], bins["accuracy"][filled]
        ax.plot(x, y, color=colour, label=name, linewidth=1.3)
        size = 8 + 200 * bins["count"][filled] / len(labels)
        ax.scatter(x, y, s=size, color=colour, marker=marker, zorder=3)
    ax.set_xlim(low, high)
    ax.set_ylim(0.0, 1.0)
    ax.set_xlabel("mean confidence in bin (top-label probability)")
    ax.set_ylabel("accuracy in bin")
    ax.set_title(  # two lines: one would run past the figure's left edge
        f"reliability\n(marker area ∝ examples in bin; bins of < {MIN_BIN_EXAMPLES} left out)"
    )


def compared_risk_coverage(ax: Axes, first: Mapping[str, Predictive], styles: Styles) -> None:
    risks = []
    for name, (colour, marker) in styles.items():
        labels = first[name].labels["test"]
        risks.append(risk_coverage(predictive_mean(first[name].probs["test"]), labels))
        every = max(1, len(labels) // 6)
        ax.plot(*risks[-1], color=colour, label=name, marker=marker, markevery=every, ms=5)
    ax.set_xlim(0.0, 1.0)
    ax.set_ylim(0.0, risk_ylim(risks))
    ax.set_xlabel("coverage (most confident kept first)")
    ax.set_ylabel("risk (error rate among kept)")
    ax.set_title("selective prediction: risk–coverage")


def compared_roc(
    ax: Axes, first: Mapping[str, Predictive], styles: Styles, sets: list[str], score: str
) -> None:
    """The ROC of the first out-of-domain set by ``score``, a line per method that has it."""
    ax.plot([0.0, 1.0], [0.0, 1.0], linestyle="--", color="grey")
    ax.set_xlim(0.0, 1.0)
    ax.set_ylim(0.0, 1.0)
    ax.set_xlabel("false-positive rate (in-domain flagged)")
    ax.set_ylabel("true-positive rate (out-of-domain flagged)")
    if not sets:
        ax.set_title("OOD detection: no out-of-domain sets")
        return
    split = ood_split(sets[0])
    for name, (colour, marker) in styles.items():
        probs, given = first[name].probs, first[name].given
        score_in = uncertainty_scores(probs["test"], given.get("test")).get(score)
        score_out = uncertainty_scores(probs[split], given.get(split)).get(score)
        if score_in is None or score_out is None:
            continue  # a score the network does not give (no logits, no features)
        is_ood = np.concatenate([np.zeros(score_in.size), np.ones(score_out.size)])
        fpr, tpr, _ = roc_curve(is_ood, np.concatenate([score_in, score_out]))
        every = max(1, len(fpr) // 6)
        ax.plot(fpr, tpr, color=colour, label=name, marker=marker, markevery=every, ms=5)
    more = f" (first of {len(sets)} sets)" if len(sets) > 1 else ""
    ax.set_title(f"OOD ROC: {sets[0]} by {score}{more}")
    if len(ax.lines) == 1:
        note(ax, f"no method has the {score} score")


def metric_panel(metric: Metric, prefix: str = "") -> tuple[str, str, Any]:
    """The title (label and arrow), axis label (with unit) and value (of a summary; NaN for
    none) of a metric's panel."""

    def value(summary: dict[str, Any]) -> float:
        number = summary.get(metric.name)
        return np.nan if number is None else metric.scale * number

    title = f"{prefix}{metric.label}{ARROWS[metric.higher_is_better]}"
    return title, f"{metric.label} ({metric.unit})", value


def compared_metrics(
    subfig: Any,
    methods: Mapping[str, Sequence[Predictive]],
    styles: Styles,
    id_metric: str,
    score: str,
    ood_set: str | None,
) -> None:
    """One small panel per metric, a row per method: mean ± std over its predictives."""
    summaries = {
        name: [summarise(p.probs, p.labels, p.given) for p in predictives]
        for name, predictives in methods.items()
    }
    elpd = "test ELPD ↑ (bar: ± 2 SE)"  # bars: a run's standard error, not the seeds' spread
    panels = [
        metric_panel(METRICS.get(id_metric, "id_metric"), "ID "),
        *(metric_panel(metric) for metric in comparison_metrics()),
        (elpd, "held-out ELPD (nats)", lambda s: s["test_elpd"]),
    ]
    if ood_set is not None:

        def auroc(s: dict[str, Any]) -> float:
            return 100 * s["ood"][ood_set].get(score, {}).get("auroc", np.nan)

        panels.append((f"{ood_set} AUROC by {score} ↑", "AUROC (%)", auroc))
    axes = subfig.subplots(1, len(panels), sharey=True)
    for ax, (title, unit, value) in zip(axes, panels, strict=True):
        for row, (name, (colour, marker)) in enumerate(styles.items()):
            mean, std = mean_std([value(s) for s in summaries[name]])
            if title == elpd:  # the mean over seeds of each run's SE
                std = 2 * float(np.mean([s["test_elpd_se"] for s in summaries[name]]))
            ax.errorbar(
                mean,
                row,
                xerr=std,
                color=colour,
                marker=marker,
                markersize=7,
                capsize=4,
                linestyle="none",
            )
        ax.set_title(textwrap.fill(title, PANEL_TITLE_WIDTH), fontsize="medium")  # no overlap
        ax.set_xlabel(unit)
        ax.grid(axis="x", alpha=0.3)
        ax.margins(x=0.15)
    axes[0].set_yticks(range(len(styles)), list(styles), fontsize=SMALL)
    axes[0].set_ylabel("method")
    axes[0].set_ylim(len(styles) - 0.5, -0.5)
    subfig.suptitle(
        "mean ± std over seeds (error bars; none for one seed or an ensemble); test ELPD: ± 2 "
        "standard errors of a run's estimate",
        fontsize="medium",
    )
