"""The private ``transformers`` names probtrans relies on (:mod:`probtrans.internals.transformers`):
the installed release among those checked, and each still behaving as probtrans uses it."""

from __future__ import annotations

import tomllib
from pathlib import Path

import torch
import transformers
from packaging.requirements import Requirement
from torch import nn
from transformers import AutoModel
from transformers.utils import logging as transformers_logging

from probtrans.internals.transformers import (
    CHECKED_TRANSFORMERS_VERSIONS,
    attention_implementation,
    calls_attention_registry,
    progress_bars_off,
    register_attention,
    sdpa_attention,
)
from tests.tiny_backbones import tiny_config


def test_the_installed_transformers_is_a_checked_release():
    release = ".".join(transformers.__version__.split(".")[:2])
    assert release in CHECKED_TRANSFORMERS_VERSIONS, (
        f"transformers {transformers.__version__} is not among the releases probtrans's private "
        f"transformers names were checked against ({', '.join(CHECKED_TRANSFORMERS_VERSIONS)}): "
        f"re-check each function of probtrans/internals/transformers.py against this release's "
        f"source (config._attn_implementation, integrations.sdpa_attention.sdpa_attention_forward, "
        f"masking_utils.AttentionMaskInterface and sdpa_mask, ALL_ATTENTION_FUNCTIONS in the "
        f"attention modules' forward, utils.logging.set_tqdm_hook), run this file, then add the "
        f"release to CHECKED_TRANSFORMERS_VERSIONS"
    )


def test_the_install_admits_the_checked_releases_and_no_later_one():
    """pyproject's ``transformers`` requirement lets pip resolve only a checked release: the
    first of each checked major.minor is admitted, the next minor after the newest is not."""
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    (requirement,) = [
        Requirement(line)
        for line in project["project"]["dependencies"]
        if Requirement(line).name == "transformers"
    ]
    for release in CHECKED_TRANSFORMERS_VERSIONS:
        assert requirement.specifier.contains(f"{release}.0"), (requirement, release)
    major, minor = max(tuple(map(int, r.split("."))) for r in CHECKED_TRANSFORMERS_VERSIONS)
    assert not requirement.specifier.contains(f"{major}.{minor + 1}.0"), requirement


def tiny_bert() -> nn.Module:
    torch.manual_seed(0)
    return AutoModel.from_config(tiny_config("bert", vocab_size=50)).eval()


def test_a_registered_attention_function_is_called_and_sdpa_is_the_models_own():
    """A function registered under a name and set on the model is called by every block, and
    the function handing its inputs to :func:`sdpa_attention` gives the model's own outputs;
    the config names the function that was set."""
    model = tiny_bert()
    ids = torch.tensor([[2, 7, 9, 11, 0], [3, 5, 8, 0, 0]])
    mask = (ids != 0).long()
    expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
    calls = []

    def counted(module, query, key, value, attention_mask, **kwargs):
        calls.append(query.shape)  # (B, H, L, d)
        return sdpa_attention(module, query, key, value, attention_mask, **kwargs)

    register_attention("probtrans_test_counted", counted)
    model.set_attn_implementation("probtrans_test_counted")
    assert attention_implementation(model.config) == "probtrans_test_counted"
    got = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert calls == [torch.Size([2, 4, 5, 8])] * 2  # both blocks
    torch.testing.assert_close(got, expected)
    model.set_attn_implementation("sdpa")
    assert attention_implementation(model.config) == "sdpa"


def test_sdpa_attention_is_scaled_dot_product_attention_heads_last():
    query, key, value = torch.randn(3, 2, 4, 5, 8).unbind(0)  # (B, H, L, d)
    module = nn.Module()
    module.is_causal = False
    output, _ = sdpa_attention(module, query, key, value, None, scaling=None, dropout=0.0)
    expected = torch.nn.functional.scaled_dot_product_attention(query, key, value)
    torch.testing.assert_close(output, expected.transpose(1, 2))  # (B, L, H, d)


def test_bert_self_attention_calls_the_registry_and_a_plain_module_does_not():
    model = tiny_bert()
    assert calls_attention_registry(model.encoder.layer[0].attention.self)
    assert not calls_attention_registry(nn.MultiheadAttention(8, 2))


def test_progress_bars_are_off_inside_the_block_and_the_hook_is_restored():
    def mine(factory, args, kwargs):
        return factory(*args, **kwargs)

    before = transformers_logging.set_tqdm_hook(mine)
    try:
        with progress_bars_off():
            assert transformers_logging.tqdm(range(3)).disable
        assert transformers_logging.set_tqdm_hook(mine) is mine  # restored
    finally:
        transformers_logging.set_tqdm_hook(before)
