"""probtrans.nn: attention layers and encoder built by keywords, in a user's own Pyro model."""

from __future__ import annotations

import contextlib

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer import Trace_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule, PyroSample
from torch import nn

import probtrans
from probtrans.attention import ATTENTION
from probtrans.attention.encoder import make_attention
from probtrans.classifier import build_classifier
from probtrans.contract import fused_attention
from probtrans.errors import ProbtransError
from probtrans.nn import (
    Encoder,
    EncoderBlock,
    GaussianMixtureAttention,
    HierarchicalStochasticAttention,
    SGPAttention,
    SoftmaxAttention,
    StandardSGPAttention,
    StochasticAttention,
)
from probtrans.specs import NetworkSpec
from probtrans.specs.attention import HierarchicalOptions, StochasticOptions
from tests.conftest import autocast_pass, relative_error, tiny_spec

B, L, D, H = 3, 6, 16, 4

#: every kind, with some options given by keyword
LAYERS = [
    (SoftmaxAttention, {"tau": 2.0}),
    (StochasticAttention, {"tau": 0.5, "hard": False}),
    (HierarchicalStochasticAttention, {"tau1": 0.5, "tau2": 3.0, "n_centroids": 3}),
    (SGPAttention, {"kernel": "ard", "n_inducing": 4}),
    (StandardSGPAttention, {"kernel": "exponential", "lengthscale": 2.0}),
    (GaussianMixtureAttention, {"beta": 1.0, "n_iter": 2}),
]
IDS = [cls.__name__ for cls, _ in LAYERS]


@pytest.fixture
def mask():
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[0, 4:] = False
    mask[2, 1:] = False
    return mask


def run(module, *args):
    """``module(*args)`` under a trace (SGPA's KL factor is an observed site)."""
    return poutine.trace(module).get_trace(*args).nodes["_RETURN"]["value"]


@pytest.mark.parametrize("cls,options", LAYERS, ids=IDS)
def test_every_layer_built_by_keywords_maps_tokens_to_tokens(cls, options, mask, device):
    """Forward and backward on the ``--device`` of the test run."""
    layer = cls(d_model=D, n_heads=H, **options).to(device)
    assert isinstance(layer, PyroModule)
    assert layer.options == cls.options_class(**options)  # validated and kept
    x = torch.randn(B, L, D, device=device)
    for out in (run(layer, x), run(layer, x, mask.to(device))):
        assert out.shape == (B, L, D) and torch.isfinite(out).all()
        assert out.device == x.device
    out.pow(2).sum().backward()
    for name, param in layer.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name


@pytest.mark.parametrize("fused", [False, True], ids=["sites", "fused"])
@pytest.mark.parametrize("cls,options", LAYERS, ids=IDS)
def test_every_layer_runs_under_bfloat16_autocast(cls, options, mask, fused):
    """Mixed precision as training runs it (``torch.autocast``, bfloat16; here on the CPU), on
    the sample-site path and the fused one (STO, H-STO): finite outputs and gradients, equal to
    those of float32 with the same draws up to bfloat16's rounding (unit roundoff 2⁻⁸ ≈ 0.4 %).
    Over 20 random layers of each kind the output was at most 0.7 % and the gradients 1.2 % off
    (relative norm; the Gaussian mixture's, the other kinds' at most 0.5 % and 0.9 %); the bound
    is 3 %."""
    torch.manual_seed(0)
    layer = cls(D, H, **options)
    x = torch.randn(B, L, D)
    with fused_attention() if fused else contextlib.nullcontext():
        out32, grads32 = autocast_pass(layer, x, mask, bfloat16=False)
        out16, grads16 = autocast_pass(layer, x, mask, bfloat16=True)
    assert out16.dtype == torch.bfloat16  # the output projection ran in bfloat16
    assert torch.isfinite(out16).all() and torch.isfinite(grads16).all()
    assert relative_error(out16, out32) < 0.03
    assert relative_error(grads16, grads32) < 0.03


@pytest.mark.parametrize("cls,options", LAYERS, ids=IDS)
def test_the_registry_builds_the_same_class_with_the_same_options(cls, options):
    spec_options = cls.options_class(**options)
    assert ATTENTION.get(spec_options.kind, "kind") is cls
    layer = make_attention(spec_options, D, H)
    assert type(layer) is cls and layer.options == spec_options


@pytest.mark.parametrize("cls", [SoftmaxAttention, GaussianMixtureAttention])
def test_padding_appended_to_a_batch_leaves_the_real_tokens_outputs_unchanged(cls):
    layer = cls(D, H).eval()
    x = torch.randn(B, L, D)
    padded = torch.cat([x, 50 * torch.randn(B, 3, D)], dim=1)
    mask = torch.ones(B, L + 3, dtype=torch.bool)
    mask[:, L:] = False
    torch.testing.assert_close(layer(padded, mask)[:, :L], layer(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(layer(padded, mask)[:, :L], layer(x, mask[:, :L]))


def test_softmax_gives_padding_keys_zero_weight(mask):
    layer = SoftmaxAttention(D, H)
    x = torch.randn(B, L, D)
    other = x.clone()
    other[~mask] = 100.0  # what the padding holds cannot reach the real tokens
    torch.testing.assert_close(layer(other, mask)[mask], layer(x, mask)[mask])


@pytest.mark.parametrize("cls,options", LAYERS, ids=IDS)
def test_an_unknown_option_raises_a_type_error_naming_the_class_and_the_options(cls, options):
    names = ", ".join(name for name in cls.options_class.model_fields if name != "kind")
    message = f"{cls.__name__}: unknown option 'tau3' (options: {names})"
    with pytest.raises(TypeError) as err:
        cls(D, H, tau3=1.0)
    assert str(err.value) == message
    with pytest.raises(TypeError, match="unknown option 'kind'"):
        cls(D, H, kind=cls.options_class.model_fields["kind"].default)


@pytest.mark.parametrize(
    "cls,option,value,problem",
    [
        (StochasticAttention, "tau", -1.0, "must be > 0"),
        (StochasticAttention, "hard", 1, "must be true or false"),
        (StochasticAttention, "dropout", 1.0, "must be < 1"),
        (HierarchicalStochasticAttention, "centroids", "token", "must be 'layer' or 'head'"),
        (SGPAttention, "n_inducing", 16.0, "must be an integer"),
        (SGPAttention, "kernel", "rbf", "must be 'exponential' or 'ard'"),
        (GaussianMixtureAttention, "n_iter", 0, "must be > 0"),
        (SoftmaxAttention, "tau", float("inf"), "must be a finite number"),
    ],
)
def test_a_bad_option_value_raises_a_value_error_naming_the_class_and_the_option(
    cls, option, value, problem
):
    with pytest.raises(ValueError) as err:
        cls(D, H, **{option: value})
    assert str(err.value) == f"{cls.__name__}: {option} = {value!r}: {problem}"


def test_heads_must_divide_the_width():
    with pytest.raises(ValueError, match="StochasticAttention: n_heads = 3 must divide"):
        StochasticAttention(D, 3)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_encoder_block_shapes_and_attention_given_four_ways(norm, mask):
    x = torch.randn(B, L, D)
    given = [
        ("sto", {"tau": 0.5}),
        (StochasticOptions(tau=0.5), {}),
        (StochasticAttention, {"tau": 0.5}),
        (StochasticAttention(D, H, tau=0.5), {}),
    ]
    for attention, options in given:
        block = EncoderBlock(D, H, d_ff=32, norm=norm, attention=attention, **options)
        assert isinstance(block, PyroModule) and isinstance(block.attn, StochasticAttention)
        assert block.attn.options == StochasticOptions(tau=0.5)
        assert block.pre_norm == (norm == "pre")
        for out in (run(block, x), run(block, x, mask)):
            assert out.shape == (B, L, D) and torch.isfinite(out).all()
    block = EncoderBlock(D, H, attention=HierarchicalOptions(tau2=5.0), tau1=0.3)
    assert (block.attn.options.tau1, block.attn.options.tau2) == (0.3, 5.0)  # keywords add
    assert isinstance(EncoderBlock(D, H).attn, SoftmaxAttention)


def test_encoder_block_defaults_are_the_model_specs():
    block = EncoderBlock(D, H)
    fields = NetworkSpec.model_fields
    assert block.mlp[0].out_features == fields["d_ff"].default
    assert block.drop.p == fields["dropout"].default
    assert block.pre_norm == (fields["norm"].default == "pre")


def test_bad_encoder_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="EncoderBlock: norm = 'mid'"):
        EncoderBlock(D, H, norm="mid")
    with pytest.raises(ValueError, match="attention = 'magic': unknown attention kind"):
        EncoderBlock(D, H, attention="magic")
    with pytest.raises(TypeError, match="unknown option 'tau3'"):
        Encoder(D, H, 2, attention="sto", tau3=1.0)
    with pytest.raises(TypeError, match="already built StochasticAttention"):
        EncoderBlock(D, H, attention=StochasticAttention(D, H), tau=2.0)
    with pytest.raises(TypeError, match="every layer builds its own"):
        Encoder(D, H, 2, attention=StochasticAttention(D, H))
    with pytest.raises(TypeError, match="must be a kind name"):
        EncoderBlock(D, H, attention=3)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_encoder_maps_tokens_to_tokens(norm, mask):
    encoder = Encoder(D, H, 3, d_ff=32, dropout=0.0, norm=norm, attention="h_sto", tau2=5.0)
    assert isinstance(encoder, PyroModule) and len(encoder.layers) == 3
    assert all(isinstance(block, EncoderBlock) for block in encoder.layers)
    assert isinstance(encoder.ln_f, nn.LayerNorm if norm == "pre" else nn.Identity)
    x = torch.randn(B, L, D)
    for out in (run(encoder, x), run(encoder, x, mask)):
        assert out.shape == (B, L, D) and torch.isfinite(out).all()


class TwoLayers(PyroModule):
    """A user's own model: two attention layers and an encoder, mean-pooled, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.attn1 = StochasticAttention(D, H, tau=0.5)
        self.attn2 = HierarchicalStochasticAttention(D, H, tau2=3.0)
        self.encoder = Encoder(D, H, 2, d_ff=32, dropout=0.0, attention="sto")
        self.head = PyroModule[nn.Linear](D, 2)

    def forward(self, x, mask=None, y=None):
        with pyro.plate("data", len(x)):
            h = self.encoder(self.attn2(self.attn1(x, mask), mask), mask)
            return pyro.sample("y", dist.Categorical(logits=self.head(h.mean(1))), obs=y)


def test_sites_in_a_users_pyro_module_are_named_after_the_module_path(mask):
    trace = poutine.trace(TwoLayers()).get_trace(torch.randn(B, L, D), mask)
    sites = [name for name, node in trace.nodes.items() if node["type"] == "sample"]
    assert sites[1:] == [
        "attn1.a_v",
        "attn2.a_c",
        "attn2.a_v",
        "encoder.layers.0.attn.a_v",
        "encoder.layers.1.attn.a_v",
        "y",
    ]
    assert trace.nodes["attn1.a_v"]["fn"].batch_shape == (B,)  # inside the data plate
    assert trace.nodes["encoder.layers.1.attn.a_v"]["fn"].event_shape == (H, L, L)


def test_sgpa_global_site_is_named_after_the_module_path():
    class Model(PyroModule):
        def __init__(self) -> None:
            super().__init__()
            self.gp = SGPAttention(D, H, n_inducing=3)

        def forward(self, x, draw_globals=True):
            if draw_globals:
                self.gp.u_g  # noqa: B018 (draws the global site outside the plate)
            with pyro.plate("data", len(x)):
                return self.gp(x)

    model, x = Model(), torch.randn(B, L, D)
    trace = poutine.trace(model).get_trace(x)
    assert {"gp.u_g", "gp.f", "gp.kl_amortised"} <= set(trace.nodes)
    assert trace.nodes["gp.u_g"]["cond_indep_stack"] == ()  # global, outside the plate
    with pytest.raises(ValueError, match="SGPAttention: the global site 'gp.u_g' was drawn"):
        poutine.trace(model).get_trace(x, draw_globals=False)


class WithPrior(TwoLayers):
    """TwoLayers with a Normal prior on the head, so that the guide has a site."""

    def __init__(self) -> None:
        super().__init__()
        self.head.weight = PyroSample(dist.Normal(0.0, 1.0).expand([2, D]).to_event(2))

    def forward(self, x, mask=None, y=None):
        self.head.weight  # noqa: B018 (draws the global weight outside the data plate)
        return super().forward(x, mask, y)


def test_a_guide_for_a_users_model_is_built_on_self_guided(mask):
    x, y = torch.randn(B, L, D), torch.tensor([0, 1, 1])
    with pyro.settings.context(module_local_params=True):
        pyro.set_rng_seed(0)
        model = WithPrior()
        with pytest.raises(ProbtransError, match="self_guided"):
            AutoNormal(model)(x, mask, y)
        hidden = probtrans.self_guided(model)
        guide = AutoNormal(hidden)
        guide(x, mask, y)
        latent = [
            name for name, node in guide.prototype_trace.nodes.items() if node["type"] == "sample"
        ]
        assert latent == ["head.weight"]  # no attention site, no plate
        params = list(model.parameters()) + list(guide.parameters())
        optimiser = torch.optim.Adam(params, lr=0.01)
        for _ in range(3):
            optimiser.zero_grad()
            loss = Trace_ELBO().differentiable_loss(hidden, guide, x, mask, y)
            loss.backward()
            optimiser.step()
            assert torch.isfinite(loss)


def test_the_spec_built_classifier_is_made_of_the_same_classes(digits):
    classifier = build_classifier(tiny_spec("h_sto"), digits)
    assert isinstance(classifier.encoder, Encoder)
    block = classifier.encoder.layers[0]
    assert isinstance(block, EncoderBlock)
    assert isinstance(block.attn, HierarchicalStochasticAttention)
    assert block.attn.options == tiny_spec("h_sto").network.attention
    trace = poutine.trace(classifier).get_trace(digits.train.inputs[:2])
    assert {"encoder.layers.0.attn.a_c", "encoder.layers.0.attn.a_v"} <= set(trace.nodes)


@pytest.mark.parametrize("cls, options", LAYERS)
def test_inputs_of_the_wrong_shape_are_refused_by_name(cls, options):
    layer = cls(D, H, **options)
    with pytest.raises(ValueError, match=rf"{cls.__name__}: x of shape \({L}, {D}\)"):
        layer(torch.randn(L, D))  # one sequence without its batch dimension
    with pytest.raises(ValueError, match=rf"x of shape \({B}, {L}, {D + 1}\): must be"):
        layer(torch.randn(B, L, D + 1))
    with pytest.raises(ValueError, match=rf"mask of shape \({B}, {L + 1}\): must be \({B}, {L}\)"):
        layer(torch.randn(B, L, D), torch.ones(B, L + 1, dtype=torch.bool))
    with pytest.raises(ValueError, match=rf"mask of shape \(2, {B}, {L}\): must be \({B}, {L}\)"):
        layer(torch.randn(2, B, L, D), torch.ones(2, B, L, dtype=torch.bool))  # (B, L) only
