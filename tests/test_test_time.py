"""Test-time adaptation (:mod:`probtrans.tta`): EM raises the mixture's objective of the
batch it adapts to, Tent lowers the entropy of the batch it adapts on, nothing leaks from one
batch to the next (unless online) or out of the adaptation, and EM refuses a model without
Gaussian-mixture attention."""

from __future__ import annotations

import numpy as np
import pyro
import pytest
import torch

from probtrans import tta as tt
from probtrans.analysis.metrics import predictive_entropy
from probtrans.attention.em_adaptation import key_objective
from probtrans.classifier import build_classifier
from probtrans.data import DataSplit
from probtrans.errors import ProbtransError
from probtrans.inference.predictive import sample_predictive
from tests.conftest import tiny_spec

GAUSSIAN_MIXTURE = {"kind": "gaussian_mixture", "precision": "head"}


def classifier_of(digits, kind: str, **attention):
    torch.manual_seed(0)
    return build_classifier(tiny_spec(kind, **attention), digits).eval()


def rows(digits, start: int, stop: int) -> DataSplit:
    split = digits.test
    return DataSplit(split.inputs[start:stop], split.labels[start:stop])


def gamma_log_prior(alpha: torch.Tensor, trained: torch.Tensor, shape: float) -> torch.Tensor:
    """log Gamma(α; θ_α1, rate) + const summed over units, the mode on the trained α: (B, H)."""
    rate = (shape - 1) / trained
    return ((shape - 1) * alpha.log() - rate * alpha).sum(-1)


@pytest.mark.parametrize(
    "options",
    [tt.EmOptions(), tt.EmOptions(n_iter=3, theta_xi=1.0, precision=True, theta_alpha1=5.0)],
    ids=["defaults", "keys-and-precisions"],
)
def test_em_raises_the_mixture_objective_of_the_batch(digits, options):
    """In every mixture layer, the adapted keys (and precisions) have a higher posterior given
    the batch's queries than the trained ones: log p(q | ξ, α) + log p(ξ) [+ log p(α)]
    (Eq. 24–30; :func:`probtrans.attention.em_adaptation.key_objective` plus the Gamma prior of
    α)."""
    classifier = classifier_of(digits, "gaussian_mixture", precision="head")
    inputs = rows(digits, 0, 32).inputs
    seen = []
    with tt.test_time_adaptation(classifier, options) as adaptation:
        for layer in adaptation.method.layers:

            def recording(q, mix, update=layer.adaptation):
                adapted = update(q, mix)
                seen.append((q, mix, adapted))
                return adapted

            layer.adaptation = recording
        classifier(inputs)
    assert len(seen) == 1 and all(layer.adaptation is None for layer in adaptation.method.layers)
    for q, trained, adapted in seen:
        before = key_objective(q, trained, trained.keys, options.theta_xi)
        after = key_objective(q, adapted, trained.keys, options.theta_xi)
        if options.precision:
            alpha0 = trained.alpha.expand_as(adapted.alpha)
            before = before + gamma_log_prior(alpha0, alpha0, options.theta_alpha1)
            after = after + gamma_log_prior(adapted.alpha, alpha0, options.theta_alpha1)
        assert (after >= before - 1e-4).all()
        assert (after - before).mean() > 1e-3  # it moved


def test_em_changes_the_predictions_and_not_the_model(digits):
    classifier = classifier_of(digits, "gaussian_mixture", precision="head")
    split = rows(digits, 0, 64)
    state = {k: v.clone() for k, v in classifier.state_dict().items()}
    plain = sample_predictive(classifier, None, split, 2, draws={})["probs"]
    adapted = tt.adapted_predictive(classifier, None, split, "em", 2, draws={})["probs"]
    assert np.abs(adapted - plain).max() > 1e-4
    again = sample_predictive(classifier, None, split, 2, draws={})["probs"]
    np.testing.assert_array_equal(again, plain)
    assert all(torch.equal(v, classifier.state_dict()[k]) for k, v in state.items())


def test_tent_lowers_the_mean_predictive_entropy_of_its_batch(digits):
    classifier = classifier_of(digits, "softmax")
    split = rows(digits, 0, 64)
    plain = sample_predictive(classifier, None, split, 1, draws={})["probs"]
    options = tt.TentOptions(steps=3, lr=1e-2)
    adapted = tt.adapted_predictive(classifier, None, split, options, 1, 64, draws={})["probs"]
    assert predictive_entropy(adapted).mean() < predictive_entropy(plain).mean() - 1e-3


@pytest.mark.parametrize(
    ("kind", "attention", "options"),
    [
        ("softmax", {}, tt.TentOptions(steps=2, lr=1e-2)),
        ("gaussian_mixture", {"precision": "head"}, tt.EmOptions(precision=True)),
    ],
    ids=["tent", "em"],
)
def test_no_state_leaks_from_one_batch_to_the_next(digits, kind, attention, options):
    """After adapting to batch A, batch B is predicted as by a fresh adaptation to B alone; after
    the adaptation the model is the trained one: values, requires_grad, grads, eval mode, Pyro
    param store, and the caller's random stream (as after the unadapted predictive)."""
    classifier = classifier_of(digits, kind, **attention)
    classifier.embedding.proj.weight.requires_grad_(False)  # a flag that must come back
    flags = {name: p.requires_grad for name, p in classifier.named_parameters()}
    state = {k: v.clone() for k, v in classifier.state_dict().items()}
    a_and_b, b = rows(digits, 0, 64), rows(digits, 32, 64)
    pyro.set_rng_seed(1)
    both = tt.adapted_predictive(classifier, None, a_and_b, options, 2, 32, draws={})["probs"]
    after_adapted = torch.get_rng_state()
    alone = tt.adapted_predictive(classifier, None, b, options, 2, 32, draws={})["probs"]
    np.testing.assert_allclose(both[:, 32:], alone, rtol=0, atol=1e-6)
    pyro.set_rng_seed(1)
    sample_predictive(classifier, None, a_and_b, 2, 32, draws={})
    assert torch.equal(after_adapted, torch.get_rng_state())
    assert all(torch.equal(v, classifier.state_dict()[k]) for k, v in state.items())
    assert {name: p.requires_grad for name, p in classifier.named_parameters()} == flags
    assert all(p.grad is None for p in classifier.parameters())
    assert not classifier.training
    assert not list(pyro.get_param_store().keys())


def test_online_tent_carries_over_and_restores_at_the_end(digits):
    classifier = classifier_of(digits, "softmax")
    state = {k: v.clone() for k, v in classifier.state_dict().items()}
    a_and_b, b = rows(digits, 0, 64), rows(digits, 32, 64)
    online = tt.TentOptions(steps=2, lr=1e-2, online=True)
    both = tt.adapted_predictive(classifier, None, a_and_b, online, 1, 32, draws={})["probs"]
    alone = tt.adapted_predictive(classifier, None, b, online, 1, 32, draws={})["probs"]
    assert np.abs(both[:, 32:] - alone).max() > 1e-5  # B started from A's adapted state
    assert all(torch.equal(v, classifier.state_dict()[k]) for k, v in state.items())


def test_tent_leaves_the_predictive_noise_alone(digits):
    """Tent's own passes draw from a forked generator: with a negligible step, the adapted
    predictive of a stochastic model (H-STO) is the unadapted one, sample for sample."""
    classifier = classifier_of(digits, "h_sto")
    split = rows(digits, 0, 32)
    pyro.set_rng_seed(3)
    plain = sample_predictive(classifier, None, split, 3, draws={})["probs"]
    pyro.set_rng_seed(3)
    options = tt.TentOptions(lr=1e-12)
    adapted = tt.adapted_predictive(classifier, None, split, options, 3, draws={})["probs"]
    np.testing.assert_allclose(adapted, plain, rtol=0, atol=1e-5)


def test_em_on_a_softmax_model_is_refused_with_one_line(digits):
    classifier = classifier_of(digits, "softmax")
    with pytest.raises(ProbtransError) as error:
        tt.adapted_predictive(classifier, None, rows(digits, 0, 8), "em", 1, draws={})
    message = str(error.value)
    assert "\n" not in message and "'softmax'" in message and "'tent'" in message


@pytest.mark.parametrize(
    ("adapt", "options", "words"),
    [
        ("sgd", {}, r"test-time adaptation = 'sgd': unknown test-time adaptation \(known: em, "),
        ("em", {"online": True}, "for 'tent' only: 'em' keeps no adapted state"),
        ("tent", {"steps": 0}, "tent: steps = 0"),
        ("em", {"theta": 1.0}, "em: unknown key 'theta'"),
    ],
)
def test_bad_adaptation_options_are_refused(adapt, options, words):
    with pytest.raises(ProbtransError, match=words):
        tt.adaptation_options(adapt, **options)


# ----------------------------------------------------------------------------- in a run
def test_evaluate_adapts_each_test_batch_and_says_so_and_run_predict_too(tiny_run, capsys):
    """``probtrans evaluate RUN --adapt tent`` writes the adapted run's metrics with the
    adaptation named in ``metrics.json``; a plain ``evaluate`` gives the unadapted numbers
    back; ``Run.predict(..., adapt="tent")`` predicts every input after adapting to its batch."""
    import json

    from probtrans.cli import main
    from probtrans.runs import Run

    plain = json.loads((tiny_run / "metrics.json").read_text())
    assert plain["adaptation"] is None
    assert main(["evaluate", str(tiny_run), "--adapt", "tent", "--quiet"]) == 0
    assert "adapted to each test batch by tent" in capsys.readouterr().out
    adapted = json.loads((tiny_run / "metrics.json").read_text())
    assert adapted["adaptation"]["method"] == "tent" and adapted["adaptation"]["online"] is False
    assert adapted["nll"] != plain["nll"]  # the adapted LayerNorms predict differently
    assert main(["evaluate", str(tiny_run), "--quiet"]) == 0
    again = json.loads((tiny_run / "metrics.json").read_text())
    assert again["adaptation"] is None and again["nll"] == plain["nll"]

    run = Run.load(tiny_run)
    inputs = run.data.test.inputs[:40]
    columns = run.predict(inputs, adapt="tent")
    unadapted = run.predict(inputs)
    assert len(columns["predicted"]) == 40
    assert not np.allclose(columns["entropy"], unadapted["entropy"])
