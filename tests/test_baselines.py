"""Baselines: MC dropout, temperature scaling, last-layer Laplace."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from probtrans.analysis import calibration, metrics
from probtrans.attention import MultiHeadAttention
from probtrans.classifier import build_classifier
from probtrans.errors import ProbtransError
from probtrans.inference.laplace import LastLayerLaplace, hessian
from probtrans.inference.predictive import sample_predictive
from probtrans.nn import Encoder
from tests.conftest import tiny_spec

NO_GUIDE = lambda *args, **kwargs: {}  # noqa: E731


def dropout_classifier(digits):
    spec = tiny_spec("softmax")
    spec.network.dropout = 0.3
    spec.network.attention.dropout = 0.2
    return build_classifier(spec, digits)


def test_mc_dropout_only_switches_dropout_on_and_restores_the_mode(digits, device):
    classifier = dropout_classifier(digits).to(device)
    classifier.train()
    split = digits.test
    plain = sample_predictive(classifier, NO_GUIDE, split, samples=3, batch_size=64, device=device)
    assert np.array_equal(plain["probs"][0], plain["probs"][2])  # eval mode: deterministic
    seen = {}

    def record(module, args, out):
        for kind in (nn.Dropout, MultiHeadAttention, nn.LayerNorm, Encoder):
            if isinstance(module, kind):
                seen[kind.__name__] = seen.get(kind.__name__, set()) | {module.training}

    hooks = [m.register_forward_hook(record) for m in classifier.modules() if m is not classifier]
    mc = sample_predictive(
        classifier, NO_GUIDE, split, 3, batch_size=64, device=device, mc_dropout=True
    )
    for hook in hooks:
        hook.remove()
    assert mc["probs"].shape == plain["probs"].shape
    assert np.abs(mc["probs"][0] - mc["probs"][1]).max() > 1e-3  # dropout is on
    assert seen["Dropout"] == {True} and seen["MultiHeadAttention"] == {True}
    assert seen["LayerNorm"] == {False} and seen["Encoder"] == {False}  # nothing else trains
    assert all(m.training for m in classifier.modules())  # the caller's mode is restored
    mean = metrics.predictive_mean(mc["probs"])
    assert abs(metrics.accuracy(mean, split.labels.numpy()) - 1 / digits.n_classes) < 0.5


def overconfident(rng: np.random.Generator, n: int, sharpness: float):
    """True class probabilities softmax(z); the model reports softmax(sharpness · z)."""
    logits = rng.normal(size=(n, 3)) * 2.0
    labels = np.array([rng.choice(3, p=p) for p in torch.softmax(torch.tensor(logits), -1).numpy()])
    probs = torch.softmax(torch.tensor(sharpness * logits), -1).numpy()
    return probs[None], labels


def test_temperature_scaling_recovers_the_overconfidence_and_never_raises_val_nll():
    rng = np.random.default_rng(0)
    val_probs, val_labels = overconfident(rng, 4000, sharpness=3.0)
    temperature = calibration.fit_temperature(val_probs, val_labels)
    assert temperature == pytest.approx(3.0, rel=0.15)
    before = metrics.nll(val_probs[0], val_labels)
    after = metrics.nll(calibration.temperature_scaled(val_probs, temperature)[0], val_labels)
    assert after < before
    tempered = calibration.temperature_scaled(val_probs, temperature)[0]
    assert (tempered.argmax(-1) == val_probs[0].argmax(-1)).all()  # accuracy unchanged
    # already calibrated, or hopeless: the validation NLL never goes up
    for sharpness in (1.0, 0.0):
        probs, labels = overconfident(rng, 500, sharpness)
        t = calibration.fit_temperature(probs, labels)
        scaled = calibration.temperature_scaled(probs, t)[0]
        assert metrics.nll(scaled, labels) <= metrics.nll(probs[0], labels) + 1e-12


def test_laplace_hessian_is_the_hessian_of_the_training_nll():
    torch.manual_seed(0)
    features = torch.randn(40, 5, dtype=torch.float64)
    labels = torch.randint(3, (40,))
    head = torch.randn(3, 6, dtype=torch.float64)

    def nll(theta):
        logits = features @ theta.view(3, 6)[:, :5].T + theta.view(3, 6)[:, 5]
        return F.cross_entropy(logits, labels, reduction="sum")

    expected = torch.autograd.functional.hessian(nll, head.flatten())
    torch.testing.assert_close(hessian(features, head), expected)


def test_laplace_predictive_shapes_limits_and_prior_precision(device):
    torch.manual_seed(1)
    weight, bias = torch.randn(4, 6, device=device), torch.randn(4, device=device)
    train = torch.randn(200, 6, device=device)
    posterior = LastLayerLaplace.fit(train, weight, bias)
    assert posterior.hessian.device == train.device
    feature_draws = torch.randn(7, 30, 6, device=device)  # (S, N, D)
    probs = posterior.predictive(feature_draws)
    assert probs.shape == (7, 30, 4)
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
    posterior.prior_precision = 1e12  # no posterior spread left: the MAP head's predictive
    map_probs = torch.softmax(feature_draws @ weight.T + bias, -1).cpu().numpy()
    np.testing.assert_allclose(posterior.predictive(feature_draws), map_probs, atol=1e-5)
    val = torch.randn(100, 6, device=device)
    val_labels = torch.softmax(val @ weight.T + bias, -1).argmax(-1).cpu().numpy()
    grid = (1e-3, 1.0, 1e3)
    chosen = posterior.fit_prior_precision(val[None], val_labels, grid)
    nlls = []
    for precision in grid:
        posterior.prior_precision = precision
        nlls.append(metrics.nll(posterior.predictive(val[None])[0], val_labels))
    assert chosen == grid[int(np.argmin(nlls))]


def test_last_layer_laplace_runs_on_a_trained_run(tiny_run, device):
    from probtrans.data import load_data
    from probtrans.runs import load_run
    from probtrans.runs.evaluation import split_predictives

    run = load_run(tiny_run)
    train = run.data.train  # a folder written without a Laplace nor LOO keeps no training split
    run.data.train = type(train)(train.inputs[:0], train.labels[:0])
    run.inference_spec.predictive.posthoc = ["laplace", "mc_dropout"]
    with pytest.raises(ProbtransError, match="no training split"):
        split_predictives(run, run.posterior_samples(3), 3)
    run = load_run(tiny_run, device, data=load_data(run.model_spec.data))
    run.inference_spec.predictive.posthoc = ["laplace", "mc_dropout"]
    probs, energy, _, _ = split_predictives(run, run.posterior_samples(3), 3, device)
    assert set(probs) == {"plain", "laplace", "mc_dropout"}
    assert set(energy) == {"plain", "mc_dropout"}  # the Laplace predictive has no logits
    for variant in probs.values():
        assert variant["test"].shape == (3, len(run.data.test), run.data.n_classes)
        assert variant["ood:digits_8_9"].shape[1] == len(run.data.ood["digits_8_9"])
    assert not np.allclose(probs["laplace"]["test"], probs["plain"]["test"])
