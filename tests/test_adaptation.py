"""Inference-time adaptation (Movellan & Gabbur 2020, Eq. 26–38): EM monotonicity, limits,
closed forms against numerical maximisers, and how corrections propagate."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from probtrans.attention.em_adaptation import (
    adapt_keys,
    adapt_precision,
    adapting,
    corrections_objective,
    em_corrections,
    em_keys,
    em_precision,
    key_objective,
    mixture_layers,
    propagate_corrections,
)
from probtrans.attention.gaussian_mixture import (
    Mixture,
    infer_values,
    log_joint,
    mask_units,
    responsibilities,
    square_distance,
)
from probtrans.nn import GaussianMixtureAttention
from probtrans.segmentation import SegmentationModel, SegmentationSpec

TOL = 1e-9


def random_problem(
    seed: int, n: int = 9, d: int = 4, m: int = 3, simplex: bool = False, device: str = "cpu"
):
    """Queries (2, 3, n, d) and a float64 mixture with per-unit precisions, row-specific
    priors and one padding unit in the second batch element, on ``device``."""
    g = torch.Generator().manual_seed(seed)
    opts = {"generator": g, "dtype": torch.float64}
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, -1] = False
    values = torch.randn(2, 3, n, m, **opts)
    mix = Mixture(
        keys=torch.randn(2, 3, n, d, **opts),
        values=values.softmax(-1) if simplex else values,
        alpha=torch.rand(2, 3, n, **opts) + 0.3,
        beta=torch.rand(2, 3, n, **opts) + 0.5,
        log_prior=mask_units(torch.randn(2, 3, n, n, **opts), mask).log_softmax(-1),
        mask=mask,
    )
    q = 1.5 * torch.randn(2, 3, n, d, **opts)
    moved = {field.name: getattr(mix, field.name).to(device) for field in dataclasses.fields(mix)}
    return q.to(device), mix.replace(**moved)


def corrections_for(seed: int, n: int = 9, s: int = 3, m: int = 3, device: str = "cpu"):
    g = torch.Generator().manual_seed(100 + seed)
    index = torch.stack([torch.randperm(n - 1, generator=g)[:s] for _ in range(2)])
    return index.to(device), torch.randn(2, s, m, generator=g, dtype=torch.float64).to(device)


def maximise(objective, start: torch.Tensor, steps: int = 300) -> torch.Tensor:
    """Numerical maximiser: L-BFGS on −objective from ``start``."""
    x = start.clone().requires_grad_(True)
    optimiser = torch.optim.LBFGS(
        [x], max_iter=steps, tolerance_grad=1e-13, tolerance_change=0, line_search_fn="strong_wolfe"
    )

    def closure():
        optimiser.zero_grad()
        loss = -objective(x)
        loss.backward()
        return loss

    optimiser.step(closure)
    return x.detach()


# --------------------------------------------------------------------------- key adaptation
@pytest.mark.parametrize("theta_xi", [0.1, 1.0, 10.0])
def test_key_em_never_decreases_the_map_objective(theta_xi):
    for seed in range(3):
        q, mix = random_problem(seed)
        previous = key_objective(q, mix, mix.keys, theta_xi, mix.mask)
        for n_iter in range(1, 12):
            adapted = em_keys(q, mix, n_iter, theta_xi, query_mask=mix.mask)
            current = key_objective(q, adapted, mix.keys, theta_xi, mix.mask)
            assert (current >= previous - TOL).all()
            previous = current


def test_key_em_anchored_at_previous_iterate_increases_the_likelihood():
    q, mix = random_problem(4)
    previous = key_objective(q, mix, mix.keys, 0.0, mix.mask)
    for n_iter in range(1, 10):
        adapted = em_keys(q, mix, n_iter, 1.0, anchor="previous", query_mask=mix.mask)
        current = key_objective(q, adapted, mix.keys, 0.0, mix.mask)  # likelihood only
        assert (current >= previous - TOL).all()
        previous = current


def test_infinite_key_prior_precision_keeps_the_trained_keys():
    q, mix = random_problem(5)
    adapted = em_keys(q, mix, 5, theta_xi=1e12, query_mask=mix.mask)
    torch.testing.assert_close(adapted.keys, mix.keys, atol=1e-9, rtol=0)


def test_vanishing_key_prior_moves_keys_to_the_weighted_query_mean():
    """θ_ξ → 0, one query per unit: ξ_k = Σ_i w_ik q_i / Σ_i w_ik with w from ξ⁰ (Eq. 29)."""
    q, mix = random_problem(6)
    adapted = em_keys(q, mix, 1, theta_xi=1e-12, query_mask=mix.mask)
    w = responsibilities(q, mix) * mix.mask[:, None, :, None]
    expected = (w.transpose(-1, -2) @ q) / w.sum(-2).unsqueeze(-1)
    real = mix.mask[:, None, :, None].expand_as(expected)
    torch.testing.assert_close(adapted.keys[real], expected[real], atol=1e-8, rtol=1e-8)
    torch.testing.assert_close(adapted.keys[~real], mix.keys[~real])  # padding units stay


def test_key_update_is_the_maximiser_of_its_q_function():
    """Eq. 29 = argmax of Eq. 26 with w fixed: −θ/2 ‖ξ − ξ⁰‖² + Σ_i w_ik log N(q_i; ξ_k, α_k⁻¹)."""
    q, mix = random_problem(7)
    theta = 0.7
    w = responsibilities(q, mix) * mix.mask[:, None, :, None]

    def q_function(keys):
        fit = (w * log_joint(q, mix.replace(keys=keys)).masked_fill(w == 0, 0)).sum()
        return fit - 0.5 * theta * (keys - mix.keys).pow(2).sum()

    # the prior term log π is constant in ξ, so Q's maximiser is the closed form
    numeric = maximise(q_function, mix.keys)
    torch.testing.assert_close(
        em_keys(q, mix, 1, theta, query_mask=mix.mask).keys, numeric, atol=1e-6, rtol=1e-6
    )


# --------------------------------------------------------------------- precision adaptation
def precision_objective(q, mix, theta_alpha1, theta_alpha2, query_mask):
    """log Gamma(α; θ_α1, θ_α2) + Σ_i log p_i(q_i | α), what em_precision (Eq. 30) maximises:
    (B, H), over the real queries and units."""
    alpha = mix.alpha.expand(mix.keys.shape[:-1])
    prior = (theta_alpha1 - 1) * alpha.log() - theta_alpha2 * alpha
    fit = log_joint(q, mix).logsumexp(-1).masked_fill(~query_mask[:, None, :], 0.0)
    return fit.sum(-1) + prior.masked_fill(~mix.mask[:, None, :], 0.0).sum(-1)


@pytest.mark.parametrize("theta", [(2.0, 1.0), (5.0, None)])
def test_precision_em_never_decreases_the_map_objective(theta):
    for seed in range(3):
        q, mix = random_problem(seed)
        rate = (theta[0] - 1) / mix.alpha if theta[1] is None else theta[1]
        previous = precision_objective(q, mix, theta[0], rate, mix.mask)
        for n_iter in range(1, 12):
            adapted = em_precision(q, mix, n_iter, *theta, query_mask=mix.mask)
            current = precision_objective(q, adapted, theta[0], rate, mix.mask)
            assert (current >= previous - TOL).all()
            previous = current


def test_precision_update_is_the_maximiser_of_its_q_function():
    """Eq. 30 = argmax over α of Σ_i w_ik log N(q_i; ξ_k, α_k⁻¹ I) + log Gamma(α_k; θ1, θ2)."""
    q, mix = random_problem(8)
    theta1, theta2 = 3.0, 0.5
    w = responsibilities(q, mix) * mix.mask[:, None, :, None]
    d = q.shape[-1]

    def q_function(log_alpha):
        alpha = log_alpha.exp()
        fit = w * (
            0.5 * d * alpha.unsqueeze(-2).log()
            - 0.5 * alpha.unsqueeze(-2) * square_distance(q, mix.keys)
        )
        return fit.sum() + ((theta1 - 1) * log_alpha - theta2 * alpha).sum()

    numeric = maximise(q_function, mix.alpha.log()).exp()
    closed = em_precision(q, mix, 1, theta1, theta2, query_mask=mix.mask).alpha
    real = mix.mask[:, None, :].expand_as(closed)
    torch.testing.assert_close(closed[real], numeric[real], atol=1e-6, rtol=1e-6)


def test_precision_prior_centred_on_the_trained_alpha_keeps_unqueried_units():
    q, mix = random_problem(9)
    adapted = em_precision(q, mix, 3, 4.0, None, query_mask=mix.mask)
    padding = ~mix.mask[:, None, :].expand_as(adapted.alpha)
    torch.testing.assert_close(adapted.alpha[padding], mix.alpha[padding])


# ------------------------------------------------------------------------------ corrections
SETTINGS = [
    {"theta_mu": 0.5},
    {"theta_mu": 0.5, "theta_beta1": 3.0, "theta_beta2": 1.0},
    {"theta_mu": 1.0, "theta_beta1": 3.0, "theta_pi": 2.0},
    {"theta_mu": 0.1, "theta_pi": 0.5},
]


@pytest.mark.parametrize("settings", SETTINGS)
def test_corrections_em_never_decreases_the_posterior(settings, device):
    for seed in range(3):
        q, mix = random_problem(seed, device=device)
        index, values = corrections_for(seed, device=device)
        beta = None
        if "theta_beta1" in settings:
            rate = settings.get("theta_beta2") or (settings["theta_beta1"] - 1) / mix.beta
            beta = (settings["theta_beta1"], rate)

        previous = None
        for n_iter in range(10):
            adapted = em_corrections(q, mix, index, values, n_iter, **settings)
            current = corrections_objective(
                q, adapted, index, values, mix, settings["theta_mu"], beta, settings.get("theta_pi")
            )
            assert previous is None or (current >= previous - TOL).all()
            previous = current


def test_corrections_updates_are_the_maximisers_of_their_q_functions():
    """μ (Eq. 35), β (Eq. 37) and π (Eq. 38) against L-BFGS on the same Q with w fixed."""
    q, mix = random_problem(10)
    index, values = corrections_for(10)
    theta_mu, theta_b1, theta_b2, theta_pi = 0.3, 3.0, 0.8, 1.5
    n = q.shape[-2]
    rows = index[:, None, :, None]
    q_c = q.gather(2, rows.expand(-1, 3, -1, q.shape[-1]))
    prior_c = mix.log_prior.gather(2, rows.expand(-1, 3, -1, n))
    w = responsibilities(q_c, mix.replace(log_prior=prior_c), values.unsqueeze(1))  # Eq. 36
    adapted = em_corrections(q, mix, index, values, 1, theta_mu, theta_b1, theta_b2, theta_pi)
    real = mix.mask[:, None, :].expand(-1, 3, -1)

    def q_mu(mu):
        sq = square_distance(values.unsqueeze(1), mu)  # (B, H, s, n)
        return (-0.5 * w * mix.beta.unsqueeze(-2) * sq).sum() - 0.5 * theta_mu * (
            mu - mix.values
        ).pow(2).sum()

    mu = maximise(q_mu, mix.values)
    torch.testing.assert_close(adapted.values[real], mu[real], atol=1e-6, rtol=1e-6)

    def q_beta(log_beta):
        beta = log_beta.exp().unsqueeze(-2)
        sq = square_distance(values.unsqueeze(1), adapted.values)  # with the new μ (ECM)
        fit = w * (0.5 * values.shape[-1] * beta.log() - 0.5 * beta * sq)
        return fit.sum() + ((theta_b1 - 1) * log_beta - theta_b2 * log_beta.exp()).sum()

    beta = maximise(q_beta, mix.beta.log()).exp()
    torch.testing.assert_close(adapted.beta[real], beta[real], atol=1e-6, rtol=1e-6)

    prior0_c = prior_c.exp()

    def q_pi(logits):
        log_pi = mask_units(logits, mix.mask).log_softmax(-1)
        weight = w + theta_pi * prior0_c  # Σ (w + θ_ik − 1) log π, θ_ik = 1 + θ_π π⁰_ik
        return (weight * log_pi.masked_fill(weight == 0, 0)).sum()

    pi = mask_units(maximise(q_pi, torch.zeros_like(prior_c)), mix.mask).softmax(-1)
    new_rows = adapted.log_prior.gather(2, rows.expand(-1, 3, -1, n)).exp()
    torch.testing.assert_close(new_rows, pi, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(
    "settings",
    [
        {"n_iter": 1, "theta_mu": 0.5},
        {"n_iter": 3, "theta_mu": 0.05},
        {"n_iter": 2, "theta_mu": 0.05, "theta_pi": 1.0},
    ],
)
@pytest.mark.parametrize("value_iterations", [1, 2])
def test_correcting_a_unit_never_makes_its_own_prediction_worse(settings, value_iterations):
    """Label units (μ on the simplex, one-hot corrections): the probability that the
    re-inferred (not clamped) value of the corrected unit gives its correct label does not drop."""
    for seed in range(20):
        q, mix = random_problem(seed, m=2, simplex=True)
        g = torch.Generator().manual_seed(seed)
        index = torch.randint(8, (2, 1), generator=g)
        label = torch.randint(2, (2, 1), generator=g)
        values = torch.nn.functional.one_hot(label, 2).to(torch.float64)  # (B, 1, 2)
        before = infer_values(q, mix, value_iterations)
        after = infer_values(q, em_corrections(q, mix, index, values, **settings), value_iterations)

        def correct_label(v, index=index, label=label):
            picked = v.gather(2, index[:, None, :, None].expand(-1, 3, -1, 2))  # (B, H, 1, 2)
            return picked.gather(-1, label[:, None, :, None].expand(-1, 3, -1, 1))

        assert (correct_label(after) >= correct_label(before) - 1e-12).all()


def test_corrections_reach_other_units_only_through_the_mixture():
    q, mix = random_problem(11)
    index, values = corrections_for(11)
    # (1) nothing moves without a value likelihood to update through
    flat = mix.replace(beta=None)
    unchanged = em_corrections(q, flat, index, values, 3, theta_mu=0.1)
    torch.testing.assert_close(infer_values(q, unchanged, 1), infer_values(q, flat, 1))
    # (2) units in another cluster, which no corrected unit selects, keep their values
    n, d = 8, 2
    keys = torch.cat([torch.full((4, d), 5.0), torch.full((4, d), -5.0)])
    keys = (keys + 0.1 * torch.randn(n, d, dtype=torch.float64)).expand(1, 1, n, d)
    clusters = Mixture(
        keys=keys,
        values=torch.rand(1, 1, n, 2, dtype=torch.float64),
        alpha=torch.full((1, 1, 1), 4.0, dtype=torch.float64),
        beta=torch.full((1, 1, 1), 1.0, dtype=torch.float64),
        log_prior=torch.zeros(1, 1, 1, n, dtype=torch.float64).log_softmax(-1),
    )
    corrected = em_corrections(
        keys,
        clusters,
        torch.tensor([[0, 1]]),
        torch.tensor([[[1.0, 0.0], [1.0, 0.0]]], dtype=torch.float64),
        n_iter=3,
        theta_mu=0.1,
        theta_pi=1.0,
    )
    before, after = infer_values(keys, clusters, 2), infer_values(keys, corrected, 2)
    torch.testing.assert_close(after[..., 4:, :], before[..., 4:, :], atol=1e-12, rtol=0)
    assert (after[..., 2:4, 0] > before[..., 2:4, 0] + 0.05).all()  # the corrected cluster moves


# ------------------------------------------------------------------ one call on a model
def tiny_segmentation_model() -> SegmentationModel:
    spec = SegmentationSpec()
    spec.network.d_model, spec.network.n_heads, spec.network.n_layers = 16, 2, 1
    torch.manual_seed(0)
    return SegmentationModel(spec.network)


def test_model_level_calls_are_differentiable_and_restore_the_model():
    model = tiny_segmentation_model()
    images = torch.rand(4, 8, 8)
    plain = model(images)
    for output in (
        adapt_keys(model, images, n_iter=2, theta_xi=1.0),
        adapt_precision(model, images, n_iter=2, theta_alpha1=3.0),
        propagate_corrections(
            model,
            images,
            index=torch.tensor([[0, 5]] * 4),
            values=torch.tensor([[[0.0, 1.0], [1.0, 0.0]]] * 4),
            n_iter=2,
            theta_mu=0.1,
            theta_beta1=3.0,
            theta_pi=1.0,
        ),
    ):
        assert output.shape == plain.shape and torch.isfinite(output).all()
        output.sum().backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert all(layer.adaptation is None for layer in mixture_layers(model))
    torch.testing.assert_close(model(images), plain)
    # a strong key prior leaves the model as trained
    torch.testing.assert_close(adapt_keys(model, images, theta_xi=1e12), plain)


def test_adaptation_in_attention_layers_changes_their_output():
    torch.manual_seed(0)
    layer = GaussianMixtureAttention(16, 2, beta=1.0)
    x = torch.randn(2, 5, 16)
    plain = layer(x)
    adapted = adapt_keys(layer, x, n_iter=3, theta_xi=0.01)
    assert not torch.allclose(adapted, plain)
    with pytest.raises(ValueError, match="no Gaussian-mixture"):
        with adapting(torch.nn.Linear(2, 2), lambda q, mix: mix):
            pass
