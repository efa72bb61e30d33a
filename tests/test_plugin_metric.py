"""A metric added by a plugin: one registration call in a module of its own (here the top-2
accuracy) puts it in ``metrics.json``, in the table ``probtrans evaluate`` prints, in the compare
table (CSV) and in the comparison figure."""

from __future__ import annotations

import csv
import json

import pytest

import probtrans
from probtrans.analysis.metrics import METRICS
from probtrans.cli import main
from probtrans.runs.compare import cross_product, figure, method_folders, method_instances, run_dir
from tests.conftest import plugin_imported, tiny_inference

PLUGIN = '''
"""A toy plugin: the top-2 accuracy."""

import numpy as np

from probtrans.analysis.metrics import Metric, of_mean, register_metric


def top2_accuracy(mean_probs, labels):
    """The share of examples whose label is one of the two most probable classes."""
    top2 = np.argsort(mean_probs, axis=1)[:, -2:]
    return float(np.mean((top2 == labels[:, None]).any(axis=1)))


register_metric(Metric(name="top2_accuracy", function=of_mean(top2_accuracy),
    higher_is_better=True, label="top-2 accuracy", headline=True, compared=True))
'''


@pytest.fixture
def plugin(tmp_path):
    """The plugin module imported (its one registration), forgotten after the test."""
    with plugin_imported(tmp_path, "top2_plugin", PLUGIN, METRICS):
        yield


def test_a_plugin_metric_is_in_metrics_json_the_tables_and_the_figure(
    plugin, tmp_path, tiny_model_file, capsys
):
    inference = tiny_inference(tmp_path, "map")
    out = tmp_path / "compare"
    comparison = cross_product([str(tiny_model_file)], [str(inference)], [0])
    run = run_dir(out, comparison.method[0], 0)  # fitted here, reused by compare
    probtrans.fit(tiny_model_file, inference, out=run, epochs=1, progress=False)
    written = json.loads((run / "metrics.json").read_text())
    assert 0.0 <= written["top2_accuracy"] <= 1.0
    keys = list(written)
    assert keys.index("top2_accuracy") == keys.index("disagreement") + 1  # registered last

    capsys.readouterr()
    assert main(["evaluate", str(run), "--quiet"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    (row,) = [row for row in rows if row and row[0] == "top2_accuracy"]
    assert row[1] == f"{written['top2_accuracy']:.4f}"

    argv = ["compare", str(tiny_model_file), "--inference", str(inference), "--out", str(out)]
    assert main([*argv, "--epochs", "1", "--quiet"]) == 0
    assert "fit " not in capsys.readouterr().out  # the run above was reused
    (compared,) = csv.DictReader((out / "table.csv").open())
    assert compared["top2_accuracy"] == f"{100 * written['top2_accuracy']:.2f}"
    timing = json.loads((run / "timing.json").read_text())  # training and evaluation apart
    assert compared["train s"] == f"{timing['train_seconds']:.0f}"
    assert compared["eval s"] == f"{timing['evaluate_seconds']:.0f}"

    methods = method_instances(comparison, method_folders(comparison, out))
    _, scores = figure(comparison, methods).subfigs
    titles = [ax.get_title() for ax in scores.axes]
    assert "top-2 accuracy ↑" in titles
    assert scores.axes[titles.index("top-2 accuracy ↑")].get_xlabel() == "top-2 accuracy (%)"


def test_the_plugin_metric_is_forgotten_after_its_test():
    assert "top2_accuracy" not in METRICS
