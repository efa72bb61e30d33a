"""``benchmarks/sgpa_paths.py`` on a tiny trained SGPA run: the fast decoupled conditional and
the float64 reference give the same predictive on the same weights and draws."""

from __future__ import annotations

import re

import pytest

from benchmarks.sgpa_paths import main
from probtrans.runs import fit
from tests.conftest import TINY_MODEL, inference_file, tiny_inference

TINY_SGPA = TINY_MODEL.replace(
    'kind = "h_sto"\ntau1 = 1.0\ntau2 = 2.0\nn_centroids = 3',
    'kind = "sgpa"\nn_inducing = 4',
)


def test_both_paths_give_the_same_predictive_of_a_trained_run(tmp_path, capsys):
    model = inference_file(tmp_path, "tiny_sgpa.toml", TINY_SGPA)
    out = tmp_path / "run"
    fit(model, tiny_inference(tmp_path, "sgpa"), out=out, progress=False)
    main([str(out), "--examples", "40", "--samples", "3"])
    printed = capsys.readouterr().out
    accuracies = re.findall(r"accuracy (\d+\.\d\d) %", printed)
    assert len(accuracies) == 2 and accuracies[0] == accuracies[1], printed
    gap = float(re.search(r"max \|p_fast − p_float64\| (\S+) \(per draw\)", printed).group(1))
    assert gap < 1e-5, printed


def test_a_run_without_sgpa_layers_is_refused(tiny_run, capsys):
    with pytest.raises(SystemExit) as stop:
        main([str(tiny_run)])
    assert stop.value.code == 2
    assert "has no decoupled SGPA layer" in capsys.readouterr().err
