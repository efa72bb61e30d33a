"""A plugin adds an attention kind with one registration call, and the kind appears everywhere
a kind of probtrans does: a model spec that uses it reads and is described (``probtrans
describe``), the JSON Schema (``probtrans schema model``) lists its options, and
:mod:`probtrans.nn` exports its class. Afterwards the kind is gone again."""

from __future__ import annotations

import json

import pytest

import probtrans.nn
from probtrans.attention import ATTENTION
from probtrans.cli import main
from probtrans.errors import ConfigError
from probtrans.resolve import load_model_spec
from probtrans.specs.attention import ATTENTION_OPTIONS, follow_kinds
from tests.conftest import TINY_MODEL, plugin_imported

#: a plugin module: the options and layer of softmax attention at a temperature, whose weights
#: are a (self-guided, point-mass) site ``a_t``, and ONE registration call
PLUGIN = '''
from typing import Literal

import pyro.distributions as dist

from probtrans.attention import MultiHeadAttention, register_attention
from probtrans.attention.multihead import masked_logits
from probtrans.contract import sample_attention
from probtrans.specs.base import Positive, Spec


class TemperedOptions(Spec):
    """Softmax attention at a temperature: a = softmax(q kᵀ / temperature)."""

    kind: Literal["tempered"] = "tempered"
    temperature: Positive = 2.0


class TemperedAttention(MultiHeadAttention):
    options_class = TemperedOptions
    sample_sites = ("a_t",)

    def attend(self, q, k, v, key_mask):
        logits = masked_logits(q @ k.transpose(-1, -2) / self.options.temperature, key_mask)
        weights = dist.Delta(logits.softmax(-1), event_dim=3)
        return sample_attention(self.site("a_t"), weights) @ v


register_attention(TemperedAttention)
'''

#: the ``[model.attention]`` table of a model spec that uses the plugin's kind
TEMPERED_TABLE = """[model.attention]
kind = "tempered"
temperature = 3.0
"""


@pytest.fixture
def plugin(tmp_path):
    """The plugin module imported; its kind unregistered afterwards."""
    with plugin_imported(tmp_path, "tempered_plugin", PLUGIN, ATTENTION, ATTENTION_OPTIONS) as m:
        yield m
    follow_kinds()


def test_a_plugin_attention_kind_appears_in_describe_the_schema_and_nn(plugin, tmp_path, capsys):
    spec = tmp_path / "tempered.toml"
    spec.write_text(TINY_MODEL.split("[model.attention]")[0] + TEMPERED_TABLE)
    assert load_model_spec(spec).network.attention == plugin.TemperedOptions(temperature=3.0)

    assert main(["describe", str(spec)]) == 0
    assert "encoder.layers.0.attn.a_t" in capsys.readouterr().out

    assert main(["schema", "model"]) == 0
    schema = json.loads(capsys.readouterr().out)
    options = schema["$defs"]["TemperedOptions"]
    assert options["properties"]["kind"]["const"] == "tempered"
    assert options["properties"]["temperature"]["exclusiveMinimum"] == 0

    assert probtrans.nn.TemperedAttention is plugin.TemperedAttention
    assert "TemperedAttention" in dir(probtrans.nn)


def test_the_plugin_kind_is_gone_after_its_test(tmp_path):
    spec = tmp_path / "tempered.toml"
    spec.write_text(TINY_MODEL.split("[model.attention]")[0] + TEMPERED_TABLE)
    with pytest.raises(ConfigError, match="'tempered'"):
        load_model_spec(spec)
    assert "tempered" not in ATTENTION_OPTIONS and "tempered" not in ATTENTION
    assert not hasattr(probtrans.nn, "TemperedAttention")
