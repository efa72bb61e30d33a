"""The fused STO / H-STO path against the site path: same noise → same samples and gradients."""

from __future__ import annotations

import pyro
import pytest
import torch
from pyro import poutine
from scipy import stats

from probtrans.attention.gumbel import CHUNK, fused_relaxed_attention, gumbel, uniform
from probtrans.classifier import build_classifier
from probtrans.contract import fused_attention
from probtrans.inference.objective import self_guided
from probtrans.nn import HierarchicalStochasticAttention, StochasticAttention
from tests.conftest import tiny_spec

OPTIONS = {
    "sto": {"tau": 3.0},
    "h_sto": {"tau1": 0.7, "tau2": 20.0, "n_centroids": 3},
    "h_sto_per_head": {"tau1": 1.0, "tau2": 2.0, "centroids": "head"},
}


def layer(name: str, width: int = 16, heads: int = 4):
    kind = StochasticAttention if name == "sto" else HierarchicalStochasticAttention
    pyro.set_rng_seed(11)
    return kind(width, heads, **OPTIONS[name])


def run(attn, x, mask, seed: int, fused: bool):
    """Output and the gradients of every parameter for one draw with ``seed``."""
    attn.zero_grad()
    x = x.detach().requires_grad_()
    pyro.set_rng_seed(seed)
    if fused:
        with fused_attention():
            y = attn(x, mask)
    else:
        y = attn(x, mask)
    (y * torch.linspace(-1, 1, y.shape[-1], device=y.device)).sum().backward()
    grads = {name: p.grad.clone() for name, p in attn.named_parameters()}
    return y.detach(), grads, x.grad


@pytest.mark.parametrize("name", list(OPTIONS))
@pytest.mark.parametrize("padded", [False, True])
def test_fused_path_gives_the_site_paths_sample_and_gradients(name, padded, device):
    attn = layer(name).to(device, torch.float64)
    x = torch.randn(3, 7, 16, dtype=torch.float64, device=device)
    mask = None
    if padded:
        mask = torch.ones(3, 7, dtype=torch.bool, device=device)
        mask[0, 4:] = False
        mask[2, 1:] = False
    y_site, grads_site, dx_site = run(attn, x, mask, seed=5, fused=False)
    y_fused, grads_fused, dx_fused = run(attn, x, mask, seed=5, fused=True)
    torch.testing.assert_close(y_fused, y_site)
    torch.testing.assert_close(dx_fused, dx_site)
    for param in grads_site:
        torch.testing.assert_close(grads_fused[param], grads_site[param])
    y_other, _, _ = run(attn, x, mask, seed=6, fused=True)
    assert not torch.allclose(y_other, y_fused)  # a random variable: another seed, another draw


def test_fused_path_matches_the_site_path_on_chunked_noise():
    """Above CHUNK elements the noise is drawn in parallel chunks; both paths still agree."""
    attn = layer("sto", width=8, heads=2)
    length = int((CHUNK / 4) ** 0.5) + 8  # (2, 2, L, L) attention > CHUNK elements
    x = torch.randn(2, length, 8)
    y_site, grads_site, _ = run(attn, x, None, seed=1, fused=False)
    y_fused, grads_fused, _ = run(attn, x, None, seed=1, fused=True)
    torch.testing.assert_close(y_fused, y_site, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(
        grads_fused["qkv.weight"], grads_site["qkv.weight"], rtol=1e-3, atol=1e-3
    )


def test_chunked_noise_is_seeded_and_gumbel_distributed():
    shape = (3, CHUNK // 2 + 5)  # 3 chunks, the last one short
    pyro.set_rng_seed(0)
    first = gumbel(shape, torch.float32, torch.device("cpu"))
    pyro.set_rng_seed(0)
    again = gumbel(shape, torch.float32, torch.device("cpu"))
    assert torch.equal(first, again)
    flat = first.flatten()
    chunks = flat[: 3 * CHUNK // 2].view(-1, CHUNK // 2)
    assert not torch.equal(chunks[0], chunks[1])  # chunks have their own streams
    sample = flat[torch.randperm(len(flat))[:200_000]].double().numpy()
    assert stats.kstest(sample, stats.gumbel_r.cdf).pvalue > 1e-3
    assert abs(sample.mean() - 0.5772156649) < 0.01  # Euler–Mascheroni
    u = uniform((CHUNK + 1,), torch.float64, torch.device("cpu"))
    assert 0.0 <= u.min() and u.max() < 1.0


def test_fused_kernel_is_the_gumbel_softmax_of_the_same_noise():
    """softmax((q kᵀ + g) / τ) v written out, for the noise the kernel draws."""
    q, k, v = (torch.randn(2, 3, 6, 4, dtype=torch.float64) for _ in range(3))
    mask = torch.tensor([[True] * 6, [True] * 2 + [False] * 4])
    pyro.set_rng_seed(2)
    fused = fused_relaxed_attention(q, k, v, 5.0, mask)
    pyro.set_rng_seed(2)
    g = gumbel((2, 3, 6, 6), torch.float64, torch.device("cpu"))
    logits = (q @ k.transpose(-1, -2)).masked_fill(~mask[:, None, None, :], -torch.inf)
    weights = torch.softmax((logits + g) / 5.0, -1)
    assert (weights[1, :, :, 2:] == 0).all()
    torch.testing.assert_close(fused, weights @ v)


def test_dropout_on_the_fused_path_only_in_training():
    attn = StochasticAttention(8, 2, tau=2.0, dropout=0.5)
    x = torch.randn(2, 5, 8)
    with fused_attention():
        attn.eval()
        pyro.set_rng_seed(4)
        y_eval = attn(x, None)
        attn.train()
        pyro.set_rng_seed(4)
        y_train = attn(x, None)
    attn.eval()
    pyro.set_rng_seed(4)
    y_site = attn(x, None)  # no dropout in eval: the site path's value
    torch.testing.assert_close(y_eval, y_site)
    assert not torch.allclose(y_train, y_eval)


def test_self_guided_model_takes_the_fused_path_and_records_no_attention_site(digits):
    classifier = build_classifier(tiny_spec("h_sto"), digits)
    inputs = digits.train.inputs[:4]
    model_trace = poutine.trace(classifier).get_trace(inputs)
    hidden_trace = poutine.trace(self_guided(classifier)).get_trace(inputs)
    sites = {"encoder.layers.0.attn.a_c", "encoder.layers.0.attn.a_v"}
    assert sites <= set(model_trace.nodes)
    assert not sites & set(hidden_trace.nodes)
    pyro.set_rng_seed(9)
    site_probs = poutine.trace(classifier).get_trace(inputs).nodes["probs"]["value"]
    pyro.set_rng_seed(9)
    fused_probs = poutine.trace(self_guided(classifier)).get_trace(inputs).nodes["probs"]["value"]
    torch.testing.assert_close(fused_probs, site_probs)


def test_fused_path_matches_the_site_path_in_float32_on_the_device(device):
    attn = layer("h_sto").to(device)
    x = torch.randn(4, 9, 16, device=device)
    y_site, grads_site, _ = run(attn, x, None, seed=3, fused=False)
    y_fused, grads_fused, _ = run(attn, x, None, seed=3, fused=True)
    torch.testing.assert_close(y_fused, y_site, rtol=1e-4, atol=1e-5)
    for param in grads_site:
        torch.testing.assert_close(grads_fused[param], grads_site[param], rtol=1e-3, atol=1e-4)
