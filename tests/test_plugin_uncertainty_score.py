"""An uncertainty score added by a plugin: one function and one ``register_score`` call (here
one minus the margin between the two most probable classes) is reported for every
out-of-domain set in ``metrics.json``, heads compare's out-of-domain columns with
``--ood-score`` and is written as a column of ``predict``."""

from __future__ import annotations

import csv

import numpy as np
import pytest

import probtrans
from probtrans.analysis.metrics import UNCERTAINTY_SCORES, ood_detection
from probtrans.cli import main
from probtrans.errors import ConfigError
from probtrans.runs import Run
from probtrans.runs.compare import cross_product, run_dir
from probtrans.runs.kept import read_probs
from tests.conftest import plugin_imported, tiny_inference

PLUGIN = '''
"""A toy plugin: one minus the top-2 margin of the mean prediction."""

import numpy as np

from probtrans.analysis.metrics import Score, register_score


def one_minus_margin(probs):
    top2 = np.sort(probs.mean(axis=0), axis=1)[:, -2:]
    return 1.0 - (top2[:, 1] - top2[:, 0])


register_score(
    Score(name="one_minus_margin", function=one_minus_margin, label="1 − top-2 margin", column=True)
)
'''


def test_a_plugin_score_is_reported_compared_and_predicted(tmp_path, tiny_model_file, capsys):
    inference = tiny_inference(tmp_path, "map")
    out = tmp_path / "compare"
    comparison = cross_product([str(tiny_model_file)], [str(inference)], [0])
    run_folder = run_dir(out, comparison.method[0], 0)  # fitted here, reused by compare
    with plugin_imported(tmp_path, "margin_plugin", PLUGIN, UNCERTAINTY_SCORES) as plugin:
        run = probtrans.fit(tiny_model_file, inference, out=run_folder, epochs=1)
        plain = read_probs(run.path / "probs.npz").probs["plain"]
        expected = ood_detection(
            plugin.one_minus_margin(plain["test"]), plugin.one_minus_margin(plain["ood:digits_8_9"])
        )
        report = run.metrics["ood"]["digits_8_9"]["one_minus_margin"]
        assert report["auroc"] == pytest.approx(expected["auroc"])
        assert report["aupr"] == pytest.approx(expected["aupr"])

        argv = ["compare", str(tiny_model_file), "--inference", str(inference), "--out", str(out)]
        assert main([*argv, "--epochs", "1", "--ood-score", "one_minus_margin", "--quiet"]) == 0
        (compared,) = csv.DictReader((out / "table.csv").open())
        auroc = next(value for key, value in compared.items() if "AUROC" in key)
        assert auroc == f"{100 * report['auroc']:.2f}"

        columns = Run.load(run.path).predict(run.data.test, samples=4)
    margin = columns["one_minus_margin"]
    assert margin.shape == (len(run.data.test),) and np.all((0.0 <= margin) & (margin <= 1.0))


def test_without_the_plugin_its_name_is_refused(tmp_path, tiny_model_file):
    text = tiny_inference(tmp_path, "map").read_text()
    inference = tmp_path / "scored.toml"
    inference.write_text(
        text.replace("[predictive]", '[predictive]\nood_score = "one_minus_margin"')
    )
    with pytest.raises(ConfigError, match="one_minus_margin"):
        probtrans.fit(tiny_model_file, inference, out=tmp_path / "run", epochs=1)
