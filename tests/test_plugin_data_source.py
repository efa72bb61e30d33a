"""A data source added by a plugin: one loader and one ``DATA_SOURCES.register`` line (here
short sentences whose class is their first word) is accepted as ``[data] name``, trains,
evaluates and predicts on new texts; without it the name is refused with the known ones."""

from __future__ import annotations

import numpy as np
import pytest

import probtrans
from probtrans.data.sources import DATA_SOURCES
from probtrans.errors import ConfigError
from probtrans.resolve import load_model_spec
from probtrans.runs import Run
from tests.conftest import TINY_MODEL, inference_file, plugin_imported, tiny_inference

PLUGIN = '''
"""A toy plugin: sentences whose first word gives their class."""

from probtrans.data import DataBundle
from probtrans.data.sources import DATA_SOURCES, DataSource

VERDICTS = ["good", "bad"]
NOUNS = ["film", "book", "song", "play", "show", "meal"]


def sentences(count, offset=0):
    rows = range(offset, offset + count)
    return [f"{VERDICTS[i % 2]} {NOUNS[i % 6]} number {i}" for i in rows], [i % 2 for i in rows]


def load(spec, folder):
    ood = [f"{noun} without a verdict" for noun in NOUNS]
    return DataBundle.from_texts(
        sentences(120), test=sentences(40, 1000), ood={"verdictless": ood},
        labels=["good", "bad"], max_len=spec.max_len, vocab_size=spec.vocab_size,
        min_freq=1, name=spec.name,
    )


DATA_SOURCES.register("first_word", DataSource(load, ood_names=lambda spec: ["verdictless"]))
'''

FIRST_WORD_MODEL = TINY_MODEL.replace(
    '[data]\nname = "digits"\npatch_size = 2', '[data]\nname = "first_word"\nmax_len = 8'
)


def test_a_plugin_data_source_trains_evaluates_and_predicts(tmp_path):
    model = inference_file(tmp_path, "first_word.toml", FIRST_WORD_MODEL)
    inference = tiny_inference(tmp_path, "map")
    with plugin_imported(tmp_path, "first_word_plugin", PLUGIN, DATA_SOURCES):
        run = probtrans.fit(model, inference, out=tmp_path / "run", epochs=1)
        texts = ["good song number 7", "bad meal number 9"]
        columns = Run.load(run.path).predict(texts, samples=2)
    assert run.data.class_names == ["good", "bad"]
    assert "verdictless" in run.metrics["ood"]
    assert set(columns["predicted"]) <= {"good", "bad"}
    np.testing.assert_allclose(columns["p_good"] + columns["p_bad"], 1.0, rtol=1e-6)


def test_without_the_plugin_its_name_is_refused_with_the_known_ones(tmp_path):
    model = inference_file(tmp_path, "first_word.toml", FIRST_WORD_MODEL)
    with pytest.raises(ConfigError, match=r"'first_word'.*cola, cr, digits"):
        load_model_spec(model)
