"""Vectorised posterior predictive: shared global draws, batched samples, streaming."""

from __future__ import annotations

import numpy as np
import pyro
import torch
from pyro import poutine

from probtrans.classifier import build_classifier
from probtrans.data import DataBundle
from probtrans.inference.guide_builder import build_guide
from probtrans.inference.objective import self_guided
from probtrans.inference.predictive import (
    HEAD_SITES,
    global_sites,
    is_point_mass,
    log_likelihood,
    posterior_draws,
    sample_predictive,
)
from probtrans.specs import GuideSpec
from tests.conftest import ragged_split, tiny_spec


def trained_guide(classifier, digits, name, device="cpu"):
    guide = build_guide(classifier, GuideSpec(name=name, init_scale=0.3), digits.train, device)
    _, inputs, mask, labels = next(digits.train.batches(8))
    guide(inputs.to(device), None if mask is None else mask.to(device), labels.to(device))
    return guide


def test_each_draw_of_the_weights_is_shared_by_every_example_and_batch(digits, device):
    """Normal guide on the last layer: sample s is softmax(W_s f(x) + b_s) for every example."""
    classifier = build_classifier(tiny_spec("softmax", prior="last_layer"), digits)
    classifier.to(device).eval()
    guide = trained_guide(classifier, digits, "normal", device)
    split = digits.test
    draws = posterior_draws(guide, 4, split, device)
    assert not is_point_mass(draws)
    assert all(value.device.type == device for value in draws.values())
    small = sample_predictive(
        classifier, guide, split, samples=4, batch_size=7, device=device, draws=draws
    )
    large = sample_predictive(
        classifier, guide, split, 4, batch_size=1000, device=device, draws=draws
    )
    with torch.no_grad():
        features = classifier.encode(split.inputs.to(device))  # (N, D)
        logits = features @ draws["head.weight"].transpose(-1, -2) + draws["head.bias"][:, None]
    expected = logits.softmax(-1).cpu().numpy()  # (S, N, C)
    assert small["probs"].shape == (4, len(split), digits.n_classes)
    assert abs(small["probs"] - expected).max() < 1e-5
    assert abs(large["probs"] - expected).max() < 1e-5


def test_point_mass_guides_evaluate_the_samples_in_one_batched_pass(digits, device):
    classifier = build_classifier(tiny_spec("h_sto", prior="last_layer"), digits).to(device)
    guide = trained_guide(classifier, digits, "delta", device)
    split = digits.test
    assert is_point_mass(posterior_draws(guide, 5, split, device))
    calls = []
    handle = classifier.encoder.register_forward_hook(lambda m, a, out: calls.append(len(out)))
    out = sample_predictive(classifier, guide, split, samples=5, batch_size=100, device=device)
    handle.remove()
    assert sum(calls) == 5 * len(split) and len(calls) == -(-len(split) // 20)  # 20 per pass
    assert max(calls) <= 100  # rows per pass bounded by batch_size, not by the split
    probs = torch.as_tensor(out["probs"])
    assert probs.shape == (5, len(split), digits.n_classes)
    assert (probs[0] - probs[1]).abs().max() > 1e-3  # attention noise differs per sample


def test_batched_samples_have_the_sequential_predictive_mean(digits):
    """Folded S = 400 against 400 one-sample passes: the same predictive mean up to MC error."""
    classifier = build_classifier(tiny_spec("h_sto", tau1=2.0, tau2=2.0), digits).eval()
    split = digits.test
    inputs = split.inputs[:6]
    no_guide = lambda *args, **kwargs: {}  # noqa: E731
    pyro.set_rng_seed(0)
    subset = type(split)(inputs, split.labels[:6])
    folded = torch.as_tensor(
        sample_predictive(classifier, no_guide, subset, 400, batch_size=2400)["probs"]
    )
    model = self_guided(classifier)
    with torch.no_grad():
        sequential = torch.stack(
            [poutine.trace(model).get_trace(inputs).nodes["probs"]["value"] for _ in range(400)]
        )
    spread = sequential.std(0) / 400**0.5
    assert ((folded.mean(0) - sequential.mean(0)).abs() < 5 * spread + 1e-4).all()


def test_token_rows_predicted_in_order_of_length_come_back_in_split_order():
    """predict batches token rows by length; its outputs must still follow the split's rows."""
    split = ragged_split(n=40, longest=12)
    data = DataBundle("toy", split, split, split, split, ["a", "b"], "tokens", vocab_size=20)
    spec = tiny_spec("softmax")
    spec.network.max_positions = 12
    classifier = build_classifier(spec, data).eval()
    guide = trained_guide(classifier, data, "delta")
    probs = sample_predictive(classifier, guide, split, samples=2, batch_size=6)["probs"]
    assert not (split.lengths()[:-1] <= split.lengths()[1:]).all()  # the split is not sorted
    with torch.no_grad():
        expected = classifier(split.inputs, split.mask).softmax(-1).numpy()  # (N, C)
    assert abs(probs - expected).max() < 1e-5


def test_the_log_likelihood_of_a_head_posterior_is_that_of_the_full_passes(digits):
    """log (1/R) Σ_r p(y_n | W_s, â_r): the features computed once for all draws (a posterior
    varying in the head alone) give what one pass per draw gives, as the R replicas are the same
    random numbers for every draw; a point mass gives one row."""
    classifier = build_classifier(tiny_spec("h_sto", prior="last_layer"), digits).eval()
    guide = trained_guide(classifier, digits, "normal")
    split = type(digits.test)(digits.test.inputs[:30], digits.test.labels[:30])
    draws = {k: v for k, v in posterior_draws(guide, 3, split).items() if k in HEAD_SITES}
    assert set(draws) == HEAD_SITES == set(global_sites(classifier))
    fast = log_likelihood(classifier, draws, split, replicas=5, batch_size=64, seed=1)
    varying = {**draws, "unused": torch.arange(3.0)}  # a site the model lacks, drawn: S passes
    per_draw = log_likelihood(classifier, varying, split, replicas=5, batch_size=64, seed=1)
    assert fast.shape == (3, 30) and fast.dtype == np.float64
    np.testing.assert_allclose(fast, per_draw, rtol=1e-5, atol=1e-6)
    assert np.abs(fast[0] - fast[1]).max() > 1e-4  # the draws differ
    pyro.set_rng_seed(1)
    probs = sample_predictive(
        classifier, None, split, 5, 64, draws={k: v[:1] for k, v in draws.items()}
    )
    by_hand = np.log(probs["probs"][:, np.arange(30), split.labels.numpy()].mean(0))
    np.testing.assert_allclose(fast[0], by_hand, rtol=1e-5)
    point = {k: v[:1].expand(4, *v.shape[1:]) for k, v in draws.items()}
    assert log_likelihood(classifier, point, split, replicas=5, seed=1).shape == (1, 30)
