"""Gaussian-mixture attention (Movellan & Gabbur 2020): softmax limit, EM value inference."""

from __future__ import annotations

import math

import pytest
import torch

from probtrans.attention.gaussian_mixture import (
    Mixture,
    infer_values,
    log_joint,
    mask_units,
    responsibilities,
    value_m_step,
)
from probtrans.classifier import build_classifier
from probtrans.data import load_data
from probtrans.errors import ConfigError
from probtrans.nn import GaussianMixtureAttention, SoftmaxAttention
from probtrans.resolve import load_model_spec
from probtrans.specs import ModelSpec
from probtrans.specs.attention import GaussianMixtureOptions

B, L = 3, 7


def random_heads(n_heads: int, d_head: int, seed: int = 0, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(3, B, n_heads, L, d_head, generator=generator, dtype=dtype).unbind(0)
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[0, 5:] = False  # two padding tokens in the first sequence
    mask[2, 3:] = False
    return q, k, v, mask


def random_mixture(seed: int = 0, n: int = 9, d: int = 4, m: int = 3):
    """Per-unit precisions, row-specific priors, one padding unit: (queries, mixture), float64."""
    g = torch.Generator().manual_seed(seed)
    opts = {"generator": g, "dtype": torch.float64}
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, -1] = False
    log_prior = mask_units(torch.randn(2, 3, n, n, **opts), mask).log_softmax(-1)
    mix = Mixture(
        keys=torch.randn(2, 3, n, d, **opts),
        values=torch.randn(2, 3, n, m, **opts),
        alpha=torch.rand(2, 3, n, **opts) + 0.3,
        beta=torch.rand(2, 3, n, **opts) + 0.3,
        log_prior=log_prior,
        mask=mask,
    )
    return 1.5 * torch.randn(2, 3, n, d, **opts), mix


@pytest.mark.parametrize("n_heads", [1, 2, 4])
def test_beta_none_with_length_priors_is_softmax_attention(n_heads):
    """β → 0 and the Eq. 16–17 priors give softmax(α q·k) (Eq. 20–21) with α = 1/√d_head."""
    d_head = 8
    q, k, v, mask = random_heads(n_heads, d_head, seed=n_heads)
    softmax = SoftmaxAttention(n_heads * d_head, n_heads)
    for n_iter in (1, 3):
        gm = GaussianMixtureAttention(n_heads * d_head, n_heads, n_iter=n_iter)
        expected = softmax.attend(q, k, v, mask)
        torch.testing.assert_close(gm.attend(q, k, v, mask), expected, atol=2e-6, rtol=1e-5)


def test_alpha_is_the_inverse_softmax_temperature():
    q, k, v, mask = random_heads(2, 8, seed=3)
    softmax = SoftmaxAttention(16, 2, tau=0.7)
    gm = GaussianMixtureAttention(16, 2, alpha=1 / 0.7)
    torch.testing.assert_close(
        gm.attend(q, k, v, mask), softmax.attend(q, k, v, mask), atol=2e-6, rtol=1e-5
    )


@pytest.mark.parametrize("n_heads", [1, 4])
def test_beta_to_zero_converges_to_softmax_attention(n_heads):
    """Several EM iterations with β > 0 approach softmax attention as β → 0, linearly in β."""
    q, k, v, mask = random_heads(n_heads, 4, seed=5, dtype=torch.float64)
    softmax = SoftmaxAttention(4 * n_heads, n_heads).double()
    expected = softmax.attend(q, k, v, mask)
    errors = []
    for beta in (1e-1, 1e-3, 1e-5, 1e-7):
        gm = GaussianMixtureAttention(4 * n_heads, n_heads, beta=beta, n_iter=4).double()
        errors.append((gm.attend(q, k, v, mask) - expected).abs().max().item())
    assert errors[-1] < 1e-6
    for larger, smaller in zip(errors, errors[1:], strict=False):
        assert smaller < 0.05 * larger


def test_length_priors_give_eq_19():
    """With Eq. 16–17 priors and shared precisions, w_ij = softmax_j(α ξ_j·q_i + β μ_j·v_i)."""
    q, k, v, mask = random_heads(2, 4, seed=7, dtype=torch.float64)
    gm = GaussianMixtureAttention(8, 2, alpha=0.8, beta=0.6)
    mix = gm.double().units.mixture(k, v, mask)
    estimate = torch.randn(q.shape, dtype=torch.float64)
    scores = 0.8 * q @ k.transpose(-1, -2) + 0.6 * estimate @ v.transpose(-1, -2)
    expected = mask_units(scores, mask).softmax(-1)
    torch.testing.assert_close(responsibilities(q, mix, estimate), expected)


@pytest.mark.parametrize("prior", ["length", "uniform", "learned"])
@pytest.mark.parametrize("precision", ["fixed", "shared", "head", "unit"])
def test_padding_units_get_exactly_zero_responsibility(prior, precision):
    q, k, v, mask = random_heads(2, 4, seed=11)
    gm = GaussianMixtureAttention(8, 2, beta=1.0, n_iter=3, prior=prior, precision=precision)
    w = responsibilities(q, gm.units.mixture(k, v, mask), v)
    assert (w[0, :, :, 5:] == 0).all() and (w[2, :, :, 3:] == 0).all()
    k2, v2 = k.clone(), v.clone()
    k2[0, :, 5:] += 100.0  # whatever the padding tokens hold, real outputs do not change
    v2[0, :, 5:] -= 100.0
    torch.testing.assert_close(gm.attend(q, k2, v2, mask), gm.attend(q, k, v, mask))


def test_value_em_never_decreases_its_objective():
    """EM on log p_i(v | q_i) (Eq. 3–15), per-unit α, β and row priors: monotone."""
    for seed in range(5):
        q, mix = random_mixture(seed)
        v = value_m_step(responsibilities(q, mix), mix)
        previous = log_joint(q, mix, v).logsumexp(-1)  # log p_i(q_i, v_i)
        for _ in range(15):
            v = value_m_step(responsibilities(q, mix, v), mix)
            current = log_joint(q, mix, v).logsumexp(-1)
            assert (current >= previous - 1e-10).all()
            previous = current
        assert torch.isfinite(previous).all()


def test_value_m_step_is_the_maximiser_of_q():
    """Closed form (Eq. 13) = gradient ascent on Q(v) = Σ_j w_ij log N(v; μ_j, β_j⁻¹ I)."""
    q, mix = random_mixture(1)
    w = responsibilities(q, mix, torch.zeros(*q.shape[:-1], 3, dtype=torch.float64))
    closed = value_m_step(w, mix)
    v = torch.zeros_like(closed, requires_grad=True)
    optimiser = torch.optim.LBFGS([v], max_iter=200, tolerance_grad=1e-12, tolerance_change=0)

    def negative_q():
        optimiser.zero_grad()
        sq = (v.unsqueeze(-2) - mix.values.unsqueeze(-3)).pow(2).sum(-1)  # (B, H, L, n)
        loss = (w * 0.5 * mix.beta.unsqueeze(-2) * sq).sum()
        loss.backward()
        return loss

    optimiser.step(negative_q)
    torch.testing.assert_close(v.detach(), closed, atol=1e-7, rtol=1e-6)


def test_infer_values_with_one_iteration_is_the_query_posterior_mean():
    q, mix = random_mixture(2)
    torch.testing.assert_close(infer_values(q, mix, 1), value_m_step(responsibilities(q, mix), mix))


def test_gaussian_mixture_attention_trains_inside_the_classifier(device):
    spec = ModelSpec()
    spec.network.d_model, spec.network.n_heads, spec.network.n_layers = 16, 2, 1
    spec.network.attention = GaussianMixtureOptions(
        beta=1.0, precision="head", prior="length", n_iter=2
    )
    data = load_data(spec.data)
    model = build_classifier(spec, data).to(device)
    inputs, labels = data.train.inputs[:8].to(device), data.train.labels[:8].to(device)
    logits = model(inputs, None, labels)
    assert logits.shape == (8, data.n_classes) and torch.isfinite(logits).all()
    torch.nn.functional.cross_entropy(logits, labels).backward()
    units = model.encoder.layers[0].attn.units
    assert units.log_alpha.grad is not None and torch.isfinite(units.log_alpha.grad).all()
    assert torch.isfinite(units.log_beta.grad).all()


def test_model_spec_accepts_and_checks_gaussian_mixture(tmp_path):
    path = tmp_path / "gm.toml"
    path.write_text(
        '[model.attention]\nkind = "gaussian_mixture"\nbeta = 0.5\nn_iter = 3\n'
        'precision = "unit"\nprior = "learned"\n'
    )
    options = load_model_spec(path).network.attention
    assert (options.beta, options.n_iter, options.precision) == (0.5, 3, "unit")
    path.write_text('[model.attention]\nkind = "gaussian_mixture"\nbeta = -1.0\n')
    with pytest.raises(ConfigError, match=r"gm\.toml: model\.attention\.beta = -1\.0: must be > 0"):
        load_model_spec(path)
    path.write_text('[model.attention]\nkind = "gaussian_mixture"\ngamma = 1.0\n')
    with pytest.raises(ConfigError, match=r"gm\.toml: unknown key 'model\.attention\.gamma'"):
        load_model_spec(path)


def test_default_alpha_is_one_over_sqrt_d_head():
    gm = GaussianMixtureAttention(32, 2)
    assert math.isclose(gm.units.log_alpha.exp().item(), 16**-0.5, rel_tol=1e-6)
