"""A post-hoc predictive added by a plugin: one module with a ``PosthocPredictive`` class and
one registration call (here the plain predictive mixed with the uniform distribution, its
weight fitted on the validation NLL) is a name ``[predictive] posthoc`` accepts, is evaluated
beside the plain predictive into ``metrics.json`` and the run table, and is a variant
``compare`` reads. Afterwards the name is unknown again."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from probtrans.cli import main
from probtrans.errors import ConfigError
from probtrans.resolve import load_inference_spec
from probtrans.specs.inference import POSTHOC
from tests.conftest import TINY_TRAIN, inference_file, plugin_imported

PLUGIN = '''
"""A toy plugin: p_ε = (1 − ε) p + ε / C, with ε of lowest validation NLL."""

import numpy as np

from probtrans.inference.posthoc import PosthocPredictive, register_posthoc
from probtrans.analysis.metrics import nll

GRID = (0.0, 0.01, 0.05, 0.1, 0.2)


def mixed(probs, epsilon):
    return (1 - epsilon) * probs + epsilon / probs.shape[-1]


@register_posthoc
class UniformMixture(PosthocPredictive):
    name = "uniform_mixture"

    def fit(self, context):
        probs = context.plain["val"]["probs"]
        labels = context.data.val.labels.numpy()
        self.epsilon = min(GRID, key=lambda e: nll(mixed(probs, e).mean(0), labels))

    def predict(self, context, split):
        return {"probs": mixed(context.plain[split]["probs"], self.epsilon)}
'''


@pytest.fixture
def plugin(tmp_path):
    """The plugin module imported (its one registration), forgotten after the test."""
    with plugin_imported(tmp_path, "mixture_plugin", PLUGIN, POSTHOC):
        yield


@pytest.fixture
def inference(tmp_path):
    text = '[guide]\nname = "delta"\n' + TINY_TRAIN + 'posthoc = ["uniform_mixture"]\n'
    return inference_file(tmp_path, "map.toml", text)


def test_a_plugin_posthoc_predictive_is_evaluated_and_compared(
    plugin, inference, tmp_path, tiny_model_file, capsys
):
    from probtrans.runs.kept import read_probs

    out = tmp_path / "compare"
    preset = tmp_path / "preset.toml"
    methods = "".join(
        f'[[method]]\nname = "{name}"\nmodel = "{tiny_model_file}"\n'
        f'inference = "{inference}"\nvariant = "{variant}"\n\n'
        for name, variant in (("MAP", "plain"), ("MAP + mixture", "uniform_mixture"))
    )
    preset.write_text(f"title = 'plugin'\nepochs = 1\n\n{methods}")
    assert main(["compare", "--preset", str(preset), "--out", str(out), "--quiet"]) == 0
    (run,) = (out / "runs").iterdir()
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["uniform_mixture.nll"] <= metrics["nll"] + 1e-9  # ε = 0 is on the grid
    kept = read_probs(run / "probs.npz").probs
    plain, mixed = kept["plain"]["test"], kept["uniform_mixture"]["test"]
    epsilon = (mixed - plain)[..., 0] / (1 / plain.shape[-1] - plain[..., 0])
    assert np.allclose(epsilon[np.isfinite(epsilon)], epsilon.flat[0])  # one ε for every row
    rows = {row["method"]: row for row in csv.DictReader((out / "table.csv").open())}
    assert rows["MAP + mixture"]["nll"] == f"{metrics['uniform_mixture.nll']:.2f}"

    capsys.readouterr()
    assert main(["evaluate", str(run), "--quiet"]) == 0
    assert "uniform_mixture" in capsys.readouterr().out  # the run table's column


def test_an_unregistered_posthoc_name_is_refused_naming_the_field(inference):
    with pytest.raises(ConfigError, match=r"predictive\.posthoc\[0\] = 'uniform_mixture': unknown"):
        load_inference_spec(inference)
