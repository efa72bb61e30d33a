"""A backbone family added by a plugin: one ``register_family`` line describes an encoder whose
self-attention projections are named as no built-in family names them (here a toy Hugging Face
model with ``to_q``/``to_k``/``to_v`` and its heads under ``n_head``). With it, probtrans finds
the model's attention blocks, swaps softmax attention in with the pretrained outputs unchanged,
and picks LoRA's default targets; without it the model is refused naming the known
projections. A model that transformers does not let change its attention function is refused,
not run with its own attention as if swapped."""

from __future__ import annotations

import pytest
import torch

import probtrans
from probtrans.backbone.families import FAMILIES, attention_heads, family_of, lora_targets
from probtrans.errors import ConfigError
from tests.conftest import plugin_imported

PLUGIN = '''
"""A toy plugin: the family of the toy encoder."""

from probtrans.backbone.families import Family, register_family

register_family(Family("Toy", ("toy-encoder",), ("to_q", "to_k", "to_v"), heads="n_head"))
'''

#: a toy encoder of self-attention blocks; LOOKUP is how its blocks find their attention function
TOY_ENCODER = """
import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS


class ToyConfig(PretrainedConfig):
    model_type = "toy-encoder"

    def __init__(self, hidden=16, n_head=2, n_layer=2, **kwargs):
        super().__init__(**kwargs)
        self.hidden, self.n_head, self.n_layer = hidden, n_head, n_layer


class ToySelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config, self.d_head = config, config.hidden // config.n_head
        self.is_causal = False  # an encoder's block
        self.to_q, self.to_k, self.to_v = (nn.Linear(config.hidden, config.hidden) for _ in "qkv")

    def forward(self, x, attention_mask=None):
        heads = lambda t: t.view(*x.shape[:2], -1, self.d_head).transpose(1, 2)
        attention = LOOKUP
        q, k, v = heads(self.to_q(x)), heads(self.to_k(x)), heads(self.to_v(x))
        out, _ = attention(self, q, k, v, attention_mask, scaling=self.d_head**-0.5, dropout=0.0)
        return out.reshape(*x.shape)


class ToyEncoder(PreTrainedModel):
    config_class = ToyConfig
    _supports_sdpa = True
    _supports_attention_backend = True

    def __init__(self, config):
        super().__init__(config)
        self.blocks = nn.ModuleList(ToySelfAttention(config) for _ in range(config.n_layer))
        self.post_init()

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x


def toy_encoder():
    torch.manual_seed(0)
    return ToyEncoder(ToyConfig(attn_implementation="sdpa")).eval()
"""
#: as Hugging Face's own models look their attention function up: transformers lets them switch
INTERFACE = (
    "ALL_ATTENTION_FUNCTIONS.get_interface("
    'self.config._attn_implementation, ALL_ATTENTION_FUNCTIONS["sdpa"])'
)
#: by indexing the registry: transformers keeps such a model on its first function
INDEXED = "ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation]"


@pytest.fixture
def toy(tmp_path):
    with plugin_imported(tmp_path, "toy_encoder", TOY_ENCODER.replace("LOOKUP", INTERFACE)) as m:
        yield m


def test_a_plugin_family_is_found_swapped_and_adapted(tmp_path, toy):
    x = torch.randn(3, 5, 16)
    reference, swapped = toy.toy_encoder(), toy.toy_encoder()
    with plugin_imported(tmp_path, "toy_family_plugin", PLUGIN, FAMILIES):
        assert family_of(swapped).name == "Toy" and attention_heads(swapped.config) == 2
        assert lora_targets(swapped) == ["to_q", "to_v"]
        backbone = probtrans.swap_attention(swapped, layers="all", attention="softmax")
        with torch.no_grad():
            given = backbone(x)
    with torch.no_grad():
        expected = reference(x)
    assert swapped.config._attn_implementation == "probtrans"
    assert all("attn" in block._modules for block in swapped.blocks)  # probtrans layers in both
    torch.testing.assert_close(given, expected, rtol=0, atol=1e-5)


def test_without_the_plugin_the_model_is_refused_naming_the_known_projections(toy):
    with pytest.raises(ConfigError, match=r"no self-attention blocks of a known shape.*q_lin"):
        probtrans.swap_attention(toy.toy_encoder(), layers="all")
    with pytest.raises(ConfigError, match="of no known backbone family"):
        lora_targets(toy.toy_encoder())


def test_a_model_transformers_keeps_on_its_attention_function_is_refused_unchanged(tmp_path):
    declining = TOY_ENCODER.replace("LOOKUP", INDEXED)
    with (
        plugin_imported(tmp_path, "toy_declining", declining) as toy,
        plugin_imported(tmp_path, "toy_family_plugin", PLUGIN, FAMILIES),
    ):
        model = toy.toy_encoder()
        with pytest.raises(ConfigError, match=r"keeps the attention function 'sdpa' in blocks\.0"):
            probtrans.swap_attention(model, layers="all")
    assert model.config._attn_implementation == "sdpa"
    assert not any("attn" in block._modules for block in model.blocks)
