"""Tests of probtrans.analysis.figures: each panel draws what it claims, the run figure and the
comparison figure have their panels at a fixed size."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from matplotlib.figure import Figure

from probtrans.analysis import comparison_figure, figures, metrics
from probtrans.analysis.summary import summarise

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
OLD_HISTORY = [
    {"epoch": e, "elbo": -2.0 + 0.1 * e, "kl_annealing": min(1.0, e / 2), "val_accuracy": 0.5,
     "val_nll": 1.0 / e}
    for e in (1, 2, 3)
]  # fmt: skip
NEW_HISTORY = [
    row | {"expected_log_likelihood": row["elbo"] + 0.5, "kl": 0.5, "objective": row["elbo"]}
    for row in OLD_HISTORY
]


@pytest.fixture
def run_probs() -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    probs_in = rng.dirichlet(np.full(3, 0.3), size=(4, 60))
    labels_in = probs_in.mean(axis=0).argmax(axis=1)
    labels_in[:12] = (labels_in[:12] + 1) % 3  # some errors
    probs_out = {
        "flat": rng.dirichlet(np.full(3, 3.0), size=(4, 40)),
        "flatter": rng.dirichlet(np.full(3, 9.0), size=(4, 30)),
    }
    return probs_in, labels_in, probs_out


def legend(ax) -> list[str]:
    """The texts of the legend of ``ax`` (none without one)."""
    shown = ax.get_legend()
    return [] if shown is None else [text.get_text() for text in shown.get_texts()]


def test_reliability_histogram_counts_the_examples_of_each_bin(run_probs):
    probs_in, labels_in, _ = run_probs
    mean = probs_in.mean(axis=0)
    ax, counts_ax = Figure().subplots(2, 1, sharex=True)
    figures.reliability_diagram(ax, mean, labels_in, n_bins=10, counts_ax=counts_ax)
    bins = metrics.calibration_bins(mean, labels_in, 10)
    filled = bins["count"] > 0
    (counts,) = counts_ax.containers
    assert [p.get_height() for p in counts] == bins["count"][filled].tolist()
    accuracy = ax.containers[0]
    assert np.allclose([p.get_height() for p in accuracy], bins["accuracy"][filled])
    assert ax.get_xlim() == pytest.approx((1 / 3, 1.0))
    assert counts_ax.get_xlim() == pytest.approx((1 / 3, 1.0))
    assert counts_ax.get_yscale() == "log" and counts_ax.get_xlabel() and ax.get_ylabel()
    gaps = np.abs(bins["accuracy"] - bins["confidence"])[filled]
    worst = int(bins["count"][filled][np.argmax(gaps)])
    title = ax.get_title()
    assert f"ECE {metrics.ece(mean, labels_in, 10):.4f}" in title
    assert f"MCE {metrics.mce(mean, labels_in, 10):.4f} (a bin of {worst}/60)" in title


def test_reliability_axis_of_a_two_class_task_starts_at_one_half():
    mean = np.array([[0.9, 0.1], [0.4, 0.6], [0.5, 0.5], [0.2, 0.8]])
    ax = Figure().subplots()
    figures.reliability_diagram(ax, mean, np.array([0, 1, 1, 0]), label="model")
    assert ax.get_xlim() == (0.5, 1.0)
    assert ax.get_title().startswith("model: ECE") and ax.get_xlabel()


def test_uncertainty_histograms_name_each_set_with_its_auroc():
    ax = Figure().subplots()
    scores_out = {"far": np.array([0.5, 0.9]), "near": np.array([0.15, 0.25])}
    figures.uncertainty_histograms(ax, np.array([0.1, 0.2, 0.3]), scores_out, name="MI")
    assert legend(ax) == ["in-domain test", "far (AUROC 1.000)", "near (AUROC 0.500)"]
    assert ax.get_xlabel() == "MI" and ax.get_ylabel() == "density"
    empty = Figure().subplots()
    figures.uncertainty_histograms(empty, np.array([0.1, 0.2]), {})
    assert empty.get_title() == "no out-of-domain examples"
    for noise in (0.0, 1e-16):  # a deterministic predictive's MI: zero, to rounding
        constant = Figure().subplots()
        rounding = noise * np.random.default_rng(0).standard_normal(5)
        figures.uncertainty_histograms(constant, rounding[:3], {"far": rounding[3:]}, name="MI")
        assert any("MI = 0 for every example" in t.get_text() for t in constant.texts)
        assert not constant.patches and constant.get_legend() is None  # nothing drawn


def test_roc_legend_gives_the_auroc_of_ood_detection(run_probs):
    probs_in, _, probs_out = run_probs
    score_in = metrics.predictive_entropy(probs_in)
    scores_out = {k: metrics.predictive_entropy(p) for k, p in probs_out.items()}
    ax = Figure().subplots()
    figures.roc_curves(ax, score_in, scores_out)
    expected = [
        f"{k} (AUROC {metrics.ood_detection(score_in, v)['auroc']:.3f})"
        for k, v in scores_out.items()
    ]
    assert legend(ax) == ["chance (AUROC 0.5)", *expected]
    curves = [line for line in ax.lines if line.get_label() in expected]
    for line, name in zip(curves, scores_out, strict=True):  # the area under each drawn curve
        area = np.trapezoid(line.get_ydata(), line.get_xdata())
        assert area == pytest.approx(metrics.ood_detection(score_in, scores_out[name])["auroc"])
    assert ax.get_xlabel() and ax.get_ylabel()


def test_roc_of_many_sets_names_the_best_and_the_worst(run_probs):
    probs_in, _, probs_out = run_probs
    score_in = metrics.predictive_entropy(probs_in)
    flat = metrics.predictive_entropy(probs_out["flat"])
    many = {f"set{i}": flat[: 10 + 3 * i] for i in range(figures.MAX_OVERLAID + 2)}
    ax = Figure().subplots()
    figures.roc_curves(ax, score_in, many)
    assert len(ax.lines) == 1 + len(many)
    assert len(legend(ax)) == 3  # chance, best, worst


def test_risk_coverage_curve_and_its_aurc(run_probs):
    probs_in, labels_in, _ = run_probs
    mean = probs_in.mean(axis=0)
    ax = Figure().subplots()
    figures.risk_coverage_curve(ax, mean, labels_in)
    coverage, risk = metrics.risk_coverage(mean, labels_in)
    curve, oracle = ax.lines
    assert np.array_equal(curve.get_xdata(), coverage) and np.array_equal(curve.get_ydata(), risk)
    assert legend(ax)[0] == f"AURC {metrics.aurc(mean, labels_in):.4f}"
    assert oracle.get_ydata().mean() <= risk.mean()  # no ranking does better than the oracle
    assert ax.get_xlabel() and ax.get_ylabel()


@pytest.mark.parametrize(
    ("history", "objective"),
    [
        (OLD_HISTORY, ["ELBO"]),
        (
            NEW_HISTORY,
            [
                "ELBO",
                "expected log-likelihood",
                "KL(q ‖ p) (MAP: −log p(W))",
                "objective (KL annealed)",
            ],
        ),
    ],
)
def test_training_curves_draw_the_keys_a_history_has(history, objective):
    objective_ax, validation_ax = Figure().subplots(2, 1)
    figures.training_curves(objective_ax, validation_ax, history)
    assert legend(objective_ax) == objective
    assert legend(validation_ax) == ["accuracy", "nll", "KL weight"]
    assert list(objective_ax.lines[0].get_xdata()) == [1, 2, 3]
    assert validation_ax.get_xlabel() == "epoch" and objective_ax.get_ylabel()


@pytest.mark.parametrize("history", [None, OLD_HISTORY, NEW_HISTORY])
@pytest.mark.parametrize("with_ood", [True, False])
def test_run_figure_has_every_panel_with_or_without_ood_sets(run_probs, history, with_ood):
    probs_in, labels_in, probs_out = run_probs
    fig = figures.run_figure(
        probs_in, labels_in, probs_out if with_ood else {}, title="t", history=history
    )
    assert len(fig.axes) == 8  # reliability + counts, entropy, MI, ROC, risk, objective + val
    assert tuple(fig.get_size_inches()) == figures.RUN_FIGSIZE
    for ax in fig.axes:
        assert ax.get_ylabel() or not ax.axison
    entropy_ax, mi_ax = fig.axes[2], fig.axes[3]
    assert entropy_ax.get_xlabel() == "predictive entropy (nats)"
    assert mi_ax.get_xlabel() == "mutual information (nats)"
    assert len(legend(entropy_ax)) == 1 + 2 * with_ood


@pytest.mark.parametrize("title_lines", [1, 3])
def test_the_fixed_layout_keeps_every_panel_its_labels_and_legends_apart_and_on_the_page(
    run_probs, title_lines
):
    """The run figure is laid out without an engine: drawn, each panel with its title, tick
    labels and legends (the training ones beside it) stays inside the page and off the others,
    and the title above them all."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    probs_in, labels_in, probs_out = run_probs
    probs_out = {f"a data set named at length {i}": p for i, p in enumerate(probs_out.values())}
    title = "\n".join(["title " * 20] * title_lines)
    fig = figures.run_figure(probs_in, labels_in, probs_out, title=title, history=NEW_HISTORY)
    assert fig.get_layout_engine() is None
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    page = fig.bbox.padded(1.0)
    boxes = [ax.get_tightbbox(renderer) for ax in fig.axes]
    for i, box in enumerate(boxes):
        assert box.x0 >= page.x0 and box.x1 <= page.x1, (i, box, page)
        assert box.y0 >= page.y0 and box.y1 <= page.y1, (i, box, page)
    for i, first in enumerate(boxes):
        for j in range(i + 1, len(boxes)):
            second = boxes[j]
            overlap_x = min(first.x1, second.x1) - max(first.x0, second.x0)
            overlap_y = min(first.y1, second.y1) - max(first.y0, second.y0)
            assert min(overlap_x, overlap_y) <= 1.0, (i, j, first, second)  # pixels
    (heading,) = (text.get_window_extent(renderer) for text in fig.texts)  # the suptitle
    assert heading.y0 >= max(box.y1 for box in boxes) and heading.y1 <= page.y1


def test_the_run_figure_draws_the_roc_of_the_recommended_score_where_the_run_gives_it(run_probs):
    """The ROC panel follows ``ood_score`` (here a feature score the run gives, with its AUROC in
    the legend), and falls back to predictive entropy where the run does not give that score."""
    probs_in, labels_in, probs_out = run_probs
    rng = np.random.default_rng(1)
    given = {"test": {"mahalanobis": rng.normal(0, 1, 60)}}
    given |= {
        f"ood:{k}": {"mahalanobis": rng.normal(3, 1, p.shape[1])} for k, p in probs_out.items()
    }
    fig = figures.run_figure(probs_in, labels_in, probs_out, given=given, ood_score="mahalanobis")
    roc_ax = fig.axes[4]
    assert roc_ax.get_title() == "OOD detection ROC by Mahalanobis distance"
    auroc = metrics.ood_detection(given["test"]["mahalanobis"], given["ood:flat"]["mahalanobis"])
    assert f"flat (AUROC {auroc['auroc']:.3f})" in legend(roc_ax)
    fallback = figures.run_figure(probs_in, labels_in, probs_out, ood_score="mahalanobis")
    assert fallback.axes[4].get_title() == "OOD detection ROC by predictive entropy"


def test_save_run_figure_writes_png_atomically(tmp_path, run_probs):
    target = tmp_path / "figures" / "run.png"
    result = figures.save_run_figure(target, *run_probs, title="digits", history=OLD_HISTORY)
    assert result == target
    assert target.read_bytes().startswith(PNG_SIGNATURE)
    assert [p.name for p in (tmp_path / "figures").iterdir()] == ["run.png"]
    target.write_bytes(b"old")
    figures.save_run_figure(str(target), *run_probs)
    assert target.read_bytes().startswith(PNG_SIGNATURE)
    assert [p.name for p in (tmp_path / "figures").iterdir()] == ["run.png"]


def test_many_sets_are_shown_as_box_plots_with_their_auroc(run_probs):
    probs_in, labels_in, probs_out = run_probs
    many = {f"set{i}": probs_out["flat"] for i in range(figures.MAX_OVERLAID + 2)}
    fig = figures.run_figure(probs_in, labels_in, many)
    entropy_ax = fig.axes[2]
    entropy_in = metrics.predictive_entropy(probs_in)
    auroc = metrics.ood_detection(entropy_in, metrics.predictive_entropy(many["set0"]))["auroc"]
    ticks = [t.get_text() for t in entropy_ax.get_yticklabels()]
    assert ticks[0] == "in-domain test" and ticks[1] == f"set0 ({auroc:.3f})"
    assert len(ticks) == 1 + len(many)


def test_read_history_of_a_folder_without_one(tmp_path):
    assert figures.read_history(tmp_path / "history.json") == []


def test_run_title_says_what_the_run_is_and_what_its_draws_are():
    draws = figures.draws_in_words(weights_vary=False, local=True)
    title = figures.run_title("digits", "h_sto attention", "MAP (point mass)", 10, draws)
    assert title.replace("\n", " ") == (
        "digits · h_sto attention · guide: MAP (point mass) · S = 10 attention samples under a "
        "point-mass posterior"
    )
    assert max(len(line) for line in title.splitlines()) <= figures.TITLE_WIDTH
    assert figures.draws_in_words(True, False) == "posterior draws of the weights"
    assert "attention sampled" in figures.draws_in_words(True, True)


def test_a_point_mass_runs_mutual_information_is_labelled_as_attention_sampling():
    """Under a point-mass posterior the spread of the S draws is attention sampling (aleatoric,
    per input), not posterior uncertainty: the panel says so."""
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(3), size=(4, 20))  # (S, N, C)
    labels = rng.integers(0, 3, 20)

    def mi_label(weights_vary: bool) -> str:
        figure = figures.run_figure(probs, labels, {"ood": probs}, weights_vary=weights_vary)
        names = [ax.get_xlabel() for ax in figure.axes]
        return [name for name in names if "mutual" in name or "MI " in name][0]

    assert mi_label(True) == "mutual information (nats)"
    assert mi_label(False) == "MI of the attention samples alone (nats)"


@dataclass
class Predictive:
    probs: dict[str, np.ndarray]
    labels: dict[str, np.ndarray]
    given: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)


def predictive(seed: int, concentration: float) -> Predictive:
    rng = np.random.default_rng(seed)
    probs = {
        split: rng.dirichlet(np.full(2, concentration), size=(3, n))
        for split, n in (("val", 40), ("test", 50), ("ood:far", 30), ("ood:near", 20))
    }
    labels = {split: p.mean(axis=0).argmax(axis=1) for split, p in probs.items()}
    labels["test"][:10] = 1 - labels["test"][:10]
    labels["val"][:8] = 1 - labels["val"][:8]
    labels["ood:far"] = np.full(30, -1)
    return Predictive(probs, labels)


def methods(n: int) -> dict[str, list[Predictive]]:
    return {
        f"method {i}": [predictive(10 * i + s, 0.5 + 0.2 * i) for s in range(2)] for i in range(n)
    }


@pytest.mark.parametrize("n_methods", [2, 11])
def test_comparison_figure_overlays_every_method_at_a_fixed_size(tmp_path, n_methods):
    compared = methods(n_methods)
    fig = comparison_figure.comparison_figure("tiny", compared, "accuracy", "entropy")
    assert tuple(fig.get_size_inches()) == comparison_figure.COMPARISON_FIGSIZE
    curves, scores = fig.subfigs
    reliability_ax, risk_ax, roc_ax = curves.axes
    names = list(compared)
    for ax in (reliability_ax, risk_ax, roc_ax):
        assert [line.get_label() for line in ax.lines if line.get_label() in names] == names
        assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()
    assert reliability_ax.get_xlim() == (0.5, 1.0)
    assert roc_ax.get_title() == "OOD ROC: far by entropy (first of 2 sets)"
    assert [a.get_title().replace("\n", " ") for a in scores.axes] == [
        "ID accuracy ↑",
        "NLL ↓",
        "Brier ↓",
        "ECE ↓",
        "MCE ↓",
        "AURC ↓",
        "test ELPD ↑ (bar: ± 2 SE)",
        "far AUROC by entropy ↑",
    ]
    assert [a.get_xlabel() for a in scores.axes[1:3]] == ["NLL (nats)", "Brier (%)"]
    assert all(a.get_xlabel() for a in scores.axes)
    nll_ax = scores.axes[1]
    for i, predictives in enumerate(compared.values()):  # mean ± std over seeds
        values = [summarise(p.probs, p.labels)["nll"] for p in predictives]
        point, _, (bar,) = nll_ax.containers[i]
        (x,), (y,) = point.get_xdata(), point.get_ydata()
        assert (x, y) == (pytest.approx(np.mean(values)), i)
        (segment,) = bar.get_segments()
        assert segment[1, 0] - segment[0, 0] == pytest.approx(2 * np.std(values, ddof=1))
    elpd_ax = scores.axes[6]
    for i, predictives in enumerate(compared.values()):  # ± 2 SE of a run's estimate
        errors = [summarise(p.probs, p.labels)["test_elpd_se"] for p in predictives]
        (segment,) = elpd_ax.containers[i][2][0].get_segments()
        assert segment[1, 0] - segment[0, 0] == pytest.approx(4 * np.mean(errors))
    assert "bins of < 10 left out" in reliability_ax.get_title()
    assert [t.get_text() for t in scores.axes[0].get_yticklabels()] == names
    assert [t.get_text() for t in curves.legends[0].get_texts()] == names
    if n_methods > 10:  # the legend outside and 11 names fit
        figures.save_png(fig, tmp_path / "compare.png")
        assert (tmp_path / "compare.png").read_bytes().startswith(PNG_SIGNATURE)


def test_comparison_figure_without_ood_sets():
    compared = {
        name: [Predictive({k: v for k, v in p.probs.items() if k in ("val", "test")}, p.labels)]
        for name, (p, _) in methods(2).items()
    }
    fig = comparison_figure.comparison_figure("no ood", compared)
    curves, scores = fig.subfigs
    assert curves.axes[2].get_title() == "OOD detection: no out-of-domain sets"
    assert len(scores.axes) == 7  # no AUROC panel
