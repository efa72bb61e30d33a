"""A test-time adaptation added by a plugin: one module with an ``AdaptationMethod``, its
options class and one registration call (a toy: the LayerNorms' γ scaled while adapting) is a
method ``probtrans evaluate --adapt`` and ``Run.predict(adapt=...)`` accept, its options
validated as every spec's, recorded in ``metrics.json``, called before each batch, and the
model is left as it was."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from probtrans.cli import main
from probtrans.errors import ProbtransError
from probtrans.tta import ADAPTATION_METHODS, adaptation_options
from tests.conftest import plugin_imported

PLUGIN = '''
"""A toy plugin: every LayerNorm's γ scaled by (1 + scale) while adapting."""

from typing import Literal

import torch
from torch import nn

from probtrans.specs.base import Positive, Spec
from probtrans.tta import AdaptationMethod, register_adaptation


class ScaleOptions(Spec):
    method: Literal["norm_scale"] = "norm_scale"
    scale: Positive = 0.5


@register_adaptation
class NormScale(AdaptationMethod):
    name = "norm_scale"
    options_class = ScaleOptions
    batches = 0

    def enter(self, stack):
        norms = [m for m in self.classifier.modules() if isinstance(m, nn.LayerNorm)]
        trained = [norm.weight.detach().clone() for norm in norms]

        def restore():
            with torch.no_grad():
                for norm, weight in zip(norms, trained):
                    norm.weight.copy_(weight)

        stack.callback(restore)
        with torch.no_grad():
            for norm in norms:
                norm.weight.mul_(1 + self.options.scale)

    def adapt(self, inputs, mask, draws, samples, device="cpu"):
        type(self).batches += 1
'''


@pytest.fixture
def plugin(tmp_path):
    """The plugin module imported (its one registration), forgotten after the test."""
    with plugin_imported(tmp_path, "norm_scale_plugin", PLUGIN, ADAPTATION_METHODS) as module:
        yield module


def test_a_plugin_adaptation_is_an_evaluate_and_predict_method(plugin, tiny_run, capsys):
    from probtrans.runs import Run

    plain = json.loads((tiny_run / "metrics.json").read_text())
    run = Run.load(tiny_run)
    state = {name: value.clone() for name, value in run.classifier.state_dict().items()}
    assert main(["evaluate", str(tiny_run), "--adapt", "norm_scale", "--quiet"]) == 0
    assert "adapted to each test batch by norm_scale" in capsys.readouterr().out
    adapted = json.loads((tiny_run / "metrics.json").read_text())
    assert adapted["adaptation"] == {"method": "norm_scale", "scale": 0.5}
    assert adapted["nll"] != plain["nll"]
    assert plugin.NormScale.batches > 0

    inputs = run.data.test.inputs[:40]
    columns = run.predict(inputs, adapt="norm_scale")
    assert not np.allclose(columns["entropy"], run.predict(inputs)["entropy"])
    for name, value in run.classifier.state_dict().items():  # restored when it ends
        assert torch.equal(value, state[name]), name


def test_a_plugin_adaptations_options_are_checked_as_a_specs(plugin):
    assert adaptation_options("norm_scale", scale=0.25).scale == 0.25
    with pytest.raises(ProbtransError, match="norm_scale: scale = -1"):
        adaptation_options("norm_scale", scale=-1.0)
    with pytest.raises(ProbtransError, match="for 'tent' only: 'norm_scale' keeps no adapted"):
        adaptation_options("norm_scale", online=True)
