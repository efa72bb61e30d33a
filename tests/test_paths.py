"""Paths chosen per device (probtrans.runtime.paths): the choice, its override by a spec's
``[paths]``, its record in the run folder, and, for every choice any device makes, the same
numbers to the tolerance each path documents."""

from __future__ import annotations

import json

import pyro
import pytest
import torch
from pyro import poutine

import probtrans.gp.decoupled
import probtrans.gp.residual
from probtrans import fit
from probtrans.contract import fused_attention
from probtrans.nn import HierarchicalStochasticAttention, SGPAttention, StochasticAttention
from probtrans.runtime.paths import MEASURED, Paths, paths_for, taken, use_paths
from tests.conftest import TINY_TRAIN, inference_file, relative_error, tiny_spec

#: every chunk size a device chooses, and one small enough for several chunks per sequence
CHUNKS = sorted({paths.residual_chunk for paths in MEASURED.values()} | {64})


def test_each_device_takes_its_measured_paths_unless_overridden():
    assert paths_for("cpu") == MEASURED["cpu"]
    assert paths_for(torch.device("cuda", 1)) == paths_for("cuda:0") == MEASURED["cuda"]
    assert paths_for("mps") == MEASURED["cpu"]  # a device not measured takes the CPU's
    with use_paths(sgpa_conditional="float64", residual_chunk="auto", attention=None):
        chosen = paths_for("cuda")
        assert chosen == Paths("float64", MEASURED["cuda"].residual_chunk, "fused")
        with use_paths(residual_chunk=100):  # an inner block adds to the outer one's
            assert paths_for("cpu") == Paths("float64", 100, MEASURED["cpu"].attention)
        assert paths_for("cuda") == chosen
    assert paths_for("cuda") == MEASURED["cuda"]
    assert taken("cuda:0", {"attention": "sites"}) == {
        "device": "cuda",
        "sgpa_conditional": MEASURED["cuda"].sgpa_conditional,
        "residual_chunk": MEASURED["cuda"].residual_chunk,
        "attention": "sites",
    }
    with pytest.raises(TypeError, match="no path named chunk"):
        with use_paths(chunk=4):
            pass


def sgpa_pass(layer: SGPAttention, x: torch.Tensor, mask: torch.Tensor, **paths):
    """The layer's output for the draws of one seed and the gradients of Σ w ⊙ out with respect
    to the input and every parameter, under ``paths``."""
    layer.zero_grad()
    x = x.detach().requires_grad_()
    pyro.set_rng_seed(3)
    with use_paths(**paths):
        out = poutine.trace(layer).get_trace(x, mask).nodes["_RETURN"]["value"]
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device)
    (out * weights.view_as(out)).sum().backward()
    grads = torch.cat([x.grad.flatten(), *(p.grad.flatten() for p in layer.parameters())])
    return out.detach(), grads


@pytest.mark.parametrize("kernel", ["exponential", "ard"])
def test_every_sgpa_path_gives_the_same_layer_output_and_gradients(kernel, device, monkeypatch):
    """Both conditionals, each chunk size a device may choose and one that splits every
    sequence: the same output of a float32 layer for the same draws, and the same gradients,
    to float32 rounding (the factored path's documented 10⁻⁶)."""
    chunks = []

    def counted(scaled, elements):
        result = split(scaled, elements)
        chunks.append(len(result))
        return result

    split = probtrans.gp.residual._chunks
    monkeypatch.setattr(probtrans.gp.residual, "_chunks", counted)
    torch.manual_seed(0)
    layer = SGPAttention(16, 2, n_inducing=5, kernel=kernel).to(device)
    x = torch.nn.functional.layer_norm(torch.randn(3, 9, 16, device=device), (16,))
    mask = torch.ones(3, 9, dtype=torch.bool, device=device)
    mask[1, 6:] = False
    reference, reference_grads = sgpa_pass(layer, x, mask, sgpa_conditional="float64")
    for chunk in CHUNKS:
        chunks.clear()
        out, grads = sgpa_pass(layer, x, mask, sgpa_conditional="factored", residual_chunk=chunk)
        # forward, backward: one chunk of all 3 sequences; or each sequence its own piece of
        # the conditional (its (H, T, d + 1) = 2 × 9 × 9 elements are over 64) and each of its
        # heads its own chunk of the remainder
        assert chunks == ([1, 1] if chunk >= 3 * 2 * 9 * 9 else [2] * 6), chunk
        assert relative_error(out, reference) <= 1e-6, chunk
        assert relative_error(grads, reference_grads) <= 1e-5, chunk
    out, grads = sgpa_pass(layer, x, mask)  # the device's own choice
    assert relative_error(out, reference) <= 1e-6
    assert relative_error(grads, reference_grads) <= 1e-5


@pytest.mark.parametrize("kernel", ["exponential", "ard"])
def test_the_factored_conditional_in_pieces_of_sequences_equals_it_whole(kernel, device):
    """Inputs with a sample dimension (S, B, H, T, d) split into pieces of whole sequences (a
    chunk size under one sequence's elements) or taken whole: the same conditional moments (given
    one draw of ε, and one per sample), KL and gradients, to float32 rounding of the remainder."""
    torch.manual_seed(1)
    layer = SGPAttention(16, 2, n_inducing=5, kernel=kernel).to(device)
    x = torch.nn.functional.layer_norm(torch.randn(2, 3, 2, 9, 8, device=device), (8,))
    v, x_g = torch.randn_like(x), torch.randn(2, 5, 8, device=device)
    eps, per_sample = torch.randn(2, 8, 5, device=device), torch.randn(2, 1, 2, 8, 5, device=device)
    results = []
    for chunk in (64, 1 << 30):
        x_a, v_a = inputs = [t.detach().clone().requires_grad_() for t in (x, v)]
        with use_paths(residual_chunk=chunk):
            gp = probtrans.gp.decoupled.decoupled_conditional(layer.kernel, x_a, x_g, v_a, 1e-6)
        moments = [gp.mean(eps), gp.mean(per_sample), gp.variance(), gp.amortised_kl, gp.cross]
        assert moments[0].shape == moments[1].shape == (2, 3, 2, 8, 9)
        assert gp.amortised_kl.shape == (2, 3)
        sum(m.double().sin().sum() for m in moments).backward()
        results.append([*moments, *(t.grad for t in inputs)])
    for pieces, whole in zip(*results, strict=True):
        assert relative_error(pieces, whole) <= 1e-6


def test_the_sgpa_conditional_path_is_the_one_called(monkeypatch):
    called = []
    for name, function in probtrans.gp.decoupled.CONDITIONALS.items():

        def spy(*args, name=name, function=function, **kwargs):
            called.append(name)
            return function(*args, **kwargs)

        monkeypatch.setitem(probtrans.gp.decoupled.CONDITIONALS, name, spy)
    layer, x = SGPAttention(16, 2, n_inducing=4), torch.randn(2, 5, 16)
    for path in ("float64", "factored", "auto"):
        with poutine.trace(), use_paths(sgpa_conditional=path):
            layer(x)
    assert called == ["float64", "factored", MEASURED["cpu"].sgpa_conditional]


@pytest.mark.parametrize("kind", [StochasticAttention, HierarchicalStochasticAttention])
def test_stochastic_attentions_sites_path_gives_the_fused_paths_sample(kind, device):
    """Where the sites are hidden, ``attention = "sites"`` records them (the fused path draws
    without them) and gives the same sample and gradients from the same seed."""
    pyro.set_rng_seed(0)
    layer = kind(16, 2).to(device, torch.float64)
    x = torch.randn(2, 6, 16, dtype=torch.float64, device=device)
    results = {}
    for path in ("fused", "sites"):
        layer.zero_grad()
        pyro.set_rng_seed(7)
        with fused_attention(), use_paths(attention=path):
            trace = poutine.trace(layer).get_trace(x, None)
        out = trace.nodes["_RETURN"]["value"]
        out.pow(2).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in layer.parameters()])
        sites = {name for name, node in trace.nodes.items() if node["type"] == "sample"}
        results[path] = out.detach(), grads, sites
    assert not results["fused"][2] and results["sites"][2]
    torch.testing.assert_close(results["fused"][0], results["sites"][0])
    torch.testing.assert_close(results["fused"][1], results["sites"][1])


def test_a_specs_paths_apply_to_the_run_and_are_recorded(tmp_path, monkeypatch):
    """``[paths]`` of the inference spec, and ``fit``'s ``paths`` keyword over it: the training
    and the evaluation take them, and ``timing.json`` records the paths each took, with the
    device."""
    called = []
    reference = probtrans.gp.decoupled.CONDITIONALS["float64"]

    def spy(*args, **kwargs):
        called.append("float64")
        return reference(*args, **kwargs)

    monkeypatch.setitem(probtrans.gp.decoupled.CONDITIONALS, "float64", spy)
    spec = tiny_spec("sgpa", n_inducing=4)
    inference = inference_file(
        tmp_path,
        "paths.toml",
        TINY_TRAIN + '\n[paths]\nsgpa_conditional = "float64"\nresidual_chunk = 64\n',
    )
    paths = {"residual_chunk": 4096}  # fit's keyword replaces the field it names
    with fit(spec, inference, epochs=1, out=tmp_path / "run", progress=False, paths=paths) as run:
        timing = json.loads((run.path / "timing.json").read_text())
        assert run.classifier.paths["sgpa_conditional"] == "float64"
    expected = {"device": "cpu", "sgpa_conditional": "float64", "residual_chunk": 4096}
    expected["attention"] = MEASURED["cpu"].attention
    assert timing["train_paths"] == timing["evaluate_paths"] == expected
    assert len(called) > 10  # every training step and every predictive pass
