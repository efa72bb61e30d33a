"""Figures of posterior predictives: the panels, and a run's ``report.png`` built from them.

Figures are built on :class:`matplotlib.figure.Figure` objects, never on pyplot's global state,
so no GUI backend is needed and a notebook's backend is left alone; PNGs are rendered by Agg
(:func:`probtrans.storage.io.save_png`). Each panel function draws one question on an ``Axes``
given to it, so notebooks can compose their own figures:

* :func:`reliability_diagram` — is the confidence right? accuracy per confidence bin, the gap
  to the bin's mean confidence, and (beneath, on ``counts_ax``) how many examples each bin holds;
* :func:`uncertainty_histograms` / :func:`uncertainty_boxes` — does an uncertainty score rise
  out of domain? (AUROC per set);
* :func:`roc_curves` — how well does it flag out-of-domain inputs at every threshold?
* :func:`risk_coverage_curve` — how much error is left when only the most confident are kept?
* :func:`training_curves` — how did the objective and the validation metrics move per epoch?

:func:`run_figure` puts them on one page for a run; a comparison overlays methods on them
(:func:`probtrans.analysis.comparison_figure.comparison_figure`).
Confidence axes span the attainable range [1/C, 1] (a top-label probability is at least 1/C).
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, MaxNLocator, NullFormatter, StrMethodFormatter
from sklearn.metrics import roc_curve

from probtrans.analysis.metrics import (
    UNCERTAINTY_SCORES,
    aurc,
    calibration_bins,
    ece,
    mce,
    mutual_information,
    ood_detection,
    predictive_entropy,
    predictive_mean,
    risk_coverage,
    uncertainty_scores,
)
from probtrans.analysis.summary import ood_split
from probtrans.storage.io import DamagedFile, read_json, save_png

#: out-of-domain sets whose histograms (and ROC legend entries) the run figure shows; more are
#: shown as box plots (and as grey ROC curves, the best and the worst named)
MAX_OVERLAID = 5
#: the size of a run figure (inches; 1800 × 1080 px at the 120 dpi of ``save_png``)
RUN_FIGSIZE = (15.0, 9.0)
#: characters per line of a run figure's title (x-large type across its 15 inches)
TITLE_WIDTH = 110
#: a run figure's margins (inches) and gaps (fractions of a panel) where its layout is fixed,
#: drawn in one pass (a layout engine costs a second one, half the figure's time): the room for
#: its titles, tick labels and the legends beside the training panels, measured once
RUN_MARGINS = {"left": 0.65, "right": 0.1, "bottom": 0.6, "top": 0.65, "title_line": 0.3}
RUN_GAPS = {"wspace": 0.2, "hspace": 0.3}
#: the width of the training panels' legends, beside them, as a fraction of their column
LEGEND_COLUMN = 0.52
#: history keys of the objective panel (nats per example) and their legend names
OBJECTIVE_KEYS = {
    "elbo": "ELBO",
    "expected_log_likelihood": "expected log-likelihood",
    "kl": "KL(q ‖ p) (MAP: −log p(W))",
    "objective": "objective (KL annealed)",
}
IN_DOMAIN = "in-domain test"
SMALL = "small"
#: a legend beside its axes, on the right, where it covers no data
OUTSIDE_RIGHT = {"loc": "upper left", "bbox_to_anchor": (1.02, 1.0), "fontsize": SMALL}


# ----------------------------------------------------------------------------- words
#: what the S draws of a predictive are, by (whether the weights' posterior varies, whether
#: the model has local random sites: stochastic attention, SGPA outputs)
DRAW_WORDS = {
    (True, True): "posterior draws of the weights, attention sampled in each",
    (True, False): "posterior draws of the weights",
    (False, True): "attention samples under a point-mass posterior",
    (False, False): "draws of a deterministic network, all equal",
}


def draws_in_words(weights_vary: bool, local: bool) -> str:
    """What the S draws of a predictive are (:data:`DRAW_WORDS`): posterior draws of the
    weights (epistemic), attention samples under a point-mass posterior (aleatoric, per input),
    or both."""
    return DRAW_WORDS[weights_vary, local]


def run_title(
    data: str, network: str, guide: str, samples: int, draws: str = DRAW_WORDS[True, True]
) -> str:
    """What a run is, for its figure: data, network (``ModelSpec``'s ``in_words``), the guide in
    words (:func:`probtrans.inference.guide_builder.guide_in_words`), and the S draws of its
    predictive and what they are (``draws``, :func:`draws_in_words`); wrapped to the figure's
    width."""
    text = f"{data} · {network} · guide: {guide} · S = {samples} {draws}"
    return textwrap.fill(text, TITLE_WIDTH)


def score_label(name: str) -> str:
    """The uncertainty score ``name`` in words
    (:data:`probtrans.analysis.metrics.UNCERTAINTY_SCORES`)."""
    return UNCERTAINTY_SCORES.get(name, "uncertainty score").label


def short(label: str) -> str:
    """An axis label without its unit: ``predictive entropy (nats)`` → ``predictive entropy``."""
    return label.split(" (")[0]


# ----------------------------------------------------------------------------- helpers
def confidence_range(n_classes: int) -> tuple[float, float]:
    """The attainable top-label confidences [1/C, 1]."""
    return 1.0 / n_classes, 1.0


def set_colours(names: Sequence[str]) -> dict[str, str]:
    """In-domain blue (C0), then the sets in order; the same in every panel of a run figure."""
    return {name: f"C{i % 9 + 1}" for i, name in enumerate(names)}


def method_colours(n: int) -> list[Any]:
    """Colours of ``n`` methods: tab10, or tab20 beyond ten methods."""
    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def nonempty(scores: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, dtype=np.float64) for k, v in scores.items() if len(v)}


#: a score whose spread is below this (relative to its size) is rounding noise, not a signal
CONSTANT_SCORE = 1e-9


def note(ax: Axes, text: str) -> None:
    """A grey note in the middle of an empty panel."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="grey")


# ----------------------------------------------------------------------------- panels
def reliability_diagram(
    ax: Axes,
    mean_probs: np.ndarray,
    labels: np.ndarray,
    n_bins: int = 15,
    label: str | None = None,
    counts_ax: Axes | None = None,
    log_counts: bool = True,
) -> None:
    """Draw the top-label reliability diagram (Guo et al. 2017) on ``ax``.

    One bar per non-empty bin of :func:`probtrans.analysis.metrics.calibration_bins`, spanning the
    bin and as high as the bin's accuracy; hatched, the gap to the bin's mean confidence; the
    diagonal is perfect calibration. The title gives the ECE and the MCE with the number of
    examples in the bin the MCE comes from (after ``label`` when given). With ``counts_ax`` (an axes
    beneath, sharing the x axis), the examples per bin as bars (log scale with ``log_counts``):
    a bin's gap means little when it holds a handful of examples. The x axis spans [1/C, 1].
    """
    mean_probs = np.asarray(mean_probs, dtype=np.float64)
    bins = calibration_bins(mean_probs, labels, n_bins)
    filled = bins["count"] > 0
    left, width = bins["edges"][:-1][filled], np.diff(bins["edges"])[filled]
    accuracy, confidence = bins["accuracy"][filled], bins["confidence"][filled]
    gaps = np.abs(accuracy - confidence)
    ax.bar(
        left,
        accuracy,
        width=width,
        align="edge",
        edgecolor="black",
        alpha=0.75,
        color="C0",
        label="accuracy",
    )
    ax.bar(
        left,
        confidence - accuracy,
        bottom=accuracy,
        width=width,
        align="edge",
        color="none",
        edgecolor="C3",
        hatch="//",
        label="gap to confidence",
    )
    low, high = confidence_range(mean_probs.shape[1])
    ax.plot([low, high], [low, high], linestyle="--", color="grey", label="calibrated")
    ax.set_xlim(low, high)
    ax.set_ylim(0.0, 1.0)
    ax.set_ylabel("accuracy")
    worst = int(np.argmax(gaps))
    title = (
        f"ECE {ece(mean_probs, labels, n_bins):.4f} · MCE {mce(mean_probs, labels, n_bins):.4f}"
        f" (a bin of {int(bins['count'][filled][worst])}/{len(labels)})"
    )
    ax.set_title(f"reliability: {title}" if label is None else f"{label}: {title}", pad=22)
    # one row between the title and the bars, where it covers none of them
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=3, fontsize=SMALL, frameon=False)
    if counts_ax is None:
        ax.set_xlabel("confidence (top-label probability)")
        return
    counts_ax.bar(
        left,
        bins["count"][filled],
        width=width,
        align="edge",
        color="grey",
        edgecolor="black",
        label="examples in bin",
    )
    if log_counts:
        counts_ax.set_yscale("log")
        counts_ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 3.0), numticks=12))
        counts_ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
        counts_ax.yaxis.set_minor_formatter(NullFormatter())
    counts_ax.set_xlim(low, high)
    counts_ax.set_ylabel("examples")
    counts_ax.set_xlabel("confidence (top-label probability)")
    ax.tick_params(labelbottom=False)


def uncertainty_histograms(
    ax: Axes,
    score_in: np.ndarray,
    scores_out: dict[str, np.ndarray],
    name: str = "predictive entropy",
    colours: Mapping[str, str] | None = None,
) -> None:
    """Draw overlaid density histograms of an uncertainty score: the in-domain test split and
    each out-of-domain set, on shared bins; each set's legend entry gives its AUROC
    (:func:`probtrans.analysis.metrics.ood_detection`). Without out-of-domain sets, in-domain alone.
    A score that is the same for every example to rounding (the mutual information of a
    deterministic predictive: 1e-16 noise) is not drawn: a note says so instead.
    """
    score_in = np.asarray(score_in, dtype=np.float64)
    scores_out = nonempty(scores_out)
    colours = colours or set_colours(list(scores_out))
    every = np.concatenate([score_in, *scores_out.values()])
    if np.ptp(every) <= CONSTANT_SCORE * max(1.0, np.abs(every).max()):
        value = every.mean() if abs(every.mean()) > CONSTANT_SCORE else 0.0
        note(ax, f"{name} = {value:.3g} for every example:\nnothing to tell apart")
        ax.set_title(f"{short(name)}: the same everywhere")
        ax.set_xticks([])
        ax.set_yticks([])
        return
    edges = np.histogram_bin_edges(every, bins=30)
    ax.hist(score_in, bins=edges, density=True, alpha=0.6, color="C0", label=IN_DOMAIN)
    for set_name, score_out in scores_out.items():
        auroc = ood_detection(score_in, score_out)["auroc"]
        ax.hist(
            score_out,
            bins=edges,
            density=True,
            alpha=0.45,
            histtype="stepfilled",
            color=colours.get(set_name),
            label=f"{set_name} (AUROC {auroc:.3f})",
        )
    title = f"{short(name)}: in-domain vs OOD" if scores_out else "no out-of-domain examples"
    ax.set_title(title)
    ax.set_xlabel(name)  # the score names the x axis
    ax.xaxis.set_major_locator(MaxNLocator(nbins=5))
    ax.set_ylabel("density")
    top = ax.get_ylim()[1]
    ax.set_ylim(0.0, top * (1.15 + 0.1 * len(scores_out)))  # room for the legend above the bars
    ax.legend(loc="upper right", fontsize=SMALL)


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
    scores_out = nonempty(scores_out)
    labels = [IN_DOMAIN] + [
        f"{k} ({ood_detection(score_in, v)['auroc']:.3f})" for k, v in scores_out.items()
    ]
    ax.boxplot([score_in, *scores_out.values()], orientation="horizontal", showfliers=False)
    ax.set_yticks(range(1, len(labels) + 1), labels, fontsize=SMALL)
    ax.invert_yaxis()
    ax.set_xlabel(name)
    ax.set_title(f"{short(name)}: in-domain vs OOD (AUROC)")


def roc_curves(
    ax: Axes,
    score_in: np.ndarray,
    scores_out: dict[str, np.ndarray],
    name: str = "predictive entropy",
    colours: Mapping[str, str] | None = None,
) -> None:
    """Draw the ROC curve of telling each out-of-domain set from the in-domain test split by
    an uncertainty score (out-of-domain positive, scikit-learn ``roc_curve``), with the AUROC
    of :func:`probtrans.analysis.metrics.ood_detection` in the legend. Beyond :data:`MAX_OVERLAID`
    sets the curves are grey and only the best and the worst set are named."""
    score_in = np.asarray(score_in, dtype=np.float64)
    scores_out = nonempty(scores_out)
    colours = colours or set_colours(list(scores_out))
    ax.plot([0.0, 1.0], [0.0, 1.0], linestyle="--", color="grey", label="chance (AUROC 0.5)")
    aurocs = {k: ood_detection(score_in, v)["auroc"] for k, v in scores_out.items()}
    many = len(scores_out) > MAX_OVERLAID
    named = {min(aurocs, key=aurocs.get), max(aurocs, key=aurocs.get)} if many else set(aurocs)
    for set_name, score_out in scores_out.items():
        is_ood = np.concatenate([np.zeros(score_in.size), np.ones(score_out.size)])
        fpr, tpr, _ = roc_curve(is_ood, np.concatenate([score_in, score_out]))
        shown = set_name in named
        ax.plot(
            fpr,
            tpr,
            color=colours.get(set_name) if shown else "lightgrey",
            linewidth=1.8 if shown else 0.8,
            zorder=3 if shown else 2,
            label=f"{set_name} (AUROC {aurocs[set_name]:.3f})" if shown else None,
        )
    ax.set_xlim(0.0, 1.0)
    ax.set_ylim(0.0, 1.0)
    ax.set_xlabel("false-positive rate (in-domain flagged)")
    ax.set_ylabel("true-positive rate (out-of-domain flagged)")
    ax.set_title(f"OOD detection ROC by {short(name)}" if scores_out else "no out-of-domain sets")
    legend_title = f"{len(scores_out)} sets: best and worst named" if many else None
    ax.legend(loc="lower right", fontsize=SMALL, title=legend_title, title_fontsize=SMALL)


def risk_ylim(risks: Sequence[tuple[np.ndarray, np.ndarray]]) -> float:
    """A top for risk axes: the highest risk at coverage ≥ 5 % (the first few examples alone
    give risks of 0 or 1), with a margin."""
    top = max(float(r[c >= 0.05].max(initial=r[-1])) for c, r in risks)
    return min(1.0, max(top * 1.15, 0.02))


def oracle_risk(mean_probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The risks of an oracle that keeps every correct example before any error."""
    errors = int(np.sum(np.asarray(mean_probs).argmax(axis=1) != labels))
    kept = np.arange(1, len(labels) + 1)
    return np.maximum(kept - (len(labels) - errors), 0) / kept


def risk_coverage_curve(
    ax: Axes,
    mean_probs: np.ndarray,
    labels: np.ndarray,
    label: str | None = None,
    colour: Any = "C0",
    marker: str | None = None,
    oracle: bool = True,
) -> None:
    """Draw the risk–coverage curve of selective prediction by confidence
    (:func:`probtrans.analysis.metrics.risk_coverage`) with its AURC in the legend (with ``label``
    in front when given) and, with ``oracle``, the best curve any ranking could reach."""
    coverage, risk = risk_coverage(mean_probs, labels)
    area = aurc(mean_probs, labels)
    text = f"AURC {area:.4f}" if label is None else f"{label} (AURC {area:.4f})"
    ax.plot(
        coverage,
        risk,
        color=colour,
        label=text,
        marker=marker,
        markevery=max(1, len(risk) // 8) if marker else None,
    )
    if oracle:
        best = oracle_risk(mean_probs, labels)
        ax.plot(
            coverage, best, linestyle=":", color="grey", label=f"oracle (AURC {best.mean():.4f})"
        )
    ax.set_xlim(0.0, 1.0)
    ax.set_ylim(0.0, risk_ylim([(coverage, risk)]))
    ax.set_xlabel("coverage (most confident kept first)")
    ax.set_ylabel("risk (error rate among kept)")
    ax.set_title("selective prediction: risk–coverage")
    ax.legend(loc="best", fontsize=SMALL)


def training_curves(objective_ax: Axes, validation_ax: Axes, history: Sequence[dict]) -> None:
    """Draw a run's ``history.json``: the per-example objective terms that are there (ELBO,
    expected log-likelihood, KL, annealed objective) on ``objective_ax``, and the validation
    metrics (``val_*``) with the KL annealing weight on ``validation_ax`` beneath, both by
    epoch. Keys an older history lacks are skipped."""
    epochs = [row.get("epoch", i + 1) for i, row in enumerate(history)]
    present = {key for row in history for key in row}
    for ax in (objective_ax, validation_ax):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    objective_ax.set_title("training (per epoch)")
    objective_ax.set_ylabel("nats per example")
    if not history:
        note(objective_ax, "no training history (history.json)")
        objective_ax.set_xlabel("epoch")
        validation_ax.set_axis_off()
        return
    marker = "o" if len(history) <= 30 else None

    def draw(ax: Axes, key: str, label: str, **style: Any) -> None:
        values = [row.get(key, np.nan) for row in history]
        ax.plot(epochs, values, marker=marker, markersize=3, label=label, **style)

    for i, (key, label) in enumerate(OBJECTIVE_KEYS.items()):
        if key in present:  # the objective dashed: it equals the ELBO without annealing
            style = "--" if key == "objective" else "-"
            draw(objective_ax, key, label, color=f"C{i}", linestyle=style)
    objective_ax.tick_params(labelbottom=False)
    objective_ax.legend(**OUTSIDE_RIGHT)
    for i, key in enumerate(sorted(k for k in present if k.startswith("val_"))):
        draw(validation_ax, key, key.removeprefix("val_"), color=f"C{i + 4}")
    if "kl_annealing" in present:
        draw(validation_ax, "kl_annealing", "KL weight", color="grey", linestyle=":")
    validation_ax.set_ylabel("validation metric")
    validation_ax.set_xlabel("epoch")
    validation_ax.legend(**OUTSIDE_RIGHT)


# ----------------------------------------------------------------------------- the run figure
def read_history(path: str | os.PathLike[str]) -> list[dict]:
    """A ``history.json`` (one record per epoch); no records where there is no file. A damaged
    file is an error naming it."""
    if not Path(path).is_file():
        return []
    history = read_json(path, expect=list)
    if not all(isinstance(record, dict) and "epoch" in record for record in history):
        raise DamagedFile(path, "not a history: a list of one object per epoch, with 'epoch'")
    return history


def run_figure(
    probs_in: np.ndarray,
    labels_in: np.ndarray,
    probs_out: dict[str, np.ndarray],
    title: str = "",
    history: Sequence[dict] | None = None,
    given: dict[str, dict[str, np.ndarray]] | None = None,
    ood_score: str = "entropy",
    weights_vary: bool = True,
) -> Figure:
    """A run on one page, a 2 × 3 grid: reliability with the examples per bin beneath,
    predictive entropy and mutual information in vs out of domain (histograms, box plots
    beyond :data:`MAX_OVERLAID` sets; without ``weights_vary``, a point-mass posterior, the
    mutual information is that of the attention samples alone, and its label says so), the OOD
    ROC curves by ``ood_score`` (predictive entropy where the run does not give it),
    risk–coverage, and the training curves of ``history``.
    ``probs_in`` (S, N_in, C) and each of ``probs_out`` (S', N_out, C) are posterior-predictive
    samples; ``given`` (split → score → (N,); ``test`` and ``ood:NAME``) the scores the network
    gives (free energy, feature scores)."""
    probs_out = {k: p for k, p in probs_out.items() if p.shape[1]}
    given = given or {}

    def by_score(name: str) -> tuple[np.ndarray | None, dict[str, np.ndarray | None]]:
        score_in = uncertainty_scores(probs_in, given.get("test")).get(name)
        out = {
            k: uncertainty_scores(p, given.get(ood_split(k))).get(name)
            for k, p in probs_out.items()
        }
        return score_in, out

    roc_in, roc_out = by_score(ood_score)
    if roc_in is None or any(value is None for value in roc_out.values()):  # not given here
        ood_score, (roc_in, roc_out) = "entropy", by_score("entropy")
    many = len(probs_out) > MAX_OVERLAID
    height = max(RUN_FIGSIZE[1], 0.5 * len(probs_out)) if many else RUN_FIGSIZE[1]
    # box plots name each set beside them, as wide as the user's names: a layout engine fits them
    fig = Figure(figsize=(RUN_FIGSIZE[0], height), layout="constrained" if many else None)
    grid = fig.add_gridspec(2, 3, **({} if many else fixed_grid(height, title)))
    calibration = grid[0, 0].subgridspec(2, 1, height_ratios=[3, 1], hspace=0.08)
    reliability_ax = fig.add_subplot(calibration[0])
    counts_ax = fig.add_subplot(calibration[1], sharex=reliability_ax)
    entropy_ax, mi_ax = fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[0, 2])
    roc_ax, risk_ax = fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1])
    training = grid[1, 2].subgridspec(
        2, 2, width_ratios=[1 - LEGEND_COLUMN, LEGEND_COLUMN], wspace=0.0, hspace=0.08
    )
    objective_ax = fig.add_subplot(training[0, 0])
    validation_ax = fig.add_subplot(training[1, 0], sharex=objective_ax)

    mean_in = predictive_mean(probs_in)
    colours = set_colours(list(probs_out))
    reliability_diagram(reliability_ax, mean_in, labels_in, counts_ax=counts_ax)
    entropy_in = predictive_entropy(probs_in)
    entropy_out = {k: predictive_entropy(p) for k, p in probs_out.items()}
    for ax, name, score_in, scores_out in (
        (entropy_ax, score_label("entropy"), entropy_in, entropy_out),
        (
            mi_ax,
            score_label("mutual_information")
            if weights_vary
            else "MI of the attention samples alone (nats)",
            mutual_information(probs_in),
            {k: mutual_information(p) for k, p in probs_out.items()},
        ),
    ):
        if many:
            uncertainty_boxes(ax, score_in, scores_out, name)
        else:
            uncertainty_histograms(ax, score_in, scores_out, name, colours)
    roc_curves(roc_ax, roc_in, roc_out, score_label(ood_score), colours)
    risk_coverage_curve(risk_ax, mean_in, labels_in)
    training_curves(objective_ax, validation_ax, history or [])
    if title:
        fig.suptitle(title, fontsize="x-large")
    return fig


def fixed_grid(height: float, title: str) -> dict[str, float]:
    """The margins and gaps of a run figure of ``height`` inches with ``title`` (its lines
    wrapped) laid out without an engine (:data:`RUN_MARGINS`), as ``add_gridspec`` takes them."""
    width, margin = RUN_FIGSIZE[0], RUN_MARGINS
    top = margin["top"] + margin["title_line"] * (title.count("\n") + 1 if title else 0)
    return {
        "left": margin["left"] / width,
        "right": 1 - margin["right"] / width,
        "bottom": margin["bottom"] / height,
        "top": 1 - top / height,
        **RUN_GAPS,
    }


def save_run_figure(
    path: str | os.PathLike[str],
    probs_in: np.ndarray,
    labels_in: np.ndarray,
    probs_out: dict[str, np.ndarray],
    title: str = "",
    history: Sequence[dict] | None = None,
    given: dict[str, dict[str, np.ndarray]] | None = None,
    ood_score: str = "entropy",
    weights_vary: bool = True,
) -> Path:
    """Write :func:`run_figure` as a PNG, atomically (:func:`probtrans.storage.io.save_png`).
    Returns ``path`` as a :class:`~pathlib.Path`."""
    figure = run_figure(
        probs_in, labels_in, probs_out, title, history, given, ood_score, weights_vary
    )
    return save_png(figure, path)
