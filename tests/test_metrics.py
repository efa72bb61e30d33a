"""Tests of probtrans.analysis.metrics against scikit-learn and hand-worked examples."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from sklearn.metrics import (
    accuracy_score,
    average_precision_score,
    brier_score_loss,
    log_loss,
    matthews_corrcoef,
    roc_auc_score,
)

from probtrans.analysis import metrics
from probtrans.analysis.feature_scores import FEATURE_SCORES


@pytest.fixture
def random_predictions() -> tuple[np.ndarray, np.ndarray]:
    """Posterior samples (S=8, N=200, C=4) from a Dirichlet and random labels, fixed seed."""
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(4), size=(8, 200))
    labels = rng.integers(0, 4, size=200)
    return probs, labels


# A hand-worked top-label calibration example: N = 6, C = 3, 5 bins of width 0.2.
HAND_PROBS = np.array(
    [
        [0.90, 0.05, 0.05],  # conf 0.90, predicts 0, label 0: correct  -> bin 4
        [0.10, 0.70, 0.20],  # conf 0.70, predicts 1, label 1: correct  -> bin 3
        [0.30, 0.65, 0.05],  # conf 0.65, predicts 1, label 0: wrong    -> bin 3
        [0.50, 0.30, 0.20],  # conf 0.50, predicts 0, label 0: correct  -> bin 2
        [0.35, 0.45, 0.20],  # conf 0.45, predicts 1, label 2: wrong    -> bin 2
        [1.00, 0.00, 0.00],  # conf 1.00, predicts 0, label 1: wrong    -> bin 4 (the last)
    ]
)
HAND_LABELS = np.array([0, 1, 0, 0, 2, 1])


# ----------------------------------------------------------------------------- accuracy & scores
def test_predictive_mean_averages_samples(random_predictions):
    probs, _ = random_predictions
    mean = metrics.predictive_mean(probs)
    assert mean.shape == (200, 4)
    np.testing.assert_allclose(mean, probs.sum(axis=0) / 8)


def test_accuracy_mcc_nll_brier_match_sklearn(random_predictions):
    probs, labels = random_predictions
    mean = metrics.predictive_mean(probs)
    predicted = mean.argmax(axis=1)
    assert metrics.accuracy(mean, labels) == pytest.approx(accuracy_score(labels, predicted))
    assert metrics.mcc(mean, labels) == pytest.approx(matthews_corrcoef(labels, predicted))
    assert metrics.nll(mean, labels) == pytest.approx(log_loss(labels, mean, labels=range(4)))
    one_vs_rest = sum(brier_score_loss(labels == c, mean[:, c]) for c in range(4))
    assert metrics.brier(mean, labels) == pytest.approx(one_vs_rest)


def test_nll_clamps_zero_probability():
    mean = np.array([[1.0, 0.0], [0.5, 0.5]])
    labels = np.array([1, 0])
    assert metrics.nll(mean, labels) == pytest.approx((-math.log(1e-12) + math.log(2)) / 2)


def test_brier_hand_example():
    mean = np.array([[0.7, 0.2, 0.1], [0.0, 0.0, 1.0]])
    labels = np.array([0, 0])
    # (0.3² + 0.2² + 0.1²) = 0.14 and (1 + 0 + 1) = 2 -> mean 1.07
    assert metrics.brier(mean, labels) == pytest.approx(1.07)


# ----------------------------------------------------------------------------- calibration
def test_calibration_bins_hand_example():
    bins = metrics.calibration_bins(HAND_PROBS, HAND_LABELS, n_bins=5)
    np.testing.assert_allclose(bins["edges"], [0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    np.testing.assert_array_equal(bins["count"], [0, 0, 2, 2, 2])
    np.testing.assert_allclose(bins["confidence"][2:], [0.475, 0.675, 0.95])
    np.testing.assert_allclose(bins["accuracy"][2:], [0.5, 0.5, 0.5])
    assert np.isnan(bins["confidence"][:2]).all()
    assert np.isnan(bins["accuracy"][:2]).all()


def test_ece_mce_hand_example():
    # Gaps |acc - conf|: bin 2: 0.025, bin 3: 0.175, bin 4: 0.45, each bin holds 2 of 6.
    expected_ece = (2 / 6) * (0.025 + 0.175 + 0.45)
    assert metrics.ece(HAND_PROBS, HAND_LABELS, n_bins=5) == pytest.approx(expected_ece)
    assert metrics.mce(HAND_PROBS, HAND_LABELS, n_bins=5) == pytest.approx(0.45)


def test_confidence_one_goes_to_last_bin_and_inner_edge_to_lower_bin():
    mean = np.array([[1.0, 0.0], [0.5, 0.5]])
    labels = np.array([0, 1])
    bins = metrics.calibration_bins(mean, labels, n_bins=2)
    # 1.0 -> last bin (0.5, 1]; 0.5 sits on the inner edge -> first bin [0, 0.5].
    np.testing.assert_array_equal(bins["count"], [1, 1])
    np.testing.assert_allclose(bins["confidence"], [0.5, 1.0])
    np.testing.assert_allclose(bins["accuracy"], [0.0, 1.0])  # argmax of [0.5, 0.5] is 0
    assert metrics.ece(mean, labels, n_bins=2) == pytest.approx(0.25)
    assert metrics.mce(mean, labels, n_bins=2) == pytest.approx(0.5)


def test_perfectly_calibrated_predictions_have_zero_ece():
    # 10 examples at confidence 0.8 of which 8 are right; 5 at confidence 0.6 of which 3 are right.
    confident = np.tile([0.8, 0.2], (10, 1))
    unsure = np.tile([0.4, 0.6], (5, 1))
    mean = np.vstack([confident, unsure])
    labels = np.array([0] * 8 + [1] * 2 + [1] * 3 + [0] * 2)
    assert metrics.ece(mean, labels, n_bins=10) == pytest.approx(0.0, abs=1e-12)
    assert metrics.mce(mean, labels, n_bins=10) == pytest.approx(0.0, abs=1e-12)


def test_ece_all_classes_hand_example():
    mean = np.array([[0.8, 0.2], [0.4, 0.6]])
    labels = np.array([0, 0])
    # Class 0: 0.4 (y=0) in bin 0 -> |1 - 0.4| = 0.6; 0.8 (y=0) in bin 1 -> |1 - 0.8| = 0.2.
    # Class 1: 0.2 (y!=1) in bin 0 -> |0 - 0.2| = 0.2; 0.6 (y!=1) in bin 1 -> |0 - 0.6| = 0.6.
    # Each bin holds one example: sum = 1.6, divided by N * C = 4.
    assert metrics.ece_all_classes(mean, labels, n_bins=2) == pytest.approx(0.4)


def test_ece_all_classes_zero_when_calibrated_per_class():
    # Per class, every bin's frequency equals its mean probability.
    mean = np.tile([0.5, 0.5], (4, 1))
    labels = np.array([0, 1, 0, 1])
    assert metrics.ece_all_classes(mean, labels, n_bins=4) == pytest.approx(0.0, abs=1e-12)
    assert metrics.ece_all_classes(mean, np.array([0, 0, 0, 1]), n_bins=4) == pytest.approx(0.25)


# ----------------------------------------------------------------------------- uncertainty
def test_entropy_of_uniform_is_log_c():
    probs = np.full((3, 2, 5), 0.2)
    np.testing.assert_allclose(metrics.predictive_entropy(probs), [math.log(5)] * 2)
    np.testing.assert_allclose(metrics.expected_entropy(probs), [math.log(5)] * 2)


def test_mutual_information_zero_for_identical_samples(random_predictions):
    probs, _ = random_predictions
    identical = np.repeat(probs[:1], 5, axis=0)
    mi = metrics.mutual_information(identical)
    assert mi.shape == (200,)
    np.testing.assert_allclose(mi, 0.0, atol=1e-12)


def test_mutual_information_positive_when_samples_disagree(random_predictions):
    probs, _ = random_predictions
    assert (metrics.mutual_information(probs) > 0).all()


def test_entropy_and_mutual_information_two_sample_hand_example():
    # Example 0: samples [1, 0] and [0, 1]. Example 1: samples [0.8, 0.2] and [0.4, 0.6].
    probs = np.array([[[1.0, 0.0], [0.8, 0.2]], [[0.0, 1.0], [0.4, 0.6]]])

    def h(p):
        return -(p * math.log(p) + (1 - p) * math.log(1 - p))

    np.testing.assert_allclose(metrics.predictive_entropy(probs), [math.log(2), h(0.6)])
    np.testing.assert_allclose(metrics.expected_entropy(probs), [0.0, (h(0.8) + h(0.4)) / 2])
    np.testing.assert_allclose(
        metrics.mutual_information(probs), [math.log(2), h(0.6) - (h(0.8) + h(0.4)) / 2]
    )


def test_msp():
    expected = [0.1, 0.3, 0.35, 0.5, 0.55, 0.0]
    np.testing.assert_allclose(metrics.msp(HAND_PROBS[None]), expected, atol=1e-12)


def test_std_true_class_hand_example():
    # S = 3, N = 2, C = 2; true-class probabilities over samples: [0.2, 0.4, 0.6] and [0.9] * 3.
    probs = np.array(
        [
            [[0.8, 0.2], [0.9, 0.1]],
            [[0.6, 0.4], [0.9, 0.1]],
            [[0.4, 0.6], [0.9, 0.1]],
        ]
    )
    labels = np.array([1, 0])
    result = metrics.std_true_class(probs, labels)
    np.testing.assert_allclose(result, [math.sqrt(0.08 / 3), 0.0], atol=1e-12)
    np.testing.assert_allclose(result[0], np.std([0.2, 0.4, 0.6]))


# ----------------------------------------------------------------------------- OOD detection
def test_ood_detection_perfect_and_reversed_separation():
    score_in = np.array([0.1, 0.2, 0.3, 0.4])
    score_out = np.array([0.6, 0.7, 0.8])
    perfect = metrics.ood_detection(score_in, score_out)
    assert perfect == {"auroc": 1.0, "aupr": 1.0, "fpr95": 0.0}
    reversed_ = metrics.ood_detection(score_out, score_in)
    assert reversed_["auroc"] == 0.0
    assert reversed_["fpr95"] == 1.0


def test_ood_detection_matches_sklearn_and_the_fpr95_definition():
    rng = np.random.default_rng(1)
    score_in = rng.normal(0.0, 1.0, size=300)
    score_out = rng.normal(1.0, 1.0, size=150)
    result = metrics.ood_detection(score_in, score_out)
    is_ood = np.r_[np.zeros(300), np.ones(150)]
    score = np.r_[score_in, score_out]
    assert result["auroc"] == pytest.approx(roc_auc_score(is_ood, score))
    assert result["auroc"] == pytest.approx(roc_auc_score(1 - is_ood, -score))  # either positive
    assert result["aupr"] == pytest.approx(average_precision_score(is_ood, score))
    # FPR@95, in-domain positive: accept the 95% least uncertain in-domain inputs (score ≤ t,
    # t the 285th smallest in-domain score); the OOD inputs accepted with them are false positives
    threshold = np.sort(score_in)[math.ceil(0.95 * 300) - 1]
    assert result["fpr95"] == pytest.approx(np.mean(score_out <= threshold))


def test_fpr95_hand_example():
    score_in = np.arange(20.0)  # 20 in-domain scores; ≤ 18 accepts 19 of 20 = 95%
    score_out = np.array([5.0, 17.5, 18.0, 18.5, 25.0, 30.0])  # 5, 17.5, 18 are ≤ 18: 3 of 6
    assert metrics.ood_detection(score_in, score_out)["fpr95"] == pytest.approx(0.5)


def test_fpr95_uses_every_roc_threshold():
    # ROC points (0, 0.9), (0.05, 0.95), (0.1, 1) are collinear; a curve with intermediate points
    # dropped would skip the threshold 2.0 (19 of 20 in-domain ≤ 2, 1 of 20 OOD ≤ 2).
    score_in = np.array([0.0] * 18 + [2.0, 3.0])
    score_out = np.array([2.0, 3.0] + [10.0] * 18)
    assert metrics.ood_detection(score_in, score_out)["fpr95"] == pytest.approx(0.05)


#: the scores the network gives (not computed from its probabilities)
GIVEN = ("energy", *FEATURE_SCORES)


def _entropy_nats(p: np.ndarray) -> np.ndarray:
    return -(p * np.log(np.where(p > 0, p, 1.0))).sum(-1)


def test_uncertainty_scores_against_their_definitions(random_predictions):
    probs, _ = random_predictions
    given = {name: np.random.default_rng(i).normal(size=200) for i, name in enumerate(GIVEN)}
    scores = metrics.uncertainty_scores(probs, given)
    assert list(scores) == list(metrics.UNCERTAINTY_SCORES)
    mean = probs.mean(0)
    top = mean.argmax(1)
    np.testing.assert_allclose(scores["msp"], 1 - mean.max(1))
    np.testing.assert_allclose(scores["entropy"], _entropy_nats(mean))
    np.testing.assert_allclose(scores["expected_entropy"], _entropy_nats(probs).mean(0))
    np.testing.assert_allclose(
        scores["mutual_information"], _entropy_nats(mean) - _entropy_nats(probs).mean(0), atol=1e-12
    )
    np.testing.assert_allclose(scores["std_top"], np.std(probs[:, np.arange(200), top], axis=0))
    for name in GIVEN:  # the scores the network gives are passed through as they are
        np.testing.assert_array_equal(scores[name], given[name])
    assert not set(GIVEN) & set(metrics.uncertainty_scores(probs))


def test_every_score_agrees_with_sklearn_and_shares_the_orientation():
    """Hand-made: in-domain inputs get confident samples that agree; out-of-domain inputs get
    flat samples that disagree, and larger free energies. Every score must rank OOD higher."""
    rng = np.random.default_rng(0)
    n_in, n_out, samples = 40, 30, 6
    confident = np.array([0.9, 0.05, 0.05])
    probs_in = np.stack([np.roll(confident, rng.integers(3))] * n_in)[None].repeat(samples, 0)
    probs_in = probs_in + rng.uniform(0, 0.01, probs_in.shape)
    probs_out = rng.dirichlet([1.0, 1.0, 1.0], size=(samples, n_out))
    probs_in /= probs_in.sum(-1, keepdims=True)
    given_in = {name: rng.normal(-8, 1, n_in) for name in GIVEN}
    given_out = {name: rng.normal(-2, 1, n_out) for name in GIVEN}
    report = metrics.ood_report(probs_in, probs_out, given_in, given_out)
    assert list(report) == list(metrics.UNCERTAINTY_SCORES)
    scores_in = metrics.uncertainty_scores(probs_in, given_in)
    scores_out = metrics.uncertainty_scores(probs_out, given_out)
    is_ood = np.r_[np.zeros(n_in), np.ones(n_out)]
    for name, result in report.items():
        score = np.r_[scores_in[name], scores_out[name]]
        assert result["auroc"] == pytest.approx(roc_auc_score(is_ood, score)), name
        assert result["aupr"] == pytest.approx(average_precision_score(is_ood, score)), name
        assert result["auroc"] > 0.9, name  # higher = more uncertain, for every score
    assert not set(GIVEN) & set(metrics.ood_report(probs_in, probs_out))
    one_side = metrics.ood_report(probs_in, probs_out, given_in, {})  # a score needs both sides
    assert not set(GIVEN) & set(one_side)


# ----------------------------------------------------------------------------- selective prediction
def test_risk_coverage_and_aurc_hand_example():
    # Confidences 0.9, 0.8, 0.7, 0.6 with correctness 1, 0, 1, 0, given in shuffled order.
    mean = np.array([[0.3, 0.7], [0.9, 0.1], [0.4, 0.6], [0.2, 0.8]])
    labels = np.array([1, 0, 0, 0])  # correct, correct, wrong, wrong
    coverage, risk = metrics.risk_coverage(mean, labels)
    np.testing.assert_allclose(coverage, [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(risk, [0 / 1, 1 / 2, 1 / 3, 2 / 4])
    assert metrics.aurc(mean, labels) == pytest.approx((0 + 1 / 2 + 1 / 3 + 1 / 2) / 4)


# The same four examples, most confident first: 0.9 right, 0.8 wrong, 0.7 right, 0.6 wrong.
RC_MEAN = np.array([[0.3, 0.7], [0.9, 0.1], [0.4, 0.6], [0.2, 0.8]])
RC_LABELS = np.array([1, 0, 0, 0])


def test_augrc_hand_example():
    # Generalized risk (errors kept / all N) at coverage 0, 1/4, 2/4, 3/4, 1: 0, 0, 1/4, 1/4, 2/4.
    # Trapezoids of width 1/4: (0 + 0)/2 + (0 + 1/4)/2 + (1/4 + 1/4)/2 + (1/4 + 2/4)/2 = 3/4.
    assert metrics.augrc(RC_MEAN, RC_LABELS) == pytest.approx(3 / 4 * 1 / 4)
    # Traub et al.'s reading: acc = 1/2; a right prediction is more confident than a wrong one
    # in 3 of the 4 pairs (0.9 > 0.8, 0.9 > 0.6, 0.7 > 0.6), so AUROC_f = 3/4 and
    # (1 - 3/4) · 1/2 · 1/2 + (1/2)² / 2 = 1/16 + 1/8 = 3/16.
    assert metrics.augrc(RC_MEAN, RC_LABELS) == pytest.approx(3 / 16)


def test_augrc_extremes():
    right = np.array([[0.9, 0.1], [0.6, 0.4], [0.7, 0.3]])
    assert metrics.augrc(right, np.array([0, 0, 0])) == 0.0  # no failures: no risk
    # every prediction wrong: GR = coverage, the area under the diagonal is 1/2
    assert metrics.augrc(right, np.array([1, 1, 1])) == pytest.approx(0.5)


def test_augrc_matches_the_auroc_identity_with_sklearn(random_predictions):
    """Without ties, AUGRC = (1 − AUROC_f) · acc · (1 − acc) + (1 − acc)² / 2 with AUROC_f the
    AUROC of the confidence separating right from wrong predictions (scikit-learn)."""
    probs, labels = random_predictions
    mean = probs.mean(axis=0)
    confidence = mean.max(axis=1)
    correct = mean.argmax(axis=1) == labels
    acc = correct.mean()
    auroc_f = roc_auc_score(correct, confidence)
    expected = (1 - auroc_f) * acc * (1 - acc) + (1 - acc) ** 2 / 2
    assert metrics.augrc(mean, labels) == pytest.approx(expected)


def test_coverage_at_risk_hand_examples():
    # Risks of RC_MEAN at coverage 1/4 … 1: 0, 1/2, 1/3, 1/2. At most 5 %: only coverage 1/4.
    assert metrics.coverage_at_risk(RC_MEAN, RC_LABELS) == pytest.approx(0.25)
    # At most 40 %: 1/4 and 3/4; the largest is kept although 2/4 exceeds it (not monotonic).
    assert metrics.coverage_at_risk(RC_MEAN, RC_LABELS, 0.4) == pytest.approx(0.75)
    assert metrics.coverage_at_risk(RC_MEAN, RC_LABELS, 0.5) == pytest.approx(1.0)
    # torch-uncertainty's CovAtxRisk example: confidences 0.9, 0.8, 0.7 right, 0.6, 0.5 wrong;
    # risks 0, 0, 0, 1/4, 2/5; at most 30 %: coverage 4/5.
    mean = np.array([[0.9, 0.1], [0.6, 0.4], [0.8, 0.2], [0.5, 0.5], [0.7, 0.3]])
    labels = np.array([0, 1, 0, 1, 0])
    assert metrics.coverage_at_risk(mean, labels, 0.3) == pytest.approx(0.8)
    assert metrics.coverage_at_risk(mean, labels, 0.05) == pytest.approx(0.6)


def test_coverage_at_risk_inclusive_and_none_attained():
    # 20 examples, the least confident one wrong: risk 1/20 = 5 % exactly at full coverage.
    mean = np.stack([np.linspace(0.99, 0.6, 20), 1 - np.linspace(0.99, 0.6, 20)], axis=1)
    labels = np.array([0] * 19 + [1])
    assert metrics.coverage_at_risk(mean, labels, 0.05) == 1.0
    # the most confident is wrong and so is every other: no coverage has risk ≤ 5 % → NaN
    assert math.isnan(metrics.coverage_at_risk(mean, np.ones(20, dtype=int), 0.05))


def test_risk_at_coverage_hand_example():
    # Risks of RC_MEAN at coverage 1/4 … 1: 0, 1/2, 1/3, 1/2; ⌈0.8 · 4⌉ = 4 examples kept.
    assert metrics.risk_at_coverage(RC_MEAN, RC_LABELS) == pytest.approx(1 / 2)
    assert metrics.risk_at_coverage(RC_MEAN, RC_LABELS, 0.75) == pytest.approx(1 / 3)
    assert metrics.risk_at_coverage(RC_MEAN, RC_LABELS, 0.1) == 0.0  # ⌈0.4⌉ = 1 kept


def test_risk_at_coverage_keeps_ceil_of_the_exact_product():
    # 0.55 · 100 is 55.00000000000001 in floating point; 55 examples are kept, not 56. Only the
    # 56th most confident prediction is wrong.
    confidence = np.linspace(0.99, 0.51, 100)
    mean = np.stack([confidence, 1 - confidence], axis=1)
    labels = np.zeros(100, dtype=int)
    labels[55] = 1
    assert metrics.risk_at_coverage(mean, labels, 0.55) == 0.0
    assert metrics.risk_at_coverage(mean, labels, 0.56) == pytest.approx(1 / 56)


# ----------------------------------------------------------------------------- adaptive ECE
def test_adaptive_ece_hand_example():
    # HAND_PROBS by confidence: 0.45 wrong, 0.5 right, 0.65 wrong, 0.7 right, 0.9 right, 1.0 wrong.
    # 3 equal-mass bins of 2: gaps |0.5 - 0.475|, |0.5 - 0.675|, |0.5 - 0.95|, each of weight 2/6.
    assert metrics.adaptive_ece(HAND_PROBS, HAND_LABELS, 3) == pytest.approx(2 / 6 * 0.65)
    # 4 bins hold 2, 2, 1, 1: 2 · 0.025 + 2 · 0.175 + |1 - 0.9| + |0 - 1.0| = 1.5, over 6.
    assert metrics.adaptive_ece(HAND_PROBS, HAND_LABELS, 4) == pytest.approx(0.25)
    # more bins than examples: one example per bin, Σ |correct - conf| / N = 3.0 / 6
    assert metrics.adaptive_ece(HAND_PROBS, HAND_LABELS, 10) == pytest.approx(0.5)


def test_adaptive_ece_equal_mass_bins(random_predictions):
    probs, labels = random_predictions
    mean = probs.mean(axis=0)[:150]
    labels = labels[:150]
    confidence = mean.max(axis=1)
    correct = mean.argmax(axis=1) == labels
    order = np.argsort(confidence)  # no ties: 15 bins of exactly 10 examples
    gaps = np.abs(
        correct[order].reshape(15, 10).mean(1) - confidence[order].reshape(15, 10).mean(1)
    )
    assert metrics.adaptive_ece(mean, labels) == pytest.approx(gaps.mean())
    # one bin: |accuracy - mean confidence|
    assert metrics.adaptive_ece(mean, labels, 1) == pytest.approx(
        abs(correct.mean() - confidence.mean())
    )


# ----------------------------------------------------------------------------- ensembles
def test_disagreement_hand_example():
    # torch-uncertainty's Disagreement example, as (S = 3 members, N = 2, C = 2). Example 0: all
    # predict 0 → 0. Example 1: 1, 0 (a tie goes to the first class), 1 → 1 agreeing pair of 3
    # → 2/3. Mean 1/3.
    probs = np.array(
        [
            [[0.7, 0.3], [0.4, 0.6]],
            [[0.6, 0.4], [0.5, 0.5]],
            [[0.8, 0.2], [0.3, 0.7]],
        ]
    )
    assert metrics.disagreement(probs) == pytest.approx(1 / 3)
    two = np.array([[[0.9, 0.1]], [[0.2, 0.8]]])  # two members, two classes: they disagree
    assert metrics.disagreement(two) == 1.0


def test_disagreement_counts_member_pairs(random_predictions):
    probs, _ = random_predictions  # S = 8, N = 200, C = 4
    predicted = probs.argmax(axis=2)
    pairs = list(itertools.combinations(range(8), 2))
    per_example = [
        np.mean([predicted[a, n] != predicted[b, n] for a, b in pairs]) for n in range(200)
    ]
    assert metrics.disagreement(probs) == pytest.approx(np.mean(per_example))
    assert metrics.disagreement(np.repeat(probs[:1], 3, axis=0)) == 0.0


# ----------------------------------------------------------------------------- summaries & errors
def test_classification_metrics_keys_and_values(random_predictions):
    probs, labels = random_predictions
    result = metrics.classification_metrics(probs, labels)
    assert list(result) == [
        "accuracy",
        "mcc",
        "nll",
        "brier",
        "ece",
        "aece",
        "mce",
        "ece_all_classes",
        "entropy",
        "mutual_information",
        "std_true_class",
        "aurc",
        "augrc",
        "cov_at_5_risk",
        "risk_at_80_cov",
        "disagreement",
    ]
    assert all(isinstance(value, float) for value in result.values())
    mean = probs.mean(axis=0)
    assert result["ece"] == pytest.approx(metrics.ece(mean, labels, 15))
    assert result["entropy"] == pytest.approx(metrics.predictive_entropy(probs).mean())
    assert result["aece"] == pytest.approx(metrics.adaptive_ece(mean, labels, 15))
    assert result["augrc"] == pytest.approx(metrics.augrc(mean, labels))
    assert result["risk_at_80_cov"] == pytest.approx(metrics.risk_at_coverage(mean, labels, 0.8))
    assert result["disagreement"] == pytest.approx(metrics.disagreement(probs))
    assert "disagreement" not in metrics.classification_metrics(probs[:1], labels)  # S = 1
    chosen = [metrics.METRICS.get("nll", "test"), metrics.METRICS.get("accuracy", "test")]
    assert metrics.classification_metrics(probs, labels, chosen) == {
        "nll": result["nll"],
        "accuracy": result["accuracy"],
    }


def test_every_metric_is_described():
    """Each descriptor says which way is better where that has a meaning, has a label and a
    unit compare can show, and a distinct torch-uncertainty name."""
    described = metrics.METRICS.entries()
    assert [m.name for m in described] == list(metrics.METRICS)
    assert all(m.label and m.unit in ("%", "nats") for m in described)
    assert all(m.higher_is_better is not None for m in described if m.compared)  # arrows
    names = [m.torch_uncertainty for m in described if m.torch_uncertainty]
    assert len(set(names)) == len(names)
    assert [m.name for m in described if m.min_draws > 1] == ["disagreement"]
    assert [s.name for s in metrics.UNCERTAINTY_SCORES.entries() if s.function is None] == [
        "energy",
        *FEATURE_SCORES,
    ]


def test_a_registry_forgets_what_was_registered_inside_restored():
    extra = metrics.Metric(
        name="extra", function=metrics.of_mean(metrics.accuracy), higher_is_better=True, label="x"
    )
    with metrics.METRICS.restored():
        metrics.register_metric(extra)
        assert list(metrics.METRICS)[-1] == "extra"
        with pytest.raises(ValueError, match="already registered"):
            metrics.register_metric(extra)
    assert "extra" not in metrics.METRICS


def test_bad_shapes_raise():
    probs = np.full((2, 3, 4), 0.25)
    with pytest.raises(ValueError, match="must be 3-D"):
        metrics.classification_metrics(probs[0], np.zeros(3, dtype=int))
    with pytest.raises(ValueError, match=r"labels must have shape \(3,\)"):
        metrics.classification_metrics(probs, np.zeros(5, dtype=int))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 4\)"):
        metrics.classification_metrics(probs, np.array([0, 1, 4]))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 4\)"):
        metrics.accuracy(probs[0], np.array([-1, 0, 0]))
    with pytest.raises(ValueError, match="mean_probs must be 2-D"):
        metrics.ece(probs, np.zeros(3, dtype=int))
    with pytest.raises(ValueError, match="same number of classes"):
        metrics.ood_report(probs, np.full((2, 3, 2), 0.5))
    with pytest.raises(ValueError, match=r"energy must have shape \(3,\)"):
        metrics.uncertainty_scores(probs, {"energy": np.zeros(4)})
    with pytest.raises(ValueError, match="score_out must be a non-empty 1-D array"):
        metrics.ood_detection(np.zeros(3), np.zeros((2, 2)))


def test_bad_inputs_of_the_new_metrics_raise():
    probs = np.full((2, 3, 4), 0.25)
    labels = np.zeros(3, dtype=int)
    with pytest.raises(ValueError, match="mean_probs must be 2-D"):
        metrics.adaptive_ece(probs, labels)
    with pytest.raises(ValueError, match="n_bins must be at least 1"):
        metrics.adaptive_ece(probs[0], labels, 0)
    for metric in (metrics.augrc, metrics.coverage_at_risk, metrics.risk_at_coverage):
        with pytest.raises(ValueError, match=r"labels must have shape \(3,\)"):
            metric(probs[0], np.zeros(4, dtype=int))
        with pytest.raises(ValueError, match="mean_probs must be 2-D"):
            metric(probs, labels)
    with pytest.raises(ValueError, match=r"risk must lie in \[0, 1\]"):
        metrics.coverage_at_risk(probs[0], labels, 5.0)
    with pytest.raises(ValueError, match=r"coverage must lie in \(0, 1\]"):
        metrics.risk_at_coverage(probs[0], labels, 0.0)
    with pytest.raises(ValueError, match="must be 3-D"):
        metrics.disagreement(probs[0])
    with pytest.raises(ValueError, match="at least 2 samples"):
        metrics.disagreement(probs[:1])
