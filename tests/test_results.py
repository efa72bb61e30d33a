"""``metrics.json`` read into values and written back (probtrans.analysis.results): each
predictive's metrics apart, the run's keys apart, and the file the same after a round trip —
the committed golden files (written by ``fit`` and ``evaluate``) and a hand-made file of an
older layout."""

from __future__ import annotations

import json

import pytest

from probtrans.analysis.results import PLAIN, PredictiveMetrics, RunMetrics
from probtrans.storage.io import json_text
from tests.test_golden_run import GOLDENS

WITH_VARIANTS = {
    "accuracy": 0.9,
    "nll": 0.3,
    "ts_nll": 0.25,
    "test_elpd": -12.0,
    "ood": {"digits_8_9": {"n": 5}},
    "laplace.accuracy": 0.91,
    "laplace.ood": {"digits_8_9": {"n": 5}},
    "mc_dropout.accuracy": 0.88,
    # the notes after every predictive's metrics, by predictive name (as evaluate writes them)
    "mc_dropout.constant_note": "every one of the 4 validation examples is predicted '0'",
    "constant_note": "every one of the 4 validation examples is predicted '1'",
    "posterior_samples": 8,
    "loo": -40.5,
    "seed": 0,
    "epochs": 3,
    "best_epoch": 2,
}


def test_predictives_and_run_keys_are_apart():
    run = RunMetrics.from_json(WITH_VARIANTS)
    assert list(run.predictives) == [PLAIN, "laplace", "mc_dropout"]
    assert run.variants == ["laplace", "mc_dropout"]
    assert run.plain.get("nll") == 0.3 and run.plain.scaled("nll") == 0.25
    assert run.plain.scaled("accuracy") is None and run.plain.ood == WITH_VARIANTS["ood"]
    assert run.predictives["laplace"] == PredictiveMetrics(
        {"accuracy": 0.91, "ood": {"digits_8_9": {"n": 5}}}
    )
    assert run.predictives["mc_dropout"].constant_note.endswith("'0'")
    assert run.plain.constant_note.endswith("'1'")
    assert run.run == {
        "posterior_samples": 8,
        "loo": -40.5,
        "seed": 0,
        "epochs": 3,
        "best_epoch": 2,
    }
    assert run.posterior_samples == 8


def test_a_file_read_and_written_again_is_the_same_file():
    assert list(RunMetrics.from_json(WITH_VARIANTS).to_json().items()) == list(
        WITH_VARIANTS.items()
    )


@pytest.mark.parametrize("folder", sorted(p.name for p in GOLDENS.iterdir()))
def test_the_golden_files_read_and_write_back_byte_for_byte(folder):
    text = (GOLDENS / folder / "metrics.json").read_text()
    run = RunMetrics.from_json(json.loads(text))
    assert run.variants == [] and run.plain.has("accuracy") and "loo" in run.run
    assert json_text(run.to_json()) == text
