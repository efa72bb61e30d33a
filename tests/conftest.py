"""Shared fixtures: a tiny model spec on the embedded digits data, and the device of the tests
that take the ``device`` fixture (``pytest --device cuda``: the model, attention, SGPA,
predictive and training tests on the GPU)."""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pyro
import pytest
import torch
from pyro import poutine
from torch import Tensor

from probtrans.data import DataSplit, load_data
from probtrans.specs import ModelSpec
from probtrans.specs.attention import ATTENTION_OPTIONS

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


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="device of the tests that take the `device` fixture (default: cpu)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--device cuda`` runs the tests that take the ``device`` fixture alone: the others do
    not use the GPU and already ran on the CPU."""
    if config.getoption("--device") == "cpu":
        return
    off = [item for item in items if "device" not in getattr(item, "fixturenames", ())]
    if off:
        config.hook.pytest_deselected(items=off)
        items[:] = [item for item in items if "device" in getattr(item, "fixturenames", ())]


@pytest.fixture
def device(request: pytest.FixtureRequest) -> str:
    """The ``--device`` option: "cpu", or "cuda" (the test is skipped without a CUDA device)."""
    name = request.config.getoption("--device")
    if name == "cuda" and not torch.cuda.is_available():
        pytest.skip("--device cuda: no CUDA device on this machine")
    return name


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


def autocast_pass(
    layer: torch.nn.Module, x: Tensor, mask: Tensor | None, bfloat16: bool, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """Forward pass of an attention ``layer`` (traced: SGPA's KL factor is an observed site) with
    the draws of ``seed``, in a CPU bfloat16 autocast region or not, and the backward pass of
    Σ out² → the output and the gradients of all parameters, concatenated."""
    layer.zero_grad()
    pyro.set_rng_seed(seed)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bfloat16):
        out = poutine.trace(layer).get_trace(x, mask).nodes["_RETURN"]["value"]
    out.float().pow(2).sum().backward()
    return out.detach(), torch.cat([p.grad.flatten() for p in layer.parameters()])


def relative_error(value: Tensor, reference: Tensor) -> float:
    """‖value − reference‖ / ‖reference‖ (in float32)."""
    return float((value.float() - reference.float()).norm() / reference.float().norm())


def tiny_spec(kind: str = "h_sto", prior: str = "none", **attention) -> ModelSpec:
    spec = ModelSpec()
    spec.network.d_model, spec.network.n_heads, spec.network.n_layers = 16, 2, 1
    spec.network.d_ff, spec.network.dropout = 32, 0.0
    spec.network.attention = ATTENTION_OPTIONS.get(kind, "kind")(**attention)
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
replicas = 2
"""


def tiny_inference(tmp_path, name):
    """The project's inference spec ``name`` with a tiny training budget."""
    text = (ROOT / "inference" / f"{name}.toml").read_text()
    text = text.split("[train]")[0] + TINY_TRAIN
    return inference_file(tmp_path, f"{name}.toml", text)


@pytest.fixture
def tiny_run(tmp_path: Path, tiny_model_file: Path) -> Path:
    """A finished run folder of the tiny model (2 epochs, MAP guide)."""
    from probtrans.runs import fit

    out = tmp_path / "run"
    fit(tiny_model_file, tiny_inference(tmp_path, "map"), out=out, progress=False)
    return out


@contextmanager
def plugin_imported(folder: Path, name: str, source: str, *registries) -> Iterator[object]:
    """A plugin module ``name`` written into ``folder`` and imported (its registrations made),
    then forgotten with them: each of ``registries`` is restored on leaving."""
    (folder / f"{name}.py").write_text(source)
    sys.path.insert(0, str(folder))
    try:
        with ExitStack() as stack:
            for registry in registries:
                stack.enter_context(registry.restored())
            yield importlib.import_module(name)
    finally:
        sys.modules.pop(name, None)
        sys.path.remove(str(folder))
