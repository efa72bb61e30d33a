"""Attention kinds: the paper's equations, recomputed independently from the traced sites, on
the ``--device`` of the test run."""

from __future__ import annotations

import math

import pyro
import pytest
import torch
import torch.nn.functional as F
from pyro import poutine
from pyro.distributions import RelaxedOneHotCategorical, RelaxedOneHotCategoricalStraightThrough

from probtrans.nn import HierarchicalStochasticAttention, SoftmaxAttention, StochasticAttention

B, L, D, H = 3, 5, 8, 2


def heads(attn, x):
    """Independent recomputation of the per-head q, k, v: (B, H, L, d_head)."""
    q, k, v = (x @ attn.qkv.weight.T + attn.qkv.bias).split(D, dim=-1)
    return [t.view(B, L, H, D // H).transpose(1, 2) for t in (q, k, v)]


def output(attn, weights, v):
    """out-projection of (attention weights @ v) merged over heads."""
    h = (weights @ v).transpose(1, 2).reshape(B, L, D)
    return h @ attn.out.weight.T + attn.out.bias


@pytest.fixture
def x(device):
    return torch.randn(B, L, D, device=device)


@pytest.fixture
def padding(device):
    mask = torch.ones(B, L, dtype=torch.bool, device=device)
    mask[0, 3:] = False
    mask[2, 1:] = False
    return mask


def test_softmax_matches_handwritten_scaled_dot_product(x, padding):
    attn = SoftmaxAttention(D, H).to(x.device)
    q, k, v = heads(attn, x)
    logits = q @ k.transpose(-1, -2) / math.sqrt(D // H)
    weights = logits.masked_fill(~padding[:, None, None, :], -math.inf).softmax(-1)
    torch.testing.assert_close(attn(x, padding), output(attn, weights, v))


def test_sto_site_is_relaxed_categorical_of_qk_and_output_uses_the_sample(x, padding):
    attn = StochasticAttention(D, H, tau=3.0).to(x.device)
    trace = poutine.trace(attn).get_trace(x, padding)
    site = trace.nodes["a_v"]
    fn = site["fn"].base_dist
    assert isinstance(fn, RelaxedOneHotCategorical)
    assert site["fn"].event_shape == (H, L, L) and site["fn"].batch_shape == (B,)
    assert fn.temperature.item() == 3.0
    q, k, v = heads(attn, x)
    expected = (q @ k.transpose(-1, -2)).masked_fill(~padding[:, None, None, :], -math.inf)
    torch.testing.assert_close(fn.logits, expected - expected.logsumexp(-1, keepdim=True))
    a_v = site["value"]
    torch.testing.assert_close(a_v.sum(-1), torch.ones(B, H, L, device=x.device))
    torch.testing.assert_close(trace.nodes["_RETURN"]["value"], output(attn, a_v, v))


@pytest.mark.parametrize("kind", [StochasticAttention, HierarchicalStochasticAttention])
def test_padding_keys_get_exactly_zero_weight(kind, x, padding):
    attn = kind(D, H).to(x.device)
    trace = poutine.trace(attn).get_trace(x, padding)
    a_v = trace.nodes["a_v"]["value"]  # (B, H, L, L)
    assert torch.all(a_v[0, :, :, 3:] == 0) and torch.all(a_v[2, :, :, 1:] == 0)
    assert torch.all(a_v[1] > 0)
    # the content of padding tokens cannot leak into the other tokens' outputs
    x2 = x.clone()
    x2[0, 3:] = 100.0
    pyro.set_rng_seed(1)
    y1 = attn(x, padding)
    pyro.set_rng_seed(1)
    y2 = attn(x2, padding)
    torch.testing.assert_close(y1[0, :3], y2[0, :3])


def test_sto_hard_samples_average_to_softmax_attention(x):
    """Gumbel-max: the mean of one-hot samples of Categorical(logits) is softmax(logits)."""
    attn = StochasticAttention(D, H, hard=True).to(x.device)
    q, k, _ = heads(attn, x)
    draws = torch.stack(
        [poutine.trace(attn).get_trace(x, None).nodes["a_v"]["value"] for _ in range(4000)]
    )
    assert set(draws.unique().tolist()) == {0.0, 1.0}
    expected = (q @ k.transpose(-1, -2)).softmax(-1)
    assert (draws.mean(0) - expected).abs().max() < 0.05


def test_straight_through_passes_gradients(x):
    attn = HierarchicalStochasticAttention(D, H, hard=True).to(x.device)
    attn(x, None).sum().backward()
    assert attn.qkv.weight.grad.abs().sum() > 0 and attn.centroids.grad.abs().sum() > 0
    trace = poutine.trace(attn).get_trace(x, None)
    assert isinstance(trace.nodes["a_c"]["fn"].base_dist, RelaxedOneHotCategoricalStraightThrough)


@pytest.mark.parametrize("centroids", ["layer", "head"])
def test_h_sto_follows_eq_14_to_17(centroids, x, padding):
    attn = HierarchicalStochasticAttention(
        D, H, tau1=0.5, tau2=7.0, n_centroids=3, centroids=centroids
    ).to(x.device)
    assert attn.centroids.shape == ((H,) if centroids == "head" else ()) + (D // H, 3)
    trace = poutine.trace(attn).get_trace(x, padding)
    q, k, v = heads(attn, x)
    C = attn.centroids
    a_c_site, a_v_site = trace.nodes["a_c"], trace.nodes["a_v"]
    assert a_c_site["fn"].event_shape == (H, L, 3)
    assert a_c_site["fn"].base_dist.temperature.item() == 0.5
    assert a_v_site["fn"].base_dist.temperature.item() == 7.0
    logits_c = k @ C  # Eq. 14
    torch.testing.assert_close(
        a_c_site["fn"].base_dist.logits, logits_c - logits_c.logsumexp(-1, keepdim=True)
    )
    k_hat = a_c_site["value"] @ C.transpose(-1, -2)  # Eq. 15
    logits_v = (q @ k_hat.transpose(-1, -2)).masked_fill(~padding[:, None, None, :], -math.inf)
    torch.testing.assert_close(  # Eq. 16
        a_v_site["fn"].base_dist.logits, logits_v - logits_v.logsumexp(-1, keepdim=True)
    )
    torch.testing.assert_close(  # Eq. 17
        trace.nodes["_RETURN"]["value"], output(attn, a_v_site["value"], v)
    )


def test_relaxed_sample_equals_gumbel_softmax_of_the_same_noise(x):
    """Eq. 11: â = softmax((logits + g) / τ) with g = −log(−log u); Pyro's rsample draws u."""
    attn = StochasticAttention(D, H, tau=2.0).to(x.device)
    q, k, _ = heads(attn, x)
    logits = q @ k.transpose(-1, -2)
    pyro.set_rng_seed(3)
    a_v = poutine.trace(attn).get_trace(x, None).nodes["a_v"]["value"]
    pyro.set_rng_seed(3)
    u = torch.rand(logits.shape, device=x.device).clamp(
        torch.finfo(logits.dtype).tiny, 1 - torch.finfo(logits.dtype).eps
    )
    g = -torch.log(-torch.log(u))
    logits = logits - logits.logsumexp(-1, keepdim=True)
    torch.testing.assert_close(a_v, F.softmax((logits + g) / 2.0, dim=-1))
