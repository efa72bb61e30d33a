"""``[guide] head_scales = "fixed_point"``: a mean-field head's variances at the ELBO's fixed
point for its means (:mod:`probtrans.inference.head_variances`)."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import SVI, TraceMeanField_ELBO
from pyro.infer.autoguide import AutoNormal

from probtrans.errors import ProbtransError
from probtrans.inference.head_variances import fixed_point_scales
from probtrans.inference.laplace import hessian, hessian_diagonal
from probtrans.inference.predictive import global_sites, sample_predictive
from probtrans.runs import Run, fit
from tests.conftest import inference_file, tiny_inference


def synthetic(n: int = 300, d: int = 3, classes: int = 3, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(n, d, generator=generator)
    true = torch.randn(classes, d, generator=generator) * 1.5
    labels = torch.distributions.Categorical(logits=features @ true.T).sample()
    return features, labels


def test_hessian_diagonal_is_the_diagonal_of_the_laplace_hessian():
    features, _ = synthetic()
    head = torch.randn(3, 4, dtype=torch.float64)
    full = hessian(features, head).diagonal().reshape(3, 4)
    torch.testing.assert_close(hessian_diagonal(features, head), full)


def test_fixed_point_is_where_svi_puts_a_mean_field_heads_scales(prior_scale=0.3, kl_weight=0.5):
    """Pyro's own SVI (AutoNormal, analytic KL, scales at a rate that lets them converge) on a
    softmax regression: its scales are the fixed point's at its means, to the second-order
    approximation (a few per cent)."""
    features, labels = synthetic()
    pyro.set_rng_seed(0)

    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, prior_scale).expand([3, 3]).to_event(2))
        b = pyro.sample("b", dist.Normal(0.0, prior_scale).expand([3]).to_event(1))
        with pyro.plate("data", len(x)), pyro.poutine.scale(scale=1.0 / kl_weight):
            pyro.sample("y", dist.Categorical(logits=x @ w.T + b), obs=y)

    guide = AutoNormal(model, init_scale=0.01)
    # the ELBO with the KL at weight β, times 1/β: the same stationary points
    optim = pyro.optim.ClippedAdam({"lr": 0.05, "lrd": 0.998})
    svi = SVI(model, guide, optim, TraceMeanField_ELBO(num_particles=4))
    with pyro.get_param_store().scope():
        for _ in range(1500):
            svi.step(features, labels)
        locs, scales = guide.median(), {name: getattr(guide.scales, name) for name in "wb"}
        weight, bias = fixed_point_scales(features, locs["w"], locs["b"], prior_scale, kl_weight)
    torch.testing.assert_close(scales["w"], weight, rtol=0.08, atol=0)
    torch.testing.assert_close(scales["b"], bias, rtol=0.08, atol=0)
    assert float(weight.max()) < prior_scale  # the data shrink every scale below the prior's


def mfvi_text(tmp_path, head_scales: str, **elbo):
    text = tiny_inference(tmp_path, "mfvi").read_text()
    text = text.replace("[guide]\n", f'[guide]\nhead_scales = "{head_scales}"\n', 1)
    for key, value in elbo.items():
        text = text.replace("[elbo]\n", f"[elbo]\n{key} = {value}\n", 1)
    return inference_file(tmp_path, f"mfvi_{head_scales}.toml", text)


def test_a_fit_keeps_the_fixed_point_head_scales(tmp_path, tiny_model_file, capsys):
    """The run's checkpoint holds the head scales the fixed point gives at its means and its
    training features; the other scales are SVI's; the training-set KL is lower than with the
    scales SVI left (the same seed, so the same means)."""
    runs = {}
    for head_scales in ("learned", "fixed_point"):
        out = tmp_path / head_scales
        inference = mfvi_text(tmp_path, head_scales)
        fit(tiny_model_file, inference, out=out, progress=head_scales == "fixed_point")
        runs[head_scales] = Run.load(out)
    assert "set at the ELBO's fixed point for their means (median 0.01" in capsys.readouterr().err
    learned, fixed = (runs[k] for k in ("learned", "fixed_point"))
    guide = fixed.guide
    medians = guide.median()
    draws = {site: medians[site][None] for site in global_sites(fixed.classifier)}
    train = fixed.data.train
    features = sample_predictive(
        fixed.classifier, None, train, 1, 256, extra_sites=("features",), draws=draws
    )["features"][0]
    prior = fixed.classifier.prior_scales["head.weight"]
    weight, bias = fixed_point_scales(
        torch.as_tensor(features), medians["head.weight"], medians["head.bias"], prior
    )
    # the tiny model samples its attention: these features are another draw of its noise
    torch.testing.assert_close(guide.scales.head.weight, weight, rtol=0.02, atol=0)
    torch.testing.assert_close(guide.scales.head.bias, bias, rtol=0.02, atol=0)
    assert float(learned.guide.scales.head.weight.detach().max()) < 0.02  # where Adam left them
    torch.testing.assert_close(guide.median()["head.weight"], learned.guide.median()["head.weight"])
    assert fixed.metrics["kl"] < learned.metrics["kl"]


@pytest.mark.parametrize(
    "inference,kl_weight,message",
    [
        ("map", None, "needs a mean-field Gaussian guide over the head"),
        ("mfvi", 0, "elbo.kl_weight = 0"),
    ],
)
def test_fixed_point_refused_where_it_has_nothing_to_set(
    tmp_path, tiny_model_file, inference, kl_weight, message
):
    text = tiny_inference(tmp_path, inference).read_text()
    if "[guide]" not in text:
        text = "[guide]\n" + text
    text = text.replace("[guide]\n", '[guide]\nhead_scales = "fixed_point"\n', 1)
    if kl_weight is not None:
        text = text.replace("kl_weight = 1.0", f"kl_weight = {kl_weight}")
    spec = inference_file(tmp_path, "bad.toml", text)
    out = tmp_path / "run"
    with pytest.raises(ProbtransError, match="guide.head_scales") as err:
        fit(tiny_model_file, spec, out=out, progress=False)
    assert message in str(err.value)
    assert not out.exists()
