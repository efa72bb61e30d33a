"""Shared fixtures: a tiny model spec on the embedded digits data."""

from __future__ import annotations

import warnings
from pathlib import Path

import pyro
import pytest
import torch

from probtrans.attention import default_options
from probtrans.data import DataSplit, load_data
from probtrans.specs import ModelSpec

warnings.filterwarnings("ignore", category=FutureWarning, module="arviz")

ROOT = Path(__file__).resolve().parents[1]

TINY_MODEL = """
[data]
name = "digits"
patch_size = 2

[model]
d_model = 16
n_heads = 2
n_layers = 1
d_ff = 32
dropout = 0.0

[model.attention]
kind = "h_sto"
tau1 = 1.0
tau2 = 2.0
n_centroids = 3

[model.prior]
weights = "last_layer"
"""


@pytest.fixture(autouse=True)
def _fresh_pyro():
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    yield


@pytest.fixture(scope="session")
def digits():
    return load_data(ModelSpec().data)


def ragged_split(n: int, longest: int, seed: int = 0) -> DataSplit:
    """n rows of token ids (vocabulary 20) with lengths uniform on 1..longest, padded to longest;
    labels uniform on {0, 1}."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, longest + 1, (n,), generator=generator)
    mask = torch.arange(longest) < lengths[:, None]  # (n, longest)
    ids = torch.randint(1, 20, (n, longest), generator=generator) * mask
    return DataSplit(ids, torch.randint(0, 2, (n,), generator=generator), mask)


def tiny_spec(kind: str = "h_sto", prior: str = "none", **attention) -> ModelSpec:
    spec = ModelSpec()
    spec.network.d_model, spec.network.n_heads, spec.network.n_layers = 16, 2, 1
    spec.network.d_ff, spec.network.dropout = 32, 0.0
    spec.network.attention = default_options(kind, **attention)
    spec.network.prior.weights = prior
    return spec


@pytest.fixture
def tiny_model_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY_MODEL)
    return path


def inference_file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


TINY_TRAIN = """
[train]
epochs = 2
batch_size = 128
val_samples = 2

[predictive]
samples = 4
"""


def tiny_inference(tmp_path, name):
    """The project's inference spec ``name`` with a tiny training budget."""
    text = (ROOT / "inference" / f"{name}.toml").read_text()
    text = text.split("[train]")[0] + TINY_TRAIN
    return inference_file(tmp_path, f"{name}.toml", text)


@pytest.fixture
def tiny_run(tmp_path: Path, tiny_model_file: Path) -> Path:
    """A finished run folder of the tiny model (2 epochs, MAP guide)."""
    from probtrans.run import fit_run

    out = tmp_path / "run"
    fit_run(tiny_model_file, tiny_inference(tmp_path, "map"), out, progress=False)
    return out
