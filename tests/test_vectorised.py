"""Attention layers with sample dimensions left of their inputs, as Pyro's vectorised plates
give them (``Predictive(..., parallel=True)``, vectorised ELBO particles).

Oracles: the layer run sample by sample on the same draws; a user's model run sequentially,
conditioned on the draws of its vectorised run; ``Predictive(parallel=False)`` (the predictive
mean, within 3 standard errors); the site path for the fused path's noise.
"""

from __future__ import annotations

import contextlib

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer import SVI, Predictive, Trace_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule, PyroSample
from torch import nn

import probtrans
from probtrans.attention.em_adaptation import adapting
from probtrans.contract import fused_attention, plate_batch_shape
from probtrans.nn import (
    Encoder,
    GaussianMixtureAttention,
    HierarchicalStochasticAttention,
    SGPAttention,
    SoftmaxAttention,
    StandardSGPAttention,
    StochasticAttention,
)

B, L, D, H, C, S = 4, 5, 8, 2, 2, 3  # sequences, tokens, width, heads, classes, samples

#: every kind, with options that take each of its sampling paths
LAYERS = [
    (SoftmaxAttention, {"tau": 2.0}),
    (StochasticAttention, {"tau": 0.5}),
    (StochasticAttention, {"tau": 0.5, "hard": True}),
    (HierarchicalStochasticAttention, {"tau1": 0.5, "tau2": 2.0, "n_centroids": 3}),
    (SGPAttention, {"kernel": "ard", "n_inducing": 3}),
    (SGPAttention, {"kernel": "exponential", "n_inducing": 3, "sampling": "full"}),
    (StandardSGPAttention, {"kernel": "exponential", "lengthscale": 2.0}),
    (GaussianMixtureAttention, {"beta": 1.0, "n_iter": 2, "precision": "unit", "prior": "learned"}),
]
IDS = [f"{cls.__name__}-{i}" for i, (cls, _) in enumerate(LAYERS)]
#: the kinds of the user's model below, as in the issue: H-STO and decoupled SGPA
USER_KINDS = {
    "h_sto": (HierarchicalStochasticAttention, {"tau1": 0.5, "tau2": 1.0, "n_centroids": 3}),
    "sgpa": (SGPAttention, {"kernel": "exponential", "n_inducing": 3}),
    "sgpa_full": (SGPAttention, {"kernel": "ard", "n_inducing": 3, "sampling": "full"}),
}


@pytest.fixture
def mask():
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[0, 3:] = False
    mask[2, 1:] = False
    return mask


class UserModel(PyroModule):
    """The README's user model: two attention layers and a Bayesian read-out, written with
    negative dimensions so that a vectorised plate's draws pass through: the weight is (C, D),
    or (S, 1, C, D) in a vectorised plate (the 1: the data plate's dimension)."""

    def __init__(self, cls: type, **options) -> None:
        super().__init__()
        self.attn1 = cls(D, H, **options)
        self.attn2 = cls(D, H, **options)
        self.weight = PyroSample(dist.Normal(0.0, 1.0).expand([C, D]).to_event(2))
        self.bias = nn.Parameter(torch.zeros(C))

    def forward(self, x, y=None):
        weight = self.weight  # global: drawn outside the data plate
        for layer in (self.attn1, self.attn2):
            for name in layer.inducing_sites:  # SGPA's u_g, global too
                getattr(layer, name)
        with pyro.plate("data", len(x)):
            h = x + self.attn1(x)  # (B, L, D) → (*S, B, L, D)
            h = h + self.attn2(h)
            logits = (weight @ h.mean(-2).unsqueeze(-1)).squeeze(-1) + self.bias  # (*S, B, C)
            pyro.deterministic("probs", logits.softmax(-1), event_dim=1)
            return pyro.sample("y", dist.Categorical(logits=logits), obs=y)


# ------------------------------------------------------------------ sample dimensions of x
@pytest.mark.parametrize("cls,options", LAYERS, ids=IDS)
def test_each_sample_of_x_is_the_layer_on_that_sample_with_its_draws(cls, options, mask):
    """x (S, B, L, D), mask (B, L) → (S, B, L, D), and row s is the layer on x[s] given row s
    of the local draws (the global u_g is one draw for all)."""
    layer = cls(D, H, **options)
    x = torch.randn(S, B, L, D)
    trace = poutine.trace(layer).get_trace(x, mask)
    out = trace.nodes["_RETURN"]["value"]
    assert out.shape == (S, B, L, D) and torch.isfinite(out).all()
    local = {layer.site(name) for name in layer.sample_sites}
    draws = {
        name: site["value"]
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and not site["is_observed"]
    }
    assert local <= set(draws)
    for s in range(S):
        given = {name: value[s] if name in local else value for name, value in draws.items()}
        torch.testing.assert_close(poutine.condition(layer, given)(x[s], mask), out[s])


@pytest.mark.parametrize("kind", ["h_sto", "sgpa"])
def test_an_encoder_takes_sample_dimensions(kind, mask):
    cls, options = USER_KINDS[kind]
    encoder = Encoder(D, H, 2, attention=cls, **options)
    out = poutine.trace(encoder).get_trace(torch.randn(S, B, L, D), mask).nodes["_RETURN"]
    assert out["value"].shape == (S, B, L, D)


# ------------------------------------------------------------------ vectorised plates
@pytest.mark.parametrize("kind", list(USER_KINDS))
def test_a_vectorised_plate_runs_the_sequential_model_on_each_samples_draws(kind):
    """Inside a vectorised plate of size S (dim −2) the user's model draws the weight and u_g
    as (S, 1, …) and the attention sites as (S, B, …); sample s is the model run alone,
    conditioned on sample s of every draw."""
    cls, options = USER_KINDS[kind]
    model = UserModel(cls, **options)
    x = torch.randn(B, L, D)
    with torch.no_grad(), pyro.plate("samples", S, dim=-2):
        trace = poutine.trace(model).get_trace(x)
    probs = trace.nodes["probs"]["value"]
    assert probs.shape == (S, B, C)
    draws = {
        name: site["value"]
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and not site["is_observed"] and name not in ("samples", "data")
    }
    leading = {"weight": (S, 1), "attn2.a_v": (S, B), "attn2.u_g": (S, 1), "attn2.f": (S, B)}
    for name, shape in leading.items():
        assert name not in draws or draws[name].shape[:2] == shape, name
    for s in range(S):
        # sample s of each draw: global (1, …) → (…); local (B, …) as it is (B > 1)
        given = {name: value[s].squeeze(0) for name, value in draws.items()}
        with torch.no_grad():
            alone = poutine.trace(poutine.condition(model, given)).get_trace(x)
        torch.testing.assert_close(alone.nodes["probs"]["value"], probs[s])


@pytest.mark.parametrize("kind", ["h_sto", "sgpa"])
def test_parallel_predictive_has_the_sequential_predictive_mean(kind):
    """A guide over ``self_guided(model)`` after a few SVI steps; 2000 draws of the predictive
    class probabilities with parallel=True and with parallel=False: per example, the means agree
    within 3 standard errors (the draws' std / √2000, combined). Predictive hands a guide's draws
    of a global site to the model as (S, *event), without the data plate's dimension, so they
    are drawn first and given it."""
    cls, options = USER_KINDS[kind]
    n = 2000
    model = UserModel(cls, **options)
    x, y = torch.randn(B, L, D), torch.tensor([0, 1, 1, 0])
    trainable = probtrans.self_guided(model)
    guide = AutoNormal(trainable)
    svi = SVI(trainable, guide, pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
    for _ in range(5):
        svi.step(x, y)
    with torch.no_grad():
        sequential = Predictive(model, guide=guide, num_samples=n, return_sites=["probs"])(x)
        globals_ = Predictive(guide, num_samples=n, parallel=True)(x)  # (n, *event)
        aligned = {name: value.unsqueeze(1) for name, value in globals_.items()}  # (n, 1, …)
        parallel = Predictive(model, aligned, parallel=True, return_sites=["probs"])(x)
    seq, par = sequential["probs"][..., 1], parallel["probs"][..., 1]  # (n, B)
    assert seq.shape == par.shape == (n, B)
    standard_error = (seq.var(0) / n + par.var(0) / n).sqrt()
    assert ((seq.mean(0) - par.mean(0)).abs() < 3 * standard_error).all()


@pytest.mark.parametrize("where", ["plate", "x"])
@pytest.mark.parametrize("kind", ["sto", "h_sto"])
def test_the_fused_path_draws_each_samples_noise_as_its_sites_would(kind, where, mask):
    """Two samples, from a vectorised plate of size 2 (dim −2, with the data plate; x (B, L,
    D)) or from x (2, B, L, D): the fused path gives the site path's output for the same seed
    (its noise has the sites' batch shape (2, B)), so the two samples of one x differ."""
    if kind == "sto":
        layer = StochasticAttention(D, H, tau=0.5).double()
    else:
        layer = HierarchicalStochasticAttention(D, H, tau1=0.7, tau2=2.0).double()
    x = torch.randn(B, L, D, dtype=torch.float64)

    def draw(fused: bool) -> torch.Tensor:
        pyro.set_rng_seed(3)
        with fused_attention() if fused else contextlib.nullcontext():
            if where == "x":
                return layer(x.expand(2, B, L, D), mask)
            with pyro.plate("samples", 2, dim=-2), pyro.plate("data", B):
                return layer(x, mask)

    fused = draw(fused=True)
    assert fused.shape == (2, B, L, D)
    torch.testing.assert_close(fused, draw(fused=False))
    assert not torch.allclose(fused[0], fused[1])


def test_plate_batch_shape_is_the_batch_shape_pyro_gives_a_site():
    assert plate_batch_shape(torch.Size([B])) == (B,)
    with pyro.plate("samples", S, dim=-2), pyro.plate("data", 100, subsample_size=B):
        assert plate_batch_shape(torch.Size([B])) == (S, B)
        assert plate_batch_shape(torch.Size([])) == (S, B)
        site = pyro.sample("z", dist.Normal(0.0, 1.0).expand([B]))
        assert site.shape == plate_batch_shape(torch.Size([B]))
    with pyro.plate("samples", S, dim=-3):
        assert plate_batch_shape(torch.Size([])) == (S, 1, 1)


# ------------------------------------------------------------------ refusals
def test_sgpa_refuses_a_u_g_drawn_inside_the_data_plate_of_a_vectorised_model():
    """u_g (S, B, H, d, M): drawn per example, not (S, 1, H, d, M)."""
    layer = SGPAttention(D, H, n_inducing=3)

    class Inside(PyroModule):
        def __init__(self) -> None:
            super().__init__()
            self.gp = layer

        def forward(self, x):
            with pyro.plate("data", len(x)):
                return self.gp(x)  # u_g first read here, inside the plate

    with pytest.raises(
        ValueError,
        match=rf"SGPAttention: the global site 'gp.u_g' was drawn "
        rf"with shape \({S}, {B}, {H}, {D // H}, 3\), not",
    ):
        with pyro.plate("samples", S, dim=-2):
            Inside()(torch.randn(B, L, D))


def test_sgpa_refuses_the_guide_draws_predictive_gives_it_without_the_data_plates_dimension():
    """Predictive(model, guide=guide, parallel=True) conditions u_g on (S, H, d, M_g) draws
    (README, "Vectorised sampling"): refused, with the way out."""
    cls, options = USER_KINDS["sgpa"]
    model = UserModel(cls, **options)
    x, y = torch.randn(B, L, D), torch.tensor([0, 1, 1, 0])
    guide = AutoNormal(probtrans.self_guided(model))
    guide(x, y)
    predictive = Predictive(model, guide=guide, num_samples=10, parallel=True)
    with pytest.raises(
        ValueError,
        match=r"'attn1.u_g' was drawn with shape \(10, 2, 4, 3\).*"
        r"a guide's draws with the data plate's dimension",
    ):
        predictive(x)


def test_adapted_mixture_layers_refuse_sample_dimensions():
    layer = GaussianMixtureAttention(D, H)
    with adapting(layer, lambda q, mix: mix):
        assert layer(torch.randn(B, L, D)).shape == (B, L, D)
        with pytest.raises(
            ValueError,
            match=rf"^GaussianMixtureAttention: queries of shape \({S}, {B}, {H}, {L}, {D // H}\): "
            r"inference-time adaptation",
        ):
            layer(torch.randn(S, B, L, D))
