"""SGPA: decoupled and standard sparse-GP attention, its KL terms, guides and specs.

Oracles: plain kernel attention, the non-whitened formulas of Chen & Li (2023, Eq. 11) solved
directly, Monte Carlo, GPyTorch's whitened ``VariationalStrategy`` and
``torch.distributions.kl_divergence``.
"""

from __future__ import annotations

import copy
import warnings

import gpytorch
import pyro
import pytest
import torch
import torch.nn.functional as F
from linear_operator.utils.errors import NotPSDError
from pyro import poutine
from pyro.infer import TraceMeanField_ELBO
from torch.distributions import MultivariateNormal, Normal, kl_divergence

import probtrans.gp.decoupled
import probtrans.gp.standard
from probtrans.attention.encoder import make_attention
from probtrans.classifier import build_classifier
from probtrans.gp import (
    decoupled_conditional,
    decoupled_conditional_reference,
    gram,
    head_kernel,
    jittered_cholesky,
    standard_posterior,
)
from probtrans.gp.residual import LARGEST_EXPONENT, SERIES_BELOW, FactoredKernel
from probtrans.guides.inducing import AutoInducingCholesky
from probtrans.inference.guide_builder import build_guide
from probtrans.inference.objective import self_guided
from probtrans.nn import SGPAttention, StandardSGPAttention
from probtrans.resolve import load_model_spec
from probtrans.runs.describe import site_table
from probtrans.runtime.paths import use_paths
from probtrans.specs import GuideSpec
from tests.conftest import ROOT, autocast_pass, relative_error, tiny_spec

B, H, T, DV, M, DK = 2, 2, 5, 3, 4, 3  # sequences, heads, tokens, value dims, inducing, key dims
F64 = torch.float64


@pytest.fixture
def gp_inputs(device):
    """Kernel (random per-head hyperparameters), keys, global keys, values, all float64, on the
    ``--device`` of the test run."""
    g = torch.Generator().manual_seed(1)
    kernel = head_kernel("ard", H, DK).double()
    kernel.base_kernel.lengthscale = torch.rand(H, 1, DK, generator=g, dtype=F64) + 1.0
    kernel.outputscale = torch.rand(H, generator=g, dtype=F64) + 0.5
    x_a = torch.randn(B, H, T, DK, generator=g, dtype=F64)
    x_g = torch.randn(H, M, DK, generator=g, dtype=F64)
    v_a = torch.randn(B, H, T, DV, generator=g, dtype=F64)
    loc = torch.randn(H, DV, M, generator=g, dtype=F64)
    scale_tril = torch.randn(H, DV, M, M, generator=g, dtype=F64).tril(-1) * 0.3
    scale_tril = scale_tril + torch.diag_embed(torch.rand(H, DV, M, generator=g, dtype=F64) + 0.2)
    return [t.to(device) for t in (kernel, x_a, x_g, v_a, loc, scale_tril)]


# ------------------------------------------------------------------ decoupled conditional
def test_without_global_points_the_mean_is_plain_kernel_attention(gp_inputs):
    kernel, x_a, _, v_a, _, _ = gp_inputs
    no_globals = x_a.new_zeros(H, 0, DK)
    conditional = decoupled_conditional(kernel, x_a, no_globals, v_a, jitter=1e-9)
    attention = gram(kernel, x_a, x_a) @ v_a  # K(q, k) v, (B, H, T, d)
    mean = conditional.mean(x_a.new_zeros(H, DV, 0))
    torch.testing.assert_close(mean, attention.transpose(-1, -2))


def test_moments_match_design_formulas_solved_directly(gp_inputs):
    """m_d, Σ_d of DESIGN §3 with v_g = L_K⁻ᵀ μ_d and S_g^d = L_K L_d L_dᵀ L_Kᵀ."""
    kernel, x_a, x_g, v_a, loc, scale_tril = gp_inputs
    jitter = 1e-6
    conditional = decoupled_conditional(kernel, x_a, x_g, v_a, jitter)
    mean, cov = conditional.moments(loc, scale_tril)

    k_qq = gram(kernel, x_a, x_a)
    k_qg = gram(kernel, x_a, x_g)  # (B, H, T, M)
    k_gg = gram(kernel, x_g, x_g) + jitter * torch.eye(M, dtype=F64, device=x_g.device)
    chol = torch.linalg.cholesky(k_gg)  # (H, M, M)
    for h in range(H):
        for d in range(DV):
            v_g = torch.linalg.solve(chol[h].T, loc[h, d])
            s_g = chol[h] @ scale_tril[h, d] @ scale_tril[h, d].T @ chol[h].T
            for b in range(B):
                kqg, kqq, va = k_qg[b, h], k_qq[b, h], v_a[b, h, :, d]
                m_d = kqq @ va - kqg @ torch.linalg.solve(k_gg[h], kqg.T @ va) + kqg @ v_g
                inv_kgq = torch.linalg.solve(k_gg[h], kqg.T)  # K_gg⁻¹ K_gq
                sigma_d = kqq + inv_kgq.T @ (s_g - k_gg[h]) @ inv_kgq
                torch.testing.assert_close(mean[b, h, d], m_d)
                torch.testing.assert_close(cov[b, h, d], sigma_d)


def test_amortised_kl_matches_design_formula(gp_inputs):
    kernel, x_a, x_g, v_a, _, _ = gp_inputs
    jitter = 1e-6
    conditional = decoupled_conditional(kernel, x_a, x_g, v_a, jitter)
    k_aa, k_ag = gram(kernel, x_a, x_a), gram(kernel, x_a, x_g)
    k_gg = gram(kernel, x_g, x_g) + jitter * torch.eye(M, dtype=F64, device=x_g.device)
    residual = k_aa - k_ag @ torch.linalg.solve(k_gg, k_ag.transpose(-1, -2))
    expected = 0.5 * torch.einsum("bhtd,bhts,bhsd->b", v_a, residual, v_a)
    torch.testing.assert_close(conditional.amortised_kl, expected)
    assert (conditional.amortised_kl > 0).all()


def test_float32_layers_compute_the_nystrom_term_in_float64():
    """½ vᵀ (K_aa − K_ag K_gg⁻¹ K_ga) v with v along the residual's smallest eigenvectors, the
    directions training pushed the values into. At the authors' IMDB kernel (exponential,
    ℓ = 54.6, σ_f² = 0.0183, M_g = 50) the residual's eigenvalues are 1e-8 to 1e-6 against kernel
    entries near 0.018. All-float32 arithmetic was 1.3 % off here (0.92 nats), and negative on a
    trained IMDB model; with K_aa v_a still in float32 it was 0.1 % off (0.08 nats). (Jitter 1e-7:
    with the authors' 1e-9, K_gg is so ill-conditioned that float64 references disagree among
    themselves in these directions.)"""
    g = torch.Generator().manual_seed(0)
    heads, tokens, inducing, dims = 2, 64, 50, 16
    kernel = head_kernel("exponential", heads, dims, lengthscale=54.6, outputscale=0.0183)
    x_a = torch.randn(1, heads, tokens, dims, generator=g)
    x_g = torch.randn(heads, inducing, dims, generator=g)

    kernel64, x_a64, x_g64 = copy.deepcopy(kernel).double(), x_a.double(), x_g.double()
    k_aa, k_ag = gram(kernel64, x_a64, x_a64), gram(kernel64, x_a64, x_g64)
    k_gg = gram(kernel64, x_g64, x_g64) + 1e-7 * torch.eye(inducing, dtype=F64)
    residual = (k_aa - k_ag @ torch.linalg.solve(k_gg, k_ag.transpose(-1, -2))).detach()
    v_a = (1e4 * torch.linalg.eigh(residual).eigenvectors[..., :dims]).float()  # (1, H, T, d)
    exact = 0.5 * torch.einsum("bhtd,bhts,bhsd->b", v_a.double(), residual, v_a.double())

    conditional = decoupled_conditional(kernel, x_a, x_g, v_a, jitter=1e-7)
    assert conditional.amortised_kl.dtype == torch.float32
    assert (conditional.amortised_kl.double() - exact).abs() <= 1e-6 * exact


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16-autocast"])
def test_the_fast_path_matches_float64_at_the_imdb_scales(autocast):
    """The decoupled conditional of a float32 layer built from models/imdb/sgpa.toml (σ_f² =
    0.0183, ℓ = 54.6, M_g = 50, T = 512, jitter 1e-9), on keys and values projected as the layer
    does from layer-normalised inputs, against the float64 reference on a float64 copy of the
    layer: the amortised mean (K_aa − K_ag K_gg⁻¹ K_ga) v_a, the conditional variances and the
    amortised KL, and their gradients with respect to the inputs and the kernel's
    hyperparameters. The mean and variances are differences of nearly equal matrices (variances
    3e-9 to 2e-7 against σ_f² = 0.0183): with K_aa and K_aa v_a in float32 the residual was 50 %
    off and the variances up to 40 %; the fast path's O(T²) part is float32 and within 1e-6
    (measured: 1.4e-7 for the mean, 7e-7 for the gradients). Under bfloat16 autocast, as
    training runs it, the layer's GP part leaves autocast (module docstring of
    :mod:`probtrans.attention.sgpa`), so the tolerance is the same."""
    options = load_model_spec(ROOT / "models" / "imdb" / "sgpa.toml").network.attention
    torch.manual_seed(0)
    layer = make_attention(options, 128, 8)
    layer64 = copy.deepcopy(layer).double()
    x = F.layer_norm(torch.randn(2, 512, 128), (128,))  # the pre-LN block's input to the layer
    weights = torch.randn(2, 8, 16, 512, dtype=F64)  # a linear functional of the mean

    def moments(conditional):
        return {
            "mean": conditional.amortised_mean,
            "variance": conditional.variance(),
            "kl": conditional.amortised_kl,
        }

    def moments_and_gradients(net, gp, inputs, bf16=False):
        net.zero_grad()
        inputs = inputs.clone().requires_grad_(True)
        x_a, v_a = net.project(inputs, None)  # as the layer computes them: autocast off
        x_g = net.global_keys()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            conditional = gp(net.kernel, x_a, x_g, v_a, options.jitter)
        values = moments(conditional)
        if gp is decoupled_conditional:  # the exact conditional of the same float32 inputs
            exact = decoupled_conditional_reference(
                copy.deepcopy(net.kernel).double(),
                *(t.detach().double() for t in (x_a, x_g, v_a)),
                options.jitter,
            )
            for name, value in moments(exact).items():
                assert relative_error(values[name].detach(), value.detach()) <= 1e-6, name
            variance = exact.variance().double()
            assert ((values["variance"].double() - variance).abs() <= 1e-6 * variance).all()
        losses = (values["kl"].sum(), (values["mean"] * weights).sum(), values["variance"].sum())
        grads = {}
        for name, loss in zip(("kl", "mean", "variance"), losses, strict=True):
            kernel = net.kernel
            wrt = [inputs, kernel.raw_outputscale, kernel.base_kernel.raw_lengthscale]
            grads[name] = torch.autograd.grad(loss, wrt, retain_graph=True)
        return values, grads

    fast, fast_grads = moments_and_gradients(layer, decoupled_conditional, x, autocast)
    _, exact_grads = moments_and_gradients(layer64, decoupled_conditional_reference, x.double())
    assert fast["variance"].dtype == fast["kl"].dtype == torch.float32
    for name, grads in fast_grads.items():
        for grad, reference in zip(grads, exact_grads[name], strict=True):
            assert relative_error(grad, reference) <= 1e-5, name


@pytest.mark.parametrize("name", ["exponential", "ard"])
def test_the_remainder_is_the_kernel_minus_its_linear_part(name):
    """R v of :class:`~probtrans.gp.residual.FactoredKernel` (chunked, recomputed in the backward
    pass) is (K − Φ Φᵀ) v with GPyTorch's kernel matrix K, over both branches of e₂ (|s| below
    and above 0.1), and its gradients pass ``gradcheck`` in float64, with respect to the inputs,
    the values and the hyperparameters σ_f² and ℓ."""
    torch.manual_seed(0)
    kernel = head_kernel(name, 2, 3, 1.3, 0.7).double()
    x_a = (0.6 * torch.randn(2, 2, 7, 3, dtype=F64)).requires_grad_()
    v_a = torch.randn(2, 2, 7, 4, dtype=F64, requires_grad=True)
    factored = FactoredKernel.of(kernel, F64)
    s = (x_a / kernel.base_kernel.lengthscale).detach()
    products = (s @ s.transpose(-1, -2)).abs()
    assert (products < SERIES_BELOW).any() and (products > SERIES_BELOW).any()
    features = factored.linear_features(factored.scaled(x_a))
    expected = (gram(kernel, x_a, x_a) - features @ features.transpose(-1, -2)) @ v_a
    torch.testing.assert_close(factored.residual_product(x_a, v_a), expected)

    scale = factored.outputscale.detach().clone().requires_grad_()
    lengths = factored.lengthscale.detach().clone().requires_grad_()

    def product(x, v, outputscale, lengthscale):
        return FactoredKernel(outputscale, lengthscale, name == "ard").residual_product(x, v)

    with use_paths(residual_chunk=100):  # several chunks
        assert torch.autograd.gradcheck(product, (x_a, v_a, scale, lengths))


def test_the_ard_remainder_is_formed_in_log_space_where_exp_would_overflow():
    """Sequences whose scaled keys have |x̃|² above LARGEST_EXPONENT (ARD kernel: exp(s) alone
    would overflow float32, a_i a_j exp(s_ij) ≤ 1 does not) beside sequences on the series
    branch, in chunks of two: in float32 the product is GPyTorch's (K − Φ Φᵀ) v (computed in
    float64) to float32 precision, and in float64 its gradients pass ``gradcheck``."""
    torch.manual_seed(0)
    kernel = head_kernel("ard", 2, 3, 1.0, 0.7).double()
    x_a = torch.randn(3, 2, 7, 3, dtype=F64)
    x_a[1] *= 8.0  # |x̃|² ≈ 190 > LARGEST_EXPONENT
    x_a[0] *= 0.2  # |s| well below SERIES_BELOW
    v_a = torch.randn(3, 2, 7, 4, dtype=F64)
    norms = x_a.pow(2).sum(-1).amax(-1)  # |x̃|², ℓ = 1
    assert (norms[1] > LARGEST_EXPONENT).all() and (norms[0] < SERIES_BELOW).all()
    factored = FactoredKernel.of(kernel, F64)
    features = factored.linear_features(factored.scaled(x_a))
    expected = (gram(kernel, x_a, x_a) - features @ features.transpose(-1, -2)) @ v_a

    with use_paths(residual_chunk=100):  # two rows per chunk
        fast = FactoredKernel.of(kernel, torch.float32).residual_product(x_a.float(), v_a.float())
        assert torch.isfinite(fast).all()
        assert relative_error(fast.detach().double(), expected.detach()) <= 1e-6

        x_a, v_a = x_a.requires_grad_(), v_a.requires_grad_()
        assert torch.autograd.gradcheck(factored.residual_product, (x_a, v_a))


@pytest.mark.parametrize("sampling", ["marginal", "full"])
def test_monte_carlo_over_u_g_matches_closed_form(gp_inputs, sampling):
    """Many draws ε ~ q(ε), then F ~ p(F | ε): sample mean and variance of F are m_d and
    diag Σ_d for both samplers; the full sampler also has the cross-token covariance Σ_d."""
    kernel, x_a, x_g, v_a, loc, scale_tril = gp_inputs
    conditional = decoupled_conditional(kernel, x_a, x_g, v_a, jitter=1e-6)
    mean, cov = conditional.moments(loc, scale_tril)
    n = 40_000
    torch.manual_seed(0)
    eps = MultivariateNormal(loc, scale_tril=scale_tril).sample((n, 1))  # (n, 1, H, d, M)
    f = conditional.distribution(eps, sampling).sample()  # (n, B, H, d, T)
    variance = cov.diagonal(dim1=-2, dim2=-1)
    standard_error = (variance / n).sqrt()
    assert ((f.mean(0) - mean).abs() < 5 * standard_error).all()
    torch.testing.assert_close(f.var(0), variance, rtol=0.05, atol=1e-3)
    if sampling == "full":
        centred = f - f.mean(0)
        sample_cov = torch.einsum("nbhdt,nbhds->bhdts", centred, centred) / (n - 1)
        torch.testing.assert_close(sample_cov, cov, rtol=0.0, atol=0.05 * variance.max().item())


# ------------------------------------------------------------------ global KL and its guide
def test_global_kl_equals_gpytorch_and_torch(gp_inputs):
    """The KL of the u_g site that the ELBO uses (cholesky guide vs the layer's N(0, I) prior)
    equals GPyTorch's whitened VariationalStrategy KL and torch's MVN KL, same parameters."""
    _, _, _, _, loc, scale_tril = gp_inputs
    loc, scale_tril = loc.float(), scale_tril.float()
    layer = SGPAttention(H * DV, H, kernel="ard", n_inducing=M).to(loc.device)

    def model():  # the layer's forward pass, with only its inducing site visible
        return poutine.block(layer, expose=["u_g"])(torch.randn(1, T, H * DV, device=loc.device))

    guide = AutoInducingCholesky(model)
    guide()
    guide.locs.u_g = loc
    guide.scale_trils.u_g = scale_tril
    ours = TraceMeanField_ELBO().loss(model, guide)  # no data: the loss is exactly the KL

    class WhitenedGP(gpytorch.models.ApproximateGP):
        def __init__(self):
            variational = gpytorch.variational.CholeskyVariationalDistribution(
                M, batch_shape=torch.Size([H, DV])
            )
            strategy = gpytorch.variational.VariationalStrategy(
                self, torch.randn(H, DV, M, 1), variational, learn_inducing_locations=False
            )
            super().__init__(strategy)

    gp = WhitenedGP().to(loc.device)
    gp.variational_strategy._variational_distribution.variational_mean.data = loc
    gp.variational_strategy._variational_distribution.chol_variational_covar.data = scale_tril
    from_gpytorch = gp.variational_strategy.kl_divergence().sum().item()
    eye = torch.eye(M, device=loc.device)
    standard = MultivariateNormal(torch.zeros(M, device=loc.device), scale_tril=eye)
    from_torch = kl_divergence(MultivariateNormal(loc, scale_tril=scale_tril), standard).sum()
    assert ours == pytest.approx(from_gpytorch, rel=1e-4)
    assert ours == pytest.approx(from_torch.item(), rel=1e-4)


def sgpa_classifier(digits, **attention):
    options = {"kernel": "ard", "n_inducing": 4, "lengthscale": 4.0, "outputscale": 0.1}
    return build_classifier(tiny_spec("sgpa", prior="last_layer", **(options | attention)), digits)


@pytest.mark.parametrize("inducing", ["cholesky", "diagonal", "delta"])
def test_every_inducing_guide_trains_with_decreasing_loss(digits, inducing, device):
    classifier = sgpa_classifier(digits).to(device)
    model = self_guided(classifier)
    spec = GuideSpec(name="delta", inducing=inducing)
    guide = build_guide(classifier, spec, digits.train, device)
    index, inputs, mask, labels = next(digits.train.batches(64))  # images: mask is None
    index, inputs, labels = index.to(device), inputs.to(device), labels.to(device)
    n = len(digits.train)
    guide(inputs, mask, labels)
    guide_sites = set(poutine.trace(guide).get_trace(inputs, mask, labels).nodes)
    assert {"encoder.layers.0.attn.u_g", "head.weight", "head.bias"} <= guide_sites
    params = list(classifier.parameters()) + list(guide.parameters())
    optimizer = torch.optim.Adam(params, lr=0.02)
    elbo = TraceMeanField_ELBO()
    losses = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(40):
            optimizer.zero_grad()
            loss = elbo.differentiable_loss(
                model, guide, inputs, mask, labels, index=index, n_data=n
            )
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-5:]) < 0.8 * sum(losses[:5])


def test_amortised_kl_is_a_per_example_factor_in_the_data_plate(digits):
    """The model adds −N/B Σ_b KL_amortised,b: the per-dataset ELBO's Σ_n KL_amortised,n."""
    classifier = sgpa_classifier(digits)
    index, inputs, mask, labels = next(digits.train.batches(8))
    n = len(digits.train)
    trace = poutine.trace(classifier).get_trace(inputs, mask, labels, index=index, n_data=n)
    site = trace.nodes["encoder.layers.0.attn.kl_amortised"]
    assert site["scale"] == pytest.approx(n / len(inputs))
    assert [frame.name for frame in site["cond_indep_stack"]] == ["data"]
    log_factor = site["fn"].log_prob(site["value"])
    assert log_factor.shape == (len(inputs),) and (log_factor < 0).all()
    assert trace.nodes["encoder.layers.0.attn.u_g"]["cond_indep_stack"] == ()


# ------------------------------------------------------------------ numerics and padding
def test_ill_conditioned_k_gg_is_retried_with_more_jitter():
    g = torch.Generator().manual_seed(0)
    rank_one = torch.ones(H, M, M) * 1e4 + torch.randn(H, M, M, generator=g) * 1e-3
    rank_one = (rank_one + rank_one.transpose(-1, -2)) / 2
    assert torch.linalg.cholesky_ex(rank_one + 1e-9 * torch.eye(M))[1].any()  # fails as given
    chol = jittered_cholesky(rank_one, jitter=1e-9)
    assert torch.isfinite(chol).all()
    jitter = (chol @ chol.transpose(-1, -2) - rank_one).diagonal(dim1=-2, dim2=-1).mean()
    assert 1e-9 < jitter.item() < 10.0  # some larger jitter was added, not an arbitrary one
    with pytest.raises(NotPSDError):
        jittered_cholesky(torch.full((M, M), float("nan")), jitter=1e-9)


@pytest.mark.parametrize("sampling", ["marginal", "full"])
def test_layer_with_coincident_global_points_gives_finite_outputs(sampling, device):
    layer = SGPAttention(8, H, kernel="exponential", n_inducing=M, jitter=1e-9, sampling=sampling)
    layer.to(device)
    with torch.no_grad():
        layer.z_g.copy_(layer.z_g[:, :1].expand_as(layer.z_g))  # K_gg of rank one
        layer.kernel.outputscale = torch.full((H,), 50.0, device=device)
    x = torch.randn(B, T, 8, device=device)
    out = poutine.trace(layer).get_trace(x).nodes["_RETURN"]["value"]
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("kind", [SGPAttention, StandardSGPAttention])
def test_padding_tokens_do_not_change_real_outputs(kind, device):
    """Changing the padding tokens leaves the outputs' distribution at real tokens unchanged."""
    layer = kind(8, H, kernel="ard", lengthscale=2.0).to(device)
    x = torch.randn(B, T, 8, device=device)
    mask = torch.ones(B, T, dtype=torch.bool, device=device)
    mask[1, 3:] = False
    other = x.clone()
    other[1, 3:] = torch.randn(2, 8, device=device) * 5.0
    outputs = []
    for inputs in (x, other):
        pyro.set_rng_seed(3)
        outputs.append(poutine.trace(layer).get_trace(inputs, mask).nodes["_RETURN"]["value"])
    torch.testing.assert_close(outputs[0][mask], outputs[1][mask])


@pytest.mark.parametrize("correction", ["zero", "identity"])
def test_a_softmax_prior_mean_shifts_the_mean_by_softmax_attention(device, correction):
    """prior_mean = "softmax": F | u_g is softmax(q qᵀ / √d) v over the real tokens (computed
    here with F.softmax) plus a GP of corrections with amortised values v R_h. At the start
    (R_h = 0) its mean is softmax attention plus the global part and its amortised KL is zero;
    with R_h = I it is the zero-mean layer's distribution shifted by softmax attention, with the
    same variances and amortised KL."""
    zero = SGPAttention(8, H, kernel="ard", n_inducing=M, lengthscale=2.0).to(device)
    shifted = SGPAttention(8, H, kernel="ard", n_inducing=M, lengthscale=2.0, prior_mean="softmax")
    shifted.load_state_dict(zero.state_dict(), strict=False)
    shifted.to(device)
    if correction == "identity":
        with torch.no_grad():
            shifted.correction.copy_(torch.eye(zero.d_head).expand(H, -1, -1))
    x = torch.randn(B, T, 8, device=device)
    mask = torch.ones(B, T, dtype=torch.bool, device=device)
    mask[1, 3:] = False
    sites = []
    for layer in (zero, shifted):
        pyro.set_rng_seed(5)
        trace = poutine.trace(layer).get_trace(x, mask)
        sites.append({name.rsplit(".", 1)[-1]: node for name, node in trace.nodes.items()})
    q, v = zero.project(x, mask)  # (B, H, T, d)
    logits = (q @ q.transpose(-1, -2) / q.shape[-1] ** 0.5).masked_fill(~mask[:, None, None], -1e9)
    softmax = (logits.softmax(-1) @ v).transpose(-1, -2)  # (B, H, d, T)
    f0, f1 = (site["f"]["fn"] for site in sites)
    torch.testing.assert_close(f1.base_dist.scale, f0.base_dist.scale)
    kl0, kl1 = (-site["kl_amortised"]["fn"].log_factor for site in sites)  # (B,)
    if correction == "identity":
        torch.testing.assert_close(f1.base_dist.loc - f0.base_dist.loc, softmax)
        torch.testing.assert_close(kl1, kl0)
    else:
        u_g = sites[1]["u_g"]["value"]  # (H, d, M): the global part A^T u_g alone remains
        keys = zero.global_keys()
        cond = decoupled_conditional(zero.kernel, q, keys, torch.zeros_like(v), zero.jitter, mask)
        torch.testing.assert_close(f1.base_dist.loc, softmax + cond.mean(u_g))
        assert torch.equal(kl1, torch.zeros_like(kl1)) and kl0.min() > 0


# ------------------------------------------------------------------ mixed precision
@pytest.mark.parametrize(
    "kind, options",
    [
        (SGPAttention, {"kernel": "exponential", "n_inducing": M, "sampling": "marginal"}),
        (SGPAttention, {"kernel": "ard", "n_inducing": M, "sampling": "full"}),
        (StandardSGPAttention, {"kernel": "exponential"}),
        (StandardSGPAttention, {"kernel": "ard", "lengthscale": 2.0}),
    ],
    ids=["decoupled-exponential-marginal", "decoupled-ard-full", "standard-exp", "standard-ard"],
)
def test_under_bfloat16_autocast_the_gp_stays_in_float32_or_float64(kind, options, monkeypatch):
    """Mixed precision as training runs it (``torch.autocast``, bfloat16; here on the CPU): the
    decoupled layer's K_ga, K_gg and Cholesky factor are float64 and its O(T²) product R_aa v_a
    float32, the standard layer's kernel matrices and factors float32, never bfloat16, the
    amortised KL is float32, and forward and backward give the float32 results to
    within bfloat16's rounding. Only W_F runs in bfloat16 (unit roundoff 2⁻⁸ ≈ 0.4 %): over 30
    random layers of each kind the output was at most 0.4 % and the gradients 0.5 % off the
    float32 ones (relative norm). The bound is 2 %; with bfloat16 queries the exponential
    kernel's output was up to 4 % off."""
    made: list[tuple[str, torch.dtype]] = []  # the dtypes of the tensors in and out

    def spy(name, function):
        def recorded(*args, **kwargs):
            result = function(*args, **kwargs)
            tensors = [a for a in args if isinstance(a, torch.Tensor)] + [result]
            made.extend((name, tensor.dtype) for tensor in tensors)
            return result

        return recorded

    decoupled, standard = probtrans.gp.decoupled, probtrans.gp.standard
    watched = {  # (owner, function) → the dtype of its tensors in and out
        SGPAttention: {
            (FactoredKernel, "cross"): torch.float64,
            (decoupled, "jittered_cholesky"): torch.float64,
            (FactoredKernel, "residual_product"): torch.float32,
        },
        StandardSGPAttention: {
            (standard, "gram"): torch.float32,
            (standard, "jittered_cholesky"): torch.float32,
        },
    }[kind]
    expected = {name: dtype for (_, name), dtype in watched.items()}
    for owner, name in watched:
        monkeypatch.setattr(owner, name, spy(name, getattr(owner, name)))
    torch.manual_seed(0)
    layer = kind(8, H, **options)
    x = torch.randn(B, T, 8)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 3:] = False
    out32, grads32 = autocast_pass(layer, x, mask, bfloat16=False)
    made.clear()
    out16, grads16 = autocast_pass(layer, x, mask, bfloat16=True)

    assert out16.dtype == torch.bfloat16  # autocast was on: W_F ran in bfloat16
    assert {name for name, _ in made} == set(expected)
    assert all(dtype == expected[name] for name, dtype in made), made
    with torch.autocast("cpu", dtype=torch.bfloat16):
        trace = poutine.trace(layer).get_trace(x, mask)
    assert trace.nodes["kl_amortised"]["fn"].log_factor.dtype == torch.float32
    assert torch.isfinite(out16).all() and torch.isfinite(grads16).all()
    assert relative_error(out16, out32) < 0.02
    assert relative_error(grads16, grads32) < 0.02


# ------------------------------------------------------------------ standard SGPA
def test_standard_sgpa_mean_covariance_and_kl(gp_inputs):
    kernel, x_a, _, v_a, _, _ = gp_inputs
    sigma = torch.rand(B, H, T, DV, dtype=F64, device=x_a.device) + 0.5
    posterior = standard_posterior(kernel, x_a, v_a, sigma, jitter=1e-9)
    mean, cov = posterior.moments()
    k_aa = gram(kernel, x_a, x_a)
    torch.testing.assert_close(mean, (k_aa @ v_a).transpose(-1, -2))  # kernel attention
    # Σ_d = K_aa + K_aa (K_aa⁻¹ S_d K_aa⁻¹ − K_aa⁻¹) K_aa = S_d = L_K diag(σ_d²) L_Kᵀ
    chol = torch.linalg.cholesky(k_aa + 1e-9 * torch.eye(T, dtype=F64, device=x_a.device))
    s_d = chol.unsqueeze(2) @ torch.diag_embed(sigma.transpose(-1, -2) ** 2) @ chol.mT.unsqueeze(2)
    torch.testing.assert_close(cov, s_d)
    whitened_mean = torch.linalg.solve_triangular(chol, k_aa @ v_a, upper=False).mT
    expected_kl = kl_divergence(Normal(whitened_mean, sigma.mT), Normal(0.0, 1.0)).sum((1, 2, 3))
    torch.testing.assert_close(posterior.kl, expected_kl)


# ------------------------------------------------------------------ specs and describe
@pytest.mark.parametrize(
    "name, heads, width, inducing", [("imdb", 8, 128, 50), ("cola", 4, 256, 5)]
)
def test_text_specs_parse(name, heads, width, inducing):
    spec = load_model_spec(ROOT / "models" / name / "sgpa.toml")
    attention = spec.network.attention
    assert (spec.network.n_layers, spec.network.n_heads, spec.network.d_model) == (2, heads, width)
    assert (attention.kind, attention.kernel, attention.n_inducing) == (
        "sgpa",
        "exponential",
        inducing,
    )
    assert (spec.data.name, spec.data.protocol) == (name, "sgpa")  # loading: test_text_data.py


def test_describe_lists_the_inducing_sites_of_the_digits_spec():
    spec = load_model_spec(ROOT / "models" / "digits" / "sgpa.toml")
    rows = {row["site"]: row for row in site_table(spec)}
    heads, d_head = spec.network.n_heads, spec.network.d_model // spec.network.n_heads
    m_g = spec.network.attention.n_inducing
    for layer in range(spec.network.n_layers):
        row = rows[f"encoder.layers.{layer}.attn.u_g"]
        assert row["role"] == "global"
        assert row["event_shape"] == str((heads, d_head, m_g))
        assert rows[f"encoder.layers.{layer}.attn.f"]["role"] == "local (per example)"


def test_a_users_model_trains_with_the_layers_defaults():
    """``SGPAttention(d, h)`` with its defaults, in a user's own Pyro model on the 8×8 digits
    (16 tokens of 2×2 pixels, a Bayesian read-out, AutoNormal over the self-guided model):
    the first epoch's loss is the size of a classifier's (at the former defaults, the
    exponential kernel at ℓ = 1 and σ_f² = 1, the amortised KL made it about 4,800 nats per
    example), and the held-out accuracy is far above chance (0.1)."""
    from pyro.infer import SVI, Predictive, Trace_ELBO
    from pyro.infer.autoguide import AutoNormal
    from pyro.nn import PyroModule, PyroSample
    from sklearn.datasets import load_digits

    class Net(PyroModule):
        def __init__(self, width: int = 32) -> None:
            super().__init__()
            self.embed = torch.nn.Linear(4, width)
            self.position = torch.nn.Parameter(0.1 * torch.randn(16, width))
            self.norm = torch.nn.LayerNorm(width)
            self.attn = SGPAttention(width, 2)
            self.readout = PyroModule[torch.nn.Linear](16 * width, 10)
            prior = pyro.distributions.Normal(0.0, 1.0).expand([10, 16 * width]).to_event(2)
            self.readout.weight = PyroSample(prior)

        def forward(self, x, y=None, n=None):
            weight, _ = self.readout.weight, self.attn.u_g  # the global sites
            with pyro.plate("data", n or len(x), subsample=torch.arange(len(x))):
                h = self.embed(x) + self.position
                h = h + self.attn(self.norm(h))
                logits = h.flatten(-2) @ weight.T + self.readout.bias
                return pyro.sample("y", pyro.distributions.Categorical(logits=logits), obs=y)

    digits = load_digits()
    images = torch.tensor(digits.images / 16, dtype=torch.float32)
    x = images.unfold(1, 2, 2).unfold(2, 2, 2).reshape(len(images), 16, 4)
    y = torch.tensor(digits.target)
    pyro.set_rng_seed(0)
    net = Net()
    model = self_guided(net)
    guide = AutoNormal(model, init_scale=0.01)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 5e-3}), Trace_ELBO())
    n_train, batch = 1400, 64
    losses = []
    for _ in range(8):
        order = torch.randperm(n_train)
        steps = [svi.step(x[i], y[i], n_train) for i in order.split(batch)]
        losses.append(sum(steps) / len(steps) / n_train)  # per training example
    assert losses[0] < 50.0
    assert losses[-1] < losses[0]
    draws = Predictive(net, guide=guide, num_samples=10, return_sites=["y"])(x[n_train:])["y"]
    accuracy = (draws.mode(0).values == y[n_train:]).float().mean()
    assert accuracy > 0.8
