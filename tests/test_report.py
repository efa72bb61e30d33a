"""Tests of probtrans.report: the run figure and the terminal table."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.figure import Figure

from probtrans import metrics, report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def run_probs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    probs_in = rng.dirichlet(np.full(3, 0.3), size=(4, 60))
    labels_in = probs_in.mean(axis=0).argmax(axis=1)
    probs_out = rng.dirichlet(np.full(3, 3.0), size=(4, 40))
    return probs_in, labels_in, probs_out


def test_save_run_figure_writes_png_atomically(tmp_path, run_probs):
    target = tmp_path / "figures" / "run.png"
    result = report.save_run_figure(target, *run_probs, title="digits / mean-field")
    assert result == target
    data = target.read_bytes()
    assert len(data) > 1000
    assert data.startswith(PNG_SIGNATURE)
    assert [p.name for p in (tmp_path / "figures").iterdir()] == ["run.png"]


def test_save_run_figure_replaces_existing_file(tmp_path, run_probs):
    target = tmp_path / "run.png"
    target.write_bytes(b"old")
    report.save_run_figure(str(target), *run_probs)
    assert target.read_bytes().startswith(PNG_SIGNATURE)
    assert [p.name for p in tmp_path.iterdir()] == ["run.png"]


def test_reliability_diagram_shows_ece(run_probs):
    probs_in, labels_in, _ = run_probs
    mean = probs_in.mean(axis=0)
    ax = Figure().subplots()
    report.reliability_diagram(ax, mean, labels_in, n_bins=10, label="model")
    expected = f"model (ECE = {metrics.ece(mean, labels_in, 10):.4f})"
    assert expected in [text.get_text() for text in ax.get_legend().get_texts()]
    filled = int((metrics.calibration_bins(mean, labels_in, 10)["count"] > 0).sum())
    assert len(ax.patches) == filled


def test_uncertainty_histograms_title_has_auroc():
    ax = Figure().subplots()
    report.uncertainty_histograms(ax, np.array([0.1, 0.2, 0.3]), np.array([0.5, 0.9]), name="MI")
    assert ax.get_title() == "OOD AUROC = 1.0000"
    assert ax.get_xlabel() == "MI"


def test_format_table_contains_every_key():
    values = {"accuracy": 0.91234567, "ece": 0.0321, "ood_auroc": 1.0}
    table = report.format_table(values)
    lines = table.splitlines()
    assert len(lines) == 4  # header + one row per metric
    for key, value in values.items():
        assert any(line.split() == [key, f"{value:.4f}"] for line in lines)
    assert len({len(line) for line in lines}) == 1  # columns aligned


def test_format_table_selects_keys_and_rejects_unknown():
    values = {"accuracy": 0.5, "nll": 0.25}
    table = report.format_table(values, keys=["nll"])
    assert "nll" in table
    assert "accuracy" not in table
    with pytest.raises(ValueError, match="keys not in metrics: brier"):
        report.format_table(values, keys=["brier"])
