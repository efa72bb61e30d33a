"""``[predictive] head_draws``: M draws of a mean-field head per draw of the network below it
(:func:`probtrans.inference.predictive.posterior_draws`), each network evaluated once for its
group (:func:`~probtrans.inference.predictive.sample_predictive`,
:func:`~probtrans.inference.predictive.draw_predictive`)."""

from __future__ import annotations

import numpy as np
import pyro
import pytest
import torch
from pyro import poutine

from probtrans.classifier import build_classifier
from probtrans.errors import ProbtransError
from probtrans.inference.guide_builder import build_guide
from probtrans.inference.objective import self_guided
from probtrans.inference.predictive import (
    HEAD_SITES,
    log_likelihood,
    network_groups,
    posterior_draws,
    sample_predictive,
)
from probtrans.runs import Run, fit
from probtrans.specs import GuideSpec
from tests.conftest import inference_file, tiny_inference, tiny_spec


def mean_field(digits, kind: str):
    """A tiny classifier with priors on every weight and a normal guide over them."""
    classifier = build_classifier(tiny_spec(kind, prior="all"), digits).eval()
    guide = build_guide(classifier, GuideSpec(name="normal", init_scale=0.3), digits.train, "cpu")
    _, inputs, mask, labels = next(digits.train.batches(8))
    guide(inputs, mask, labels)
    return classifier, guide


def test_draws_share_their_network_in_groups_of_m_and_keep_their_own_heads(digits):
    classifier, guide = mean_field(digits, "softmax")
    pyro.set_rng_seed(0)
    draws = posterior_draws(guide, 10, digits.test, head_draws=4)
    below = sorted(set(draws) - HEAD_SITES)
    assert below and HEAD_SITES <= set(draws)
    assert network_groups(draws) == [(0, 4), (4, 8), (8, 10)]
    for name in below:
        assert torch.equal(draws[name][1:4], draws[name][:1].expand(3, *draws[name].shape[1:]))
        assert not torch.equal(draws[name][0], draws[name][4])
    heads = draws["head.weight"].flatten(1)
    assert len(torch.unique(heads, dim=0)) == 10  # every draw its own head
    pyro.set_rng_seed(0)
    plain = posterior_draws(guide, 10, digits.test)
    assert network_groups(plain) == [(s, s + 1) for s in range(10)]
    assert all(torch.equal(plain[name][0], draws[name][0]) for name in draws)  # the same first
    pyro.set_rng_seed(0)
    more = posterior_draws(guide, 12, digits.test, head_draws=4)
    assert all(torch.equal(more[name][:10], draws[name]) for name in draws)  # a prefix


def test_head_draws_follow_the_guides_marginal(digits):
    """Each head draw is one of q's: its mean and spread are the guide's loc and scale."""
    _, guide = mean_field(digits, "softmax")
    pyro.set_rng_seed(1)
    weight = posterior_draws(guide, 4000, digits.test, head_draws=100)["head.weight"]
    loc, scale = guide.locs.head.weight.detach(), guide.scales.head.weight.detach()
    assert ((weight.mean(0) - loc).abs() < 5 * scale / 4000**0.5).all()
    torch.testing.assert_close(weight.std(0), scale, rtol=0.1, atol=0)


def by_hand(classifier, draws, split, sites=("probs", "energy")):
    """One traced pass of the model conditioned on each draw (Predictive's definition)."""
    model = self_guided(classifier)
    out = {name: [] for name in sites}
    with torch.no_grad():
        for s in range(len(draws["head.weight"])):
            one = poutine.condition(model, data={name: v[s] for name, v in draws.items()})
            trace = poutine.trace(one).get_trace(split.inputs, split.mask)
            for name in sites:
                out[name].append(trace.nodes[name]["value"])
    return {name: torch.stack(value).numpy() for name, value in out.items()}


def test_grouped_predictive_equals_one_pass_per_draw(digits):
    """Without local randomness, each draw's probabilities and energy are those of its own
    conditioned pass, while the network runs once per group."""
    classifier, guide = mean_field(digits, "softmax")
    split = digits.test
    draws = posterior_draws(guide, 6, split, head_draws=3)
    calls = []
    handle = classifier.encoder.register_forward_hook(lambda m, a, out: calls.append(len(out)))
    fast = sample_predictive(classifier, None, split, 6, 10_000, draws=draws)
    handle.remove()
    assert sum(calls) == 2 * len(split)  # two networks, one pass each
    expected = by_hand(classifier, draws, split)
    for name in ("probs", "energy"):
        np.testing.assert_allclose(fast[name], expected[name], rtol=1e-5, atol=1e-6)
    assert fast["obs"].shape == (6, len(split))
    assert np.abs(fast["probs"][0] - fast["probs"][1]).max() > 1e-4  # the heads differ


def test_with_local_randomness_each_head_gets_its_own_replica(digits):
    """Stochastic attention: the draws of a group are replicas of one network pass, each its
    own attention sample, so equal heads in a group still give different predictions."""
    classifier, guide = mean_field(digits, "h_sto")
    split = type(digits.test)(digits.test.inputs[:20], digits.test.labels[:20])
    draws = posterior_draws(guide, 3, split, head_draws=3)
    same_head = {
        name: value[:1].expand(3, *value.shape[1:]) if name in HEAD_SITES else value
        for name, value in draws.items()
    }
    probs = sample_predictive(classifier, None, split, 3, 256, draws=same_head)["probs"]
    assert np.abs(probs[0] - probs[1]).max() > 1e-3 and np.abs(probs[1] - probs[2]).max() > 1e-3


def test_grouped_log_likelihood_equals_each_draws_own(digits):
    """draw_predictive runs each network R times and applies its group's heads: the rows are
    those of each draw evaluated alone (a point mass: one pass per replica)."""
    classifier, guide = mean_field(digits, "h_sto")
    split = type(digits.test)(digits.test.inputs[:30], digits.test.labels[:30])
    draws = posterior_draws(guide, 4, split, head_draws=2)
    grouped = log_likelihood(classifier, draws, split, replicas=3, seed=2)
    each = [{name: value[s : s + 1] for name, value in draws.items()} for s in range(4)]
    alone = np.concatenate([log_likelihood(classifier, one, split, 3, seed=2) for one in each])
    np.testing.assert_allclose(grouped, alone, rtol=1e-5, atol=1e-6)


def with_head_draws(tmp_path, name: str, head_draws: int):
    text = tiny_inference(tmp_path, name).read_text()
    text = text.replace("[predictive]\n", f"[predictive]\nhead_draws = {head_draws}\n", 1)
    return inference_file(tmp_path, f"{name}_heads.toml", text)


def test_a_fit_evaluates_its_predictive_with_head_draws(tmp_path, tiny_model_file, monkeypatch):
    """The predictive has every draw; the feature scores' training features, which the head does
    not change, one draw per network."""
    from probtrans.runs import evaluation

    features = {}  # split size → the draws of the pass that reads that split's features

    def spy(classifier, guide, split, samples, *args, draws=None, extra_sites=(), **kwargs):
        if "features" in extra_sites and draws is not None:
            features[len(split)] = {name: value.clone() for name, value in draws.items()}
        return sample_predictive(
            classifier, guide, split, samples, *args, draws=draws, extra_sites=extra_sites, **kwargs
        )

    monkeypatch.setattr(evaluation, "sample_predictive", spy)
    out = tmp_path / "run"
    fit(tiny_model_file, with_head_draws(tmp_path, "mfvi", 2), out=out, progress=False)
    run = Run.load(out)
    assert run.metrics["posterior_samples"] == 4
    draws = run.posterior_samples(4)
    assert network_groups(draws) == [(0, 2), (2, 4)]
    train = features[len(run.data.train)]
    assert network_groups(train) == [(0, 1), (1, 2)]
    for name, value in train.items():
        torch.testing.assert_close(value, draws[name][[0, 2]].to(value.device))
    assert network_groups(features[len(run.data.test)]) == [(0, 2), (2, 4)]  # every draw


def test_head_draws_refused_without_a_mean_field_head(tmp_path, tiny_model_file):
    out = tmp_path / "run"
    with pytest.raises(ProbtransError, match="predictive.head_draws = 3") as err:
        fit(tiny_model_file, with_head_draws(tmp_path, "map", 3), out=out, progress=False)
    assert "needs a mean-field Gaussian guide over the head" in str(err.value)
    assert not out.exists()
