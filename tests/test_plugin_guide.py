"""A weight guide added by a plugin: one module with a builder and one ``GUIDES.register`` line
(here a mean-field Normal whose scales start wide) is accepted as ``[guide] name``, trains, is
rebuilt by ``Run.load`` and named in words in the run's figure title; without it the name is
refused with the known ones."""

from __future__ import annotations

import pytest
import torch

import probtrans
from probtrans.errors import ConfigError
from probtrans.guides.weights import GUIDES
from probtrans.resolve import load_inference_spec
from probtrans.runs import Run
from tests.conftest import inference_file, plugin_imported, tiny_inference

PLUGIN = '''
"""A toy plugin: a mean-field Normal guide whose standard deviations start at 0.2."""

from pyro.infer.autoguide import AutoNormal

from probtrans.guides.weights import GUIDES, NamedGuide, start_at


def wide_normal(model, initial, spec):
    return AutoNormal(model, init_loc_fn=start_at(initial), init_scale=0.2)


GUIDES.register("wide_normal", NamedGuide(wide_normal, "wide mean-field normal"))
'''


def wide_inference(tmp_path):
    text = tiny_inference(tmp_path, "mfvi").read_text()
    return inference_file(
        tmp_path, "wide.toml", text.replace('name = "normal"', 'name = "wide_normal"')
    )


def test_a_plugin_guide_trains_reloads_and_is_named_in_words(tmp_path, tiny_model_file):
    with plugin_imported(tmp_path, "wide_normal_plugin", PLUGIN, GUIDES):
        run = probtrans.fit(
            tiny_model_file, wide_inference(tmp_path), out=tmp_path / "run", epochs=1
        )
        loaded = Run.load(run.path)
        draws = loaded.posterior_samples(400, seed=0)
        words = loaded.guide_words()
    assert words == "wide mean-field normal on the last layer"
    # the plugin's builder made the guide: one epoch leaves its wide scales near 0.2 (the
    # built-in normal starts at init_scale = 0.01)
    spread = torch.cat([d.std(dim=0).flatten() for d in draws.values()])
    assert 0.1 < spread.median().item() < 0.3


def test_without_the_plugin_its_name_is_refused_with_the_known_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"'wide_normal'.*delta, lowrank, normal"):
        load_inference_spec(wide_inference(tmp_path))
