"""Smoke test of the corrections curve command on a tiny segmentation spec, and its errors."""

from __future__ import annotations

import json
import math

import pytest
import torch

from probtrans.cli import main
from probtrans.errors import ConfigError
from probtrans.segmentation import load_segmentation_spec
from probtrans.segmentation.corrections import annotator_order

TINY = """
seed = 1

[data]
noise_std = 0.2
n_test = 12

[model]
d_model = 16
n_heads = 2
n_layers = 1
d_ff = 16
d_key = 4

[model.labeller]
alpha = 0.5
beta = 2.0
prior = "uniform"
n_iter = 2

[train]
steps = 4
batch_size = 8
max_corrections = 3

[corrections]
ks = [0, 5]
n_test = 10
theta_mu = 0.1
theta_pi = 1.0
"""


@pytest.fixture
def tiny_spec(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


def test_corrections_command_writes_finite_curve_and_reloads(tiny_spec, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["corrections", str(tiny_spec), "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "with propagation" in table and "10 test images" in table
    result = json.loads((out / "corrections.json").read_text())
    assert [row["k"] for row in result["rows"]] == [0, 5]
    for row in result["rows"]:
        for key in ("accuracy", "accuracy_without_propagation", "gain"):
            assert math.isfinite(row[key]) and -1 <= row[key] <= 1
    assert result["rows"][0]["gain"] == 0.0  # k = 0: nothing to propagate
    assert result["n_test"] == 10 and not result["model_reloaded"]
    assert (out / "corrections.png").read_bytes().startswith(b"\x89PNG")
    args = ["corrections", str(tiny_spec), "--out", str(out), "--ks", "0,1", "--n-test", "4"]
    assert main(args) == 0
    again = json.loads((out / "corrections.json").read_text())
    assert again["model_reloaded"] and again["n_test"] == 4
    assert sorted(p.name for p in out.iterdir()) == [
        "corrections.json",
        "corrections.png",
        "model.pt",
    ]


@pytest.mark.parametrize(
    ("edit", "args", "message"),
    [
        ("[train]\nsteps = 4\nepochs = 3\n", [], "unknown key 'train.epochs'"),
        ("[corrections]\ntheta_mu = 0.0\n", [], "corrections.theta_mu = 0.0: must be > 0"),
        ("[model.labeller]\nkind = 'softmax'\n", [], "model.labeller.kind = 'softmax'"),
        ("[model.labeller]\nbeta = -2.0\n", [], "model.labeller.beta = -2.0: must be > 0"),
        ("", ["--ks", "0,x"], "--ks = '0,x'"),
        ("", ["--ks", "0,64"], "--ks = [0, 64]"),
        ("", ["--n-test", "9999"], "--n-test = 9999"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, capsys, edit, args, message):
    path = tmp_path / "bad.toml"
    path.write_text(edit)
    assert main(["corrections", str(path), "--out", str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_missing_spec_file_is_reported(tmp_path, capsys):
    assert main(["corrections", str(tmp_path / "nope.toml")]) == 2
    assert "nope.toml: no such file" in capsys.readouterr().err


def test_default_spec_loads():
    spec = load_segmentation_spec("models/digits_segmentation/gaussian_mixture.toml")
    assert spec.corrections.ks == [0, 1, 2, 5, 10, 20] and spec.corrections.n_test >= 100
    with pytest.raises(ConfigError):
        load_segmentation_spec("models/digits_segmentation/missing.toml")


def test_error_annotator_fixes_wrong_pixels_first():
    labels = torch.tensor([[0, 1, 1, 0, 1]])
    predictions = torch.tensor([[1, 1, 0, 0, 1]])  # pixels 0 and 2 are wrong
    order = annotator_order(predictions, labels, "errors", torch.Generator().manual_seed(0))
    assert sorted(order[0, :2].tolist()) == [0, 2] and sorted(order[0].tolist()) == list(range(5))
