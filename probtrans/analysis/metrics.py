"""Metrics over posterior-predictive samples: accuracy, calibration, uncertainty, OOD, selection.

Conventions used throughout:

* ``probs`` has shape (S, N, C): the class probabilities p_s(c | x_n) under posterior sample s.
* ``mean_probs`` has shape (N, C): the posterior predictive p(c | x_n) = (1/S) Σ_s p_s(c | x_n).
* ``labels`` has shape (N,): integer classes in [0, C).
* Entropies are in nats; 0 · log 0 is taken as 0.
* Calibration uses ``n_bins`` equal-width bins on [0, 1] with edges e_b = b / n_bins. Bin b
  (b = 0 … n_bins - 1) holds the values v with e_b < v ≤ e_{b+1}; the first bin also holds
  v = 0, so a value of exactly 1.0 falls in the last bin and a value on an inner edge falls in
  the lower of the two bins. The adaptive ECE uses equal-mass bins instead (:func:`adaptive_ece`).
* Selective prediction ranks the examples by confidence max_c p(c | x_n), most confident first,
  ties in input order (:func:`risk_coverage`); keeping the k most confident gives coverage k / N.

Two registries, at the end of the module, describe what every report shows: :data:`METRICS`, one
:class:`Metric` per key of ``metrics.json`` (its function, whether higher is better, its label,
its torch-uncertainty name, and where it appears), and :data:`UNCERTAINTY_SCORES`, one
:class:`Score` per per-example uncertainty score. A new metric is its function and one
:func:`register_metric` line; the summary, the printed tables, ``compare`` and the figures
iterate the registry.

Only numpy and scikit-learn are used; every function returns numpy arrays or Python floats.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
from sklearn.metrics import (
    average_precision_score,
    matthews_corrcoef,
    roc_auc_score,
    roc_curve,
)

from probtrans.errors import ConfigError
from probtrans.registry import Registry

_PROB_FLOOR = 1e-12  # p(y) is clamped here before taking the log in the NLL


# ----------------------------------------------------------------------------- input checks
def _check_probs(probs: np.ndarray, name: str = "probs") -> np.ndarray:
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 3:
        raise ValueError(
            f"{name} must be 3-D (samples S, examples N, classes C), got shape {probs.shape}"
        )
    if 0 in probs.shape:
        raise ValueError(f"{name} must not be empty, got shape {probs.shape}")
    return probs


def _check_mean_probs(mean_probs: np.ndarray) -> np.ndarray:
    mean_probs = np.asarray(mean_probs, dtype=np.float64)
    if mean_probs.ndim != 2:
        raise ValueError(
            f"mean_probs must be 2-D (examples N, classes C), got shape {mean_probs.shape}"
            + (" (draws (S, N, C): pass their mean over axis 0)" if mean_probs.ndim == 3 else "")
        )
    if 0 in mean_probs.shape:
        raise ValueError(f"mean_probs must not be empty, got shape {mean_probs.shape}")
    return mean_probs


def check_labels(
    labels: np.ndarray, n_examples: int, n_classes: int, against: str = "the predictions"
) -> np.ndarray:
    """Labels as an integer array (n_examples,) in [0, n_classes), else a ValueError naming the
    shape, dtype or values (``against``: what the labels must match in length)."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.shape[0] != n_examples:
        raise ValueError(
            f"labels must have shape ({n_examples},) to match {against}, got shape {labels.shape}"
        )
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be integers, got dtype {labels.dtype}")
    if labels.min() < 0 or labels.max() >= n_classes:
        raise ValueError(
            f"labels must lie in [0, {n_classes}), got values in [{labels.min()}, {labels.max()}]"
        )
    return labels


def _check_n_bins(n_bins: int) -> None:
    if n_bins < 1:
        raise ValueError(f"n_bins must be at least 1, got {n_bins}")


def _mean_probs_and_labels(
    mean_probs: np.ndarray, labels: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    mean_probs = _check_mean_probs(mean_probs)
    labels = check_labels(labels, mean_probs.shape[0], mean_probs.shape[1])
    return mean_probs, labels


def _entropy(p: np.ndarray) -> np.ndarray:
    """H(p) = -Σ_c p_c log p_c over the last axis, with 0 · log 0 = 0."""
    positive = p > 0
    plogp = np.where(positive, p * np.log(np.where(positive, p, 1.0)), 0.0)
    return -plogp.sum(axis=-1)


# ----------------------------------------------------------------------------- predictive
def predictive_mean(probs: np.ndarray) -> np.ndarray:
    """Posterior predictive p(c | x_n) = (1/S) Σ_s p_s(c | x_n); shape (S, N, C) → (N, C)."""
    return _check_probs(probs).mean(axis=0)


# ----------------------------------------------------------------------------- accuracy
def accuracy(mean_probs: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of examples with argmax_c p(c | x_n) = y_n."""
    mean_probs, labels = _mean_probs_and_labels(mean_probs, labels)
    return float(np.mean(mean_probs.argmax(axis=1) == labels))


def mcc(mean_probs: np.ndarray, labels: np.ndarray) -> float:
    """Matthews correlation coefficient of the argmax predictions (multiclass, via scikit-learn)."""
    mean_probs, labels = _mean_probs_and_labels(mean_probs, labels)
    return float(matthews_corrcoef(labels, mean_probs.argmax(axis=1)))


def nll(mean_probs: np.ndarray, labels: np.ndarray) -> float:
    """Negative log-likelihood (1/N) Σ_n -log max(p(y_n | x_n), 1e-12)."""
    mean_probs, labels = _mean_probs_and_labels(mean_probs, labels)
    p_true = mean_probs[np.arange(labels.size), labels]
    return float(np.mean(-np.log(np.maximum(p_true, _PROB_FLOOR))))


def brier(mean_probs: np.ndarray, labels: np.ndarray) -> float:
    """Multiclass Brier score (1/N) Σ_n Σ_c (p(c | x_n) - 1[y_n = c])²; it lies in [0, 2]."""
    mean_probs, labels = _mean_probs_and_labels(mean_probs, labels)
    onehot = np.eye(mean_probs.shape[1])[labels]
    return float(np.mean(np.sum((mean_probs - onehot) ** 2, axis=1)))


# ----------------------------------------------------------------------------- calibration
def _bin_index(values: np.ndarray, n_bins: int) -> np.ndarray:
    """Bin of each value in [0, 1]: bins are (lo, hi], the first also holds 0 (module docstring)."""
    inner_edges = np.linspace(0.0, 1.0, n_bins + 1)[1:-1]
    return np.searchsorted(inner_edges, values, side="left")


def _binned_means(
    values: np.ndarray, hits: np.ndarray, n_bins: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-bin count, mean value and mean hit; the means are NaN in empty bins."""
    index = _bin_index(values, n_bins)
    count = np.bincount(index, minlength=n_bins)
    value_sum = np.bincount(index, weights=values, minlength=n_bins)
    hit_sum = np.bincount(index, weights=hits.astype(np.float64), minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        return count, value_sum / count, hit_sum / count


def calibration_bins(
    mean_probs: np.ndarray, labels: np.ndarray, n_bins: int = 15
) -> dict[str, np.ndarray]:
    """Top-label reliability bins (Guo et al. 2017, "On Calibration of Modern Neural Networks").

    The confidence of example n is conf_n = max_c p(c | x_n) and it is correct when
    argmax_c p(c | x_n) = y_n. The confidences are put in ``n_bins`` equal-width bins on [0, 1]:
    bin b is (b / n_bins, (b + 1) / n_bins], except that the first bin also includes 0 (so a
    confidence of exactly 1.0 lands in the last bin and one on an inner edge in the lower bin).

    Returns a dict with arrays
      * ``edges`` (n_bins + 1,): the bin edges 0, 1/n_bins, …, 1;
      * ``count`` (n_bins,): n_b, the number of examples in bin b;
      * ``confidence`` (n_bins,): conf_b = mean confidence in bin b (NaN if the bin is empty);
      * ``accuracy`` (n_bins,): acc_b = fraction correct in bin b (NaN if the bin is empty).
    """
    _check_n_bins(n_bins)
    mean_probs, labels = _mean_probs_and_labels(mean_probs, labels)
    confidence = mean_probs.max(axis=1)
    correct = mean_probs.argmax(axis=1) == labels
    count, bin_confidence, bin_accuracy = _binned_means(confidence, correct, n_bins)
    return {
        "edges": np.linspace(0.0, 1.0, n_bins + 1),
        "count": count,
        "confidence": bin_confidence,
        "accuracy": bin_accuracy,
    }


def _calibration_gaps(
    mean_probs: np.ndarray, labels: np.ndarray, n_bins: int
) -> tuple[np.ndarray, np.ndarray]:
    """Counts and |acc_b - conf_b| of the non-empty top-label bins."""
    bins = calibration_bins(mean_probs, labels, n_bins)
    filled = bins["count"] > 0
    return bins["count"][filled], np.abs(bins["accuracy"] - bins["confidence"])[filled]


def ece(mean_probs: np.ndarray, labels: np.ndarray, n_bins: int = 15) -> float:
    """Top-label expected calibration error (Guo et al. 2017) of the predictive ``mean_probs``
    (N, C) (of S draws (S, N, C): their mean over axis 0) and the integer ``labels`` (N,).

    ECE = Σ_b (n_b / N) |acc_b - conf_b| over the ``n_bins`` equal-width bins of
    :func:`calibration_bins`; empty bins contribute nothing.
    """
    count, gap = _calibration_gaps(mean_probs, labels, n_bins)
    return float(np.sum(count * gap) / np.sum(count))


def mce(mean_probs: np.ndarray, labels: np.ndarray, n_bins: int = 15) -> float:
    """Maximum calibration error (Guo et al. 2017): MCE = max_b |acc_b - conf_b| over non-empty
    bins of :func:`calibration_bins`."""
    _, gap = _calibration_gaps(mean_probs, labels, n_bins)
    return float(gap.max())


def ece_all_classes(mean_probs: np.ndarray, labels: np.ndarray, n_bins: int = 15) -> float:
    """All-class ("classwise", "static") calibration error.

    For every class c, the N values p(c | x_n) are binned with the same bins as
    :func:`calibration_bins` (equal width on [0, 1], (lo, hi], first bin includes 0). In bin b of
    class c, with n_{c,b} examples, let conf_{c,b} be the mean of p(c | x_n) and freq_{c,b} the
    fraction of those examples with y_n = c. Then

        ECE_all = Σ_c Σ_b n_{c,b} / (N · C) · |freq_{c,b} - conf_{c,b}|,

    i.e. the per-class ECEs averaged over the C classes; empty bins contribute nothing.
    """
    _check_n_bins(n_bins)
    mean_probs, labels = _mean_probs_and_labels(mean_probs, labels)
    n_examples, n_classes = mean_probs.shape
    total = 0.0
    for c in range(n_classes):
        count, conf, freq = _binned_means(mean_probs[:, c], labels == c, n_bins)
        filled = count > 0
        total += float(np.sum(count[filled] * np.abs(freq[filled] - conf[filled])))
    return total / (n_examples * n_classes)


def adaptive_ece(mean_probs: np.ndarray, labels: np.ndarray, n_bins: int = 15) -> float:
    """Top-label adaptive (equal-mass) calibration error: torch-uncertainty's ``cal/aECE``
    (``AdaptiveCalibrationError``). Nixon et al. 2019 ("Measuring Calibration in Deep
    Learning") introduced equal-mass ranges for their ACE, which averages over all classes; this
    is the top-label version, as torch-uncertainty computes it.

    The N examples are sorted by confidence conf_n = max_c p(c | x_n) (ascending, ties in input
    order) and split into ``n_bins`` consecutive bins of ⌈N / n_bins⌉ or ⌊N / n_bins⌋ examples,
    the larger ones first (``numpy.array_split``). With n_b examples, mean confidence conf_b and
    accuracy acc_b in bin b,

        aECE = Σ_b (n_b / N) |acc_b - conf_b|;

    with fewer examples than bins the empty bins contribute nothing.
    """
    _check_n_bins(n_bins)
    mean_probs, labels = _mean_probs_and_labels(mean_probs, labels)
    confidence = mean_probs.max(axis=1)
    correct = (mean_probs.argmax(axis=1) == labels).astype(np.float64)
    total = 0.0
    for members in np.array_split(np.argsort(confidence, kind="stable"), n_bins):
        if members.size:
            total += members.size * abs(correct[members].mean() - confidence[members].mean())
    return total / labels.size


# ----------------------------------------------------------------------------- uncertainty
def predictive_entropy(probs: np.ndarray) -> np.ndarray:
    """Entropy of the posterior predictive, H[p̄(· | x_n)] = -Σ_c p̄_c log p̄_c (nats); shape (N,)."""
    return _entropy(predictive_mean(probs))


def expected_entropy(probs: np.ndarray) -> np.ndarray:
    """Expected entropy (aleatoric part), (1/S) Σ_s H[p_s(· | x_n)] (nats); shape (N,)."""
    return _entropy(_check_probs(probs)).mean(axis=0)


def mutual_information(probs: np.ndarray) -> np.ndarray:
    """Mutual information between label and parameters (epistemic part, "BALD"); shape (N,).

    MI_n = H[p̄(· | x_n)] - (1/S) Σ_s H[p_s(· | x_n)] ≥ 0, clipped at 0 against rounding error.
    """
    return np.maximum(predictive_entropy(probs) - expected_entropy(probs), 0.0)


def std_true_class(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Spread of the true-class probability over posterior samples; shape (N,).

    std_n = sqrt((1/S) Σ_s (p_s(y_n | x_n) - p̄(y_n | x_n))²), the population std (ddof = 0).
    """
    probs = _check_probs(probs)
    labels = check_labels(labels, probs.shape[1], probs.shape[2])
    return probs[:, np.arange(labels.size), labels].std(axis=0)


def msp(probs: np.ndarray) -> np.ndarray:
    """1 − max_c p̄(c | x_n), one minus the maximum softmax probability of the posterior
    predictive (Hendrycks & Gimpel 2017); shape (N,)."""
    return 1.0 - predictive_mean(probs).max(axis=1)


def std_top(probs: np.ndarray) -> np.ndarray:
    """The standard deviation (ddof = 0) over samples of p_s(ĉ_n | x_n), ĉ_n the class of the
    posterior predictive p̄(· | x_n); shape (N,)."""
    probs = _check_probs(probs)
    top = probs.mean(axis=0).argmax(axis=1)
    return probs[:, np.arange(probs.shape[1]), top].std(axis=0)


# ----------------------------------------------------------------------------- OOD detection
def uncertainty_scores(
    probs: np.ndarray, given: dict[str, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """Every score of :data:`UNCERTAINTY_SCORES` of posterior-predictive samples ``probs``
    (S, N, C), in its order, each of shape (N,) and higher for a more uncertain input:
    ``msp`` (:func:`msp`), ``entropy`` (total uncertainty), ``expected_entropy`` (aleatoric),
    ``mutual_information`` (epistemic), ``std_top`` (:func:`std_top`), and the scores the
    network gives, not its probabilities, where ``given`` (name → (N,)) holds them: ``energy``,
    the free energy −log Σ_c exp f_c(x_n) of the logits f (Liu et al. 2020, temperature 1,
    averaged over samples by the caller), and the feature-space scores of
    :mod:`probtrans.analysis.feature_scores`.
    """
    probs = _check_probs(probs)
    given = given or {}
    scores = {}
    for score in UNCERTAINTY_SCORES.entries():
        if score.function is not None:
            scores[score.name] = score.function(probs)
        elif score.name in given:
            value = np.asarray(given[score.name], dtype=np.float64)
            if value.shape != (probs.shape[1],):
                raise ValueError(
                    f"{score.name} must have shape ({probs.shape[1]},), got {value.shape}"
                )
            scores[score.name] = value
    return scores


def ood_detection(score_in: np.ndarray, score_out: np.ndarray) -> dict[str, float]:
    """How well a score (higher = more uncertain) tells out-of-domain inputs from in-domain ones:
    ``score_in`` (N_in,) of the in-domain inputs, ``score_out`` (N_out,) of the out-of-domain
    ones (e.g. :func:`mutual_information` of each side's draws; :func:`ood_report` for every
    score of the class probabilities).

    * ``auroc``: area under the ROC curve (scikit-learn ``roc_auc_score``); the same with either
      class as positive;
    * ``aupr``: area under the precision-recall curve with out-of-domain as the positive class
      ("AUPR-Out"), as average precision (scikit-learn ``average_precision_score``);
    * ``fpr95``: the usual FPR@95 convention, in-domain as the positive class: the fraction of
      out-of-domain inputs accepted as in-domain at the threshold that accepts 95 % of the
      in-domain inputs (the smallest false-positive rate with recall ≥ 0.95 on the full
      scikit-learn ``roc_curve`` of in-domain vs −score). Lower is better.
    """
    score_in = np.asarray(score_in, dtype=np.float64)
    score_out = np.asarray(score_out, dtype=np.float64)
    for name, score in (("score_in", score_in), ("score_out", score_out)):
        if score.ndim != 1 or score.size == 0:
            raise ValueError(f"{name} must be a non-empty 1-D array, got shape {score.shape}")
        if not np.isfinite(score).all():
            raise ValueError(f"{name} holds {int((~np.isfinite(score)).sum())} non-finite values")
    is_ood = np.concatenate([np.zeros(score_in.size), np.ones(score_out.size)])
    score = np.concatenate([score_in, score_out])
    fpr, tpr, _ = roc_curve(1.0 - is_ood, -score, drop_intermediate=False)
    return {
        "auroc": float(roc_auc_score(is_ood, score)),
        "aupr": float(average_precision_score(is_ood, score)),
        "fpr95": float(fpr[np.argmax(tpr >= 0.95)]),
    }


def ood_report(
    probs_in: np.ndarray,
    probs_out: np.ndarray,
    given_in: dict[str, np.ndarray] | None = None,
    given_out: dict[str, np.ndarray] | None = None,
) -> dict[str, dict[str, float]]:
    """:func:`ood_detection` of every :func:`uncertainty_scores` score (a given score where both
    sides give it): score → {auroc, aupr, fpr95}, for in-domain ``probs_in`` (S, N_in, C)
    against out-of-domain ``probs_out`` (S', N_out, C)."""
    probs_in = _check_probs(probs_in, "probs_in")
    probs_out = _check_probs(probs_out, "probs_out")
    if probs_in.shape[2] != probs_out.shape[2]:
        raise ValueError(
            f"probs_in and probs_out must have the same number of classes, "
            f"got {probs_in.shape[2]} and {probs_out.shape[2]}"
        )
    given_in, given_out = given_in or {}, given_out or {}
    both = given_in.keys() & given_out.keys()
    scores_in = uncertainty_scores(probs_in, {k: given_in[k] for k in both})
    scores_out = uncertainty_scores(probs_out, {k: given_out[k] for k in both})
    return {name: ood_detection(scores_in[name], scores_out[name]) for name in scores_in}


# ----------------------------------------------------------------------------- selective prediction
def risk_coverage(mean_probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Risk-coverage curve of selective prediction by confidence (Geifman & El-Yaniv 2017).

    Examples are sorted by max_c p(c | x_n), most confident first (ties keep their input order).
    Keeping the k most confident examples gives coverage k / N and risk = (errors among them) / k,
    for k = 1, …, N. Returns (coverage, risk), each of shape (N,).
    """
    mean_probs, labels = _mean_probs_and_labels(mean_probs, labels)
    order = np.argsort(-mean_probs.max(axis=1), kind="stable")
    errors = (mean_probs.argmax(axis=1) != labels)[order]
    kept = np.arange(1, labels.size + 1)
    return kept / labels.size, np.cumsum(errors) / kept


def aurc(mean_probs: np.ndarray, labels: np.ndarray) -> float:
    """Area under the risk-coverage curve (Geifman & El-Yaniv 2017): AURC = (1/N) Σ_k risk_k,
    the mean risk over the N coverages of :func:`risk_coverage`. Lower is better."""
    _, risk = risk_coverage(mean_probs, labels)
    return float(risk.mean())


def augrc(mean_probs: np.ndarray, labels: np.ndarray) -> float:
    """Area under the generalized risk-coverage curve (Traub et al. 2024, "Overcoming Common
    Flaws in the Evaluation of Selective Classification Systems"; torch-uncertainty's
    ``sc/AUGRC``). Lower is better.

    The generalized risk of keeping the k most confident examples (:func:`risk_coverage`) is the
    fraction of *all* N examples that are kept and wrong: GR_k = (errors among them) / N =
    coverage_k · risk_k. AUGRC is the trapezoidal area under GR over coverage from (0, 0) through
    (k / N, GR_k), k = 1, …, N. Without tied confidences it equals

        AUGRC = (1 - AUROC_f) · acc · (1 - acc) + (1 - acc)² / 2,

    acc the accuracy and AUROC_f the probability that a random right prediction is more confident
    than a random wrong one: the average risk of undetected failures.
    """
    coverage, risk = risk_coverage(mean_probs, labels)
    return float(np.trapezoid(np.r_[0.0, coverage * risk], np.r_[0.0, coverage]))


def coverage_at_risk(mean_probs: np.ndarray, labels: np.ndarray, risk: float = 0.05) -> float:
    """The largest coverage k / N of :func:`risk_coverage` whose selective risk is at most
    ``risk``; NaN when no coverage attains it. ``risk = 0.05`` is torch-uncertainty's
    ``sc/Cov@5Risk`` (``CovAt5Risk``: the maximum such coverage when the risk is not monotonic,
    NaN when there is none). Higher is better."""
    if not 0.0 <= risk <= 1.0:
        raise ValueError(f"risk must lie in [0, 1], got {risk}")
    coverage, selective_risk = risk_coverage(mean_probs, labels)
    admissible = np.flatnonzero(selective_risk <= risk)
    return float(coverage[admissible[-1]]) if admissible.size else math.nan


def risk_at_coverage(mean_probs: np.ndarray, labels: np.ndarray, coverage: float = 0.8) -> float:
    """Selective risk of the ⌈coverage · N⌉ most confident examples (:func:`risk_coverage`):
    their error rate. ``coverage = 0.8`` is torch-uncertainty's ``sc/Risk@80Cov``
    (``RiskAt80Cov``). Lower is better."""
    if not 0.0 < coverage <= 1.0:
        raise ValueError(f"coverage must lie in (0, 1], got {coverage}")
    _, selective_risk = risk_coverage(mean_probs, labels)
    # rounded first: in floating point 0.55 · 100 is 55.00000000000001, whose ceiling is 56
    kept = max(1, math.ceil(round(coverage * selective_risk.size, 9)))
    return float(selective_risk[kept - 1])


# ----------------------------------------------------------------------------- ensembles
def disagreement(probs: np.ndarray) -> float:
    """Disagreement of the S ≥ 2 members (posterior draws) of ``probs`` (S, N, C):
    torch-uncertainty's ``Disagreement`` (``ens_Disagreement``), the mean over examples of the
    fraction of member pairs whose predicted classes differ. With m_{n,c} the number of members
    whose argmax_c p_s(c | x_n) is c,

        disagreement = (1/N) Σ_n [1 - Σ_c m_{n,c} (m_{n,c} - 1) / (S (S - 1))];

    0 when the members of every example predict one class, 1 when they all predict different
    classes. Higher means less agreement (more epistemic uncertainty).
    """
    probs = _check_probs(probs)
    members = probs.shape[0]
    if members < 2:
        raise ValueError(f"disagreement needs at least 2 samples (members), got {members}")
    predicted = probs.argmax(axis=2)  # (S, N)
    counts = (predicted[..., None] == np.arange(probs.shape[2])).sum(axis=0)  # (N, C)
    agreeing = (counts * (counts - 1)).sum(axis=1) / (members * (members - 1))
    return float(np.mean(1.0 - agreeing))


# ----------------------------------------------------------------------------- summaries
def classification_metrics(
    probs: np.ndarray, labels: np.ndarray, selected: Iterable[Metric] | None = None
) -> dict[str, float]:
    """The metrics of :data:`METRICS` (or those ``selected``), in their order, of
    posterior-predictive samples ``probs`` (S, N, C) with ``labels`` (N,). A metric that needs
    more draws than S (``disagreement`` of one sample) is left out; one without a value is NaN
    (``cov_at_5_risk`` when no coverage has a risk ≤ 5 %).
    """
    probs = _check_probs(probs)
    labels = check_labels(labels, probs.shape[1], probs.shape[2])
    chosen = METRICS.entries() if selected is None else selected
    return {m.name: m.function(probs, labels) for m in chosen if probs.shape[0] >= m.min_draws}


# ----------------------------------------------------------------------------- the registries
#: a metric as :data:`METRICS` calls it: (probs (S, N, C), labels (N,)) → float
MetricFunction = Callable[[np.ndarray, np.ndarray], float]


@dataclass(frozen=True, kw_only=True)
class Metric:
    """One metric of posterior-predictive samples: a key of every ``metrics.json``."""

    #: its key in ``metrics.json`` and the tables
    name: str
    #: (probs (S, N, C), labels (N,)) → float, NaN for no value; see :func:`of_mean`
    function: MetricFunction
    #: True or False; None for a description of the predictive (entropy), neither good nor bad
    higher_is_better: bool | None
    #: in words, for figures and printed tables
    label: str
    #: how ``compare`` shows it: "%" (a fraction, times 100) or "nats"
    unit: str = "%"
    #: its name in torch-uncertainty's ``ClassificationRoutine``, None when it has none
    torch_uncertainty: str | None = None
    #: printed by ``fit`` and ``evaluate``
    headline: bool = False
    #: also given after temperature scaling, as ``ts_NAME``
    temperature_scaled: bool = False
    #: also given for a labelled out-of-domain set (``metrics["ood"][SET][NAME]``)
    shifted: bool = False
    #: a column of ``compare``'s table and a panel of its figure
    compared: bool = False
    #: the fewest posterior draws it is defined for; with fewer the key is left out
    min_draws: int = 1

    @property
    def scale(self) -> float:
        """The factor ``compare`` shows it with: 100 for "%"."""
        return 100.0 if self.unit == "%" else 1.0


@dataclass(frozen=True, kw_only=True)
class Score:
    """One per-example uncertainty score, higher for a more uncertain input; for each, every
    out-of-domain set gets its AUROC, AUPR and FPR@95 (:func:`ood_report`)."""

    #: its key in ``metrics["ood"][SET]``
    name: str
    #: probs (S, N, C) → (N,); None for a score the network gives, not its probabilities (the
    #: free energy of its logits, the feature-space scores): the caller passes it
    function: Callable[[np.ndarray], np.ndarray] | None
    #: in words, for axis labels
    label: str
    #: also a column of the predictions for new inputs (:mod:`probtrans.runs.prediction`)
    column: bool = False


#: the in-domain metrics of ``metrics.json``, in its order
METRICS: Registry[Metric] = Registry("metric")
#: every uncertainty score, in the order of ``metrics["ood"][SET]``; the feature-space scores
#: (:mod:`probtrans.analysis.feature_scores`) register theirs when it is first read
UNCERTAINTY_SCORES: Registry[Score] = Registry(
    "uncertainty score", ("probtrans.analysis.feature_scores",)
)


def register_metric(metric: Metric) -> Metric:
    """Add ``metric`` after those registered: ``metrics.json``, the tables and the figures that
    its flags name show it from now on."""
    return METRICS.register(metric.name, metric)


def ranked_metric(name: str, field: str) -> Metric:
    """The metric ``name`` where methods or epochs are ranked by it (early stopping's
    ``[train] monitor``, a comparison's ``id_metric``): registered, and better higher or lower;
    else ConfigError naming ``field``."""
    metric = METRICS.get(name, field)
    if metric.higher_is_better is None:
        ranked = [entry.name for entry in METRICS.entries() if entry.higher_is_better is not None]
        raise ConfigError(
            f"{field} = {name!r}: describes the predictive, neither better higher nor lower; "
            f"choose one of {', '.join(ranked)}"
        )
    return metric


def register_score(score: Score) -> Score:
    """Add ``score`` after those registered: every out-of-domain report gets it."""
    return UNCERTAINTY_SCORES.register(score.name, score)


def of_mean(function: Callable[[np.ndarray, np.ndarray], float]) -> MetricFunction:
    """A metric ``function(mean_probs, labels)`` of the posterior predictive p̄ (N, C) as a
    metric of the samples."""

    def metric(probs: np.ndarray, labels: np.ndarray) -> float:
        return function(predictive_mean(probs), labels)

    return metric


def of_draws(function: Callable[[np.ndarray], np.ndarray | float]) -> MetricFunction:
    """A per-example score (or a float) of the samples, averaged over examples, as a metric."""

    def metric(probs: np.ndarray, labels: np.ndarray) -> float:
        return float(np.mean(function(probs)))

    return metric


# One registration per metric, in the order of ``metrics.json``: what it is, where it appears.
# fmt: off
register_metric(Metric(name="accuracy", function=of_mean(accuracy), higher_is_better=True,
    label="accuracy", torch_uncertainty="cls/Acc", headline=True, shifted=True))
register_metric(Metric(name="mcc", function=of_mean(mcc), higher_is_better=True,
    label="MCC", shifted=True))
register_metric(Metric(name="nll", function=of_mean(nll), higher_is_better=False,
    label="NLL", unit="nats", torch_uncertainty="cls/NLL", headline=True,
    temperature_scaled=True, shifted=True, compared=True))
register_metric(Metric(name="brier", function=of_mean(brier), higher_is_better=False,
    label="Brier", torch_uncertainty="cls/Brier", headline=True, temperature_scaled=True,
    compared=True))
register_metric(Metric(name="ece", function=of_mean(ece), higher_is_better=False,
    label="ECE", torch_uncertainty="cal/ECE", headline=True, temperature_scaled=True,
    shifted=True, compared=True))
register_metric(Metric(name="aece", function=of_mean(adaptive_ece), higher_is_better=False,
    label="adaptive ECE", torch_uncertainty="cal/aECE", headline=True, temperature_scaled=True))
register_metric(Metric(name="mce", function=of_mean(mce), higher_is_better=False,
    label="MCE", headline=True, temperature_scaled=True, compared=True))
register_metric(Metric(name="ece_all_classes", function=of_mean(ece_all_classes),
    higher_is_better=False, label="all-class ECE"))
register_metric(Metric(name="entropy", function=of_draws(predictive_entropy),
    higher_is_better=None, label="predictive entropy", unit="nats",
    torch_uncertainty="cls/Entropy"))
register_metric(Metric(name="mutual_information", function=of_draws(mutual_information),
    higher_is_better=None, label="mutual information", unit="nats", torch_uncertainty="ens_MI",
    headline=True))
register_metric(Metric(name="std_true_class",
    function=lambda probs, labels: float(std_true_class(probs, labels).mean()),
    higher_is_better=None, label="std of true-class probability"))
register_metric(Metric(name="aurc", function=of_mean(aurc), higher_is_better=False,
    label="AURC", torch_uncertainty="sc/AURC", headline=True, compared=True))
register_metric(Metric(name="augrc", function=of_mean(augrc), higher_is_better=False,
    label="AUGRC", torch_uncertainty="sc/AUGRC", headline=True))
register_metric(Metric(name="cov_at_5_risk", function=of_mean(coverage_at_risk),
    higher_is_better=True, label="coverage at 5 % risk", torch_uncertainty="sc/Cov@5Risk",
    headline=True))
register_metric(Metric(name="risk_at_80_cov", function=of_mean(risk_at_coverage),
    higher_is_better=False, label="risk at 80 % coverage", torch_uncertainty="sc/Risk@80Cov",
    headline=True))
register_metric(Metric(name="disagreement", function=of_draws(disagreement),
    higher_is_better=None, label="disagreement of draws", torch_uncertainty="ens_Disagreement",
    headline=True, min_draws=2))

# One registration per uncertainty score, in the order of ``metrics["ood"][SET]``.
register_score(Score(name="msp", function=msp, label="1 − max probability"))
register_score(Score(name="entropy", function=predictive_entropy,
    label="predictive entropy (nats)", column=True))
register_score(Score(name="expected_entropy", function=expected_entropy,
    label="expected entropy (nats)", column=True))
register_score(Score(name="mutual_information", function=mutual_information,
    label="mutual information (nats)", column=True))
register_score(Score(name="std_top", function=std_top, label="std of top-class probability",
    column=True))
register_score(Score(name="energy", function=None, label="free energy"))
# fmt: on
