"""Temperature scaling (Guo et al., ICML 2017), applicable on top of any model's predictive.

The predictive mean p̄(y | x) = (1/S) Σ_s p(y | x, draw s) is recalibrated as
p_T(y | x) ∝ exp(log p̄(y | x) / T), with the one scalar T > 0 fitted by minimising the negative
log-likelihood on the validation split. T = 1 is the identity, and the fitted T is kept only if
it does not raise the validation NLL, so temperature scaling never makes validation NLL worse.
Accuracy is unchanged (the argmax does not move).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax

from probtrans.analysis import metrics

#: search interval of log T
LOG_T_BOUNDS = (np.log(0.05), np.log(50.0))


def tempered(mean_probs: np.ndarray, temperature: float) -> np.ndarray:
    """p_T ∝ p̄^(1/T), row-wise; mean_probs (N, C) → (N, C)."""
    log_p = np.log(np.clip(mean_probs, 1e-30, None))
    return np.exp(log_softmax(log_p / temperature, axis=-1))


def fit_temperature(val_probs: np.ndarray, val_labels: np.ndarray) -> float:
    """The T minimising validation NLL of :func:`tempered`; val_probs (S, N, C) posterior draws."""
    mean = metrics.predictive_mean(val_probs)
    labels = np.asarray(val_labels)

    def val_nll(log_t: float) -> float:
        return metrics.nll(tempered(mean, float(np.exp(log_t))), labels)

    best = minimize_scalar(val_nll, bounds=LOG_T_BOUNDS, method="bounded")
    return float(np.exp(best.x)) if best.fun <= val_nll(0.0) else 1.0


def temperature_scaled(probs: np.ndarray, temperature: float) -> np.ndarray:
    """Posterior draws (S, N, C) → the tempered predictive as a single draw (1, N, C), the form
    every function of :mod:`probtrans.analysis.metrics` takes."""
    return tempered(metrics.predictive_mean(probs), temperature)[None]
