"""Tests of probtrans.analysis.report: the terminal tables (the figures: tests/test_figures.py)."""

from __future__ import annotations

import numpy as np
import pytest

from probtrans.analysis import metrics, report


@pytest.fixture
def run_probs() -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    probs_in = rng.dirichlet(np.full(3, 0.3), size=(4, 60))
    labels_in = probs_in.mean(axis=0).argmax(axis=1)
    probs_out = {
        "flat": rng.dirichlet(np.full(3, 3.0), size=(4, 40)),
        "flatter": rng.dirichlet(np.full(3, 9.0), size=(4, 30)),
    }
    return probs_in, labels_in, probs_out


def test_format_ood_table_has_every_set_score_and_measure(run_probs):
    probs_in, labels_in, probs_out = run_probs
    ood = {name: metrics.ood_report(probs_in, p) for name, p in probs_out.items()}
    ood["flat"]["accuracy"], ood["flat"]["nll"], ood["flat"]["ece"] = 0.5, 1.25, 0.125
    ood["flat"]["mcc"] = float("nan")
    ood["flat"]["n"] = 40
    lines = report.format_ood_table(ood).splitlines()
    header = lines[0].split()
    computed = [s.name for s in metrics.UNCERTAINTY_SCORES.entries() if s.function is not None]
    assert header == ["set", "measure", *computed]  # no given score (energy, features) here
    rows = {(line.split()[0], line.split()[1]): line.split()[2:] for line in lines[1:7]}
    for name in probs_out:
        for measure in ("auroc", "aupr", "fpr95"):
            expected = [f"{ood[name][s][measure]:.4f}" for s in header[2:]]
            assert rows[name, measure] == expected
    shifted = "accuracy 0.5000, MCC –, NLL 1.2500, ECE 0.1250"  # the shifted metrics, in order
    assert lines[-1] == f"flat (labelled, n = 40): {shifted}"


def test_format_table_contains_every_key():
    values = {"accuracy": 0.91234567, "ece": 0.0321, "brier": 1.0}
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


def test_run_table_puts_every_predictive_side_by_side():
    scores = {
        "accuracy": 0.9,
        "nll": 0.3,
        "ts_nll": 0.25,
        "mc_dropout.accuracy": 0.91,
        "mc_dropout.nll": 0.28,
        "laplace.accuracy": 0.9,
        "laplace.nll": 0.27,
        "best_epoch": 7,
        "epochs": 10,
        "posterior_samples": 10,
    }
    lines = report.format_run_table(scores, ["accuracy", "nll"]).splitlines()
    assert lines[0].split() == ["metric", "plain", "temperature-scaled", "laplace", "mc_dropout"]
    assert lines[1].split() == ["accuracy", "0.9000", "–", "0.9000", "0.9100"]
    assert lines[2].split() == ["nll", "0.3000", "0.2500", "0.2700", "0.2800"]
    assert lines[3] == "weights of epoch 7 of 10 (best validation), 10 posterior samples"
