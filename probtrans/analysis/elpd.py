"""Expected log pointwise predictive density (ELPD): held out on the test split, and PSIS-LOO on
the training split (Vehtari, Gelman & Gabry 2017, "VGG17").

Held out. The test examples ỹ_n were not fitted, so their log pointwise predictive density
under S posterior draws θ_s (VGG17's computed lpd, on data the posterior did not see) estimates
the ELPD of new data (VGG17 Eq. 1) by itself, with the standard error of VGG17 Eq. 23::

    elpd_test = Σ_n log (1/S) Σ_s p(ỹ_n | θ_s),    se = sqrt(N · Var_n elpd_test,n)

PSIS-LOO. On the training examples y_n (which the posterior saw), leave-one-out (Eq. 4) is
estimated with the importance ratios r_n^s = 1 / p(y_n | θ_s), Pareto smoothed into the weights
w_n^s (Eq. 10)::

    elpd_loo = Σ_n log( Σ_s w_n^s p(y_n | θ_s) / Σ_s w_n^s ),    p_loo = lpd − elpd_loo

with lpd = Σ_n log (1/S) Σ_s p(y_n | θ_s), the in-sample figure, and the same se (Eq. 23). The
shape k̂_n of the Pareto tail fitted to r_n says whether the estimate of example n can be
trusted: above min(1 − 1/log10 S, 0.7) it cannot (Vehtari, Simpson, Gelman, Yao & Gabry 2024,
"Pareto smoothed importance sampling", JMLR 25(72); ArviZ's ``good_k``).

Leaving an example out moves only the sites with a posterior: with a prior on the head alone,
the network below it saw every example whatever is left out, so the LOO of such a model is
optimistic (it can exceed a point-mass fit's in-sample lpd); the held-out ELPD is not.

A point-mass posterior (a ``delta`` guide) has S equal draws: its importance ratios are all
equal, the tail fit has nothing to fit (ArviZ reports k̂ = ∞), and leaving an example out cannot
move the posterior approximation. Its LOO is then the in-sample lpd with p_loo = 0, and is
reported as such, not as a failed diagnosis.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

#: global draws the Pareto tail fit wants: fewer flag the LOO as unreliable (its k̂ threshold,
#: 1 − 1/log10 S, is ≤ 0.5 below 100 draws, and the tail of 20 % of S is short)
MIN_LOO_DRAWS = 100
#: above this fraction of examples with k̂ over the threshold, the LOO as a whole is unreliable
UNRELIABLE_FRACTION = 0.05
#: how a LOO note begins for a point mass, and for an unreliable LOO
POINT_MASS = "point-mass posterior"
UNRELIABLE = "LOO unreliable"


def heldout_elpd(probs: np.ndarray, labels: np.ndarray) -> tuple[float, float, np.ndarray]:
    """Held-out ELPD of a predictive: the class probabilities p(c | x̃_n, θ_s) of S posterior
    draws ``probs`` (S, N, C) and the integer ``labels`` ỹ (N,) in [0, C) → (elpd_test, se,
    pointwise (N,)), pointwise_n = log (1/S) Σ_s p(ỹ_n | θ_s), se of VGG17 Eq. 23 (module
    docstring). A label probability below float32's smallest normal number (≈ 1e-38) counts as
    that number."""
    probs, labels = np.asarray(probs), np.asarray(labels)
    if probs.ndim != 3 or 0 in (probs.shape[0], probs.shape[2]):
        raise ValueError(
            f"probs must be 3-D (draws S ≥ 1, examples N, classes C ≥ 1), got shape {probs.shape}"
        )
    if labels.shape != probs.shape[1:2] or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"labels must be integers of shape ({probs.shape[1]},) to match probs, "
            f"got {labels.dtype} of shape {labels.shape}"
        )
    if labels.size and (labels.min() < 0 or labels.max() >= probs.shape[2]):
        raise ValueError(
            f"labels must lie in [0, {probs.shape[2]}), got values in "
            f"[{labels.min()}, {labels.max()}]"
        )
    taken = np.take_along_axis(probs, labels[None, :, None].astype(np.int64), -1)[..., 0]  # (S, N)
    mean = taken.astype(np.float64).mean(0)  # (N,)
    pointwise = np.log(np.maximum(mean, np.finfo(np.float32).tiny))
    return float(pointwise.sum()), standard_error(pointwise), pointwise


def standard_error(pointwise: np.ndarray) -> float:
    """sqrt(N · Var_n) of the pointwise values (VGG17 Eq. 23; ArviZ's se: variance with ddof 0);
    0 for no values."""
    return float(math.sqrt(len(pointwise) * pointwise.var())) if len(pointwise) else 0.0


@dataclass
class Loo:
    """PSIS-LOO over the training examples, as ``metrics.json`` keeps it."""

    elpd: float  # elpd_loo (the in-sample lpd for a point mass)
    se: float
    p_loo: float
    n: int  # training examples
    draws: int  # S
    k_threshold: float | None  # min(1 − 1/log10 S, 0.7); None for a point mass (no tail fit)
    k_good: int  # examples with k̂ ≤ threshold
    k_bad: int  # threshold < k̂ < ∞
    k_inf: int  # k̂ = ∞: the tail fit failed
    note: str  # empty when nothing is to be said
    reliable: bool

    def metrics(self) -> dict[str, float | int | str]:
        """``loo``, ``loo_se``, ``p_loo``, ``loo_k_bad`` (examples whose k̂ exceeds the
        threshold, infinite ones included) and ``loo_note``."""
        return {
            "loo": self.elpd,
            "loo_se": self.se,
            "p_loo": self.p_loo,
            "loo_k_bad": self.k_bad + self.k_inf,
            "loo_note": self.note,
        }


def psis_loo(log_lik: np.ndarray, point_mass: bool) -> Loo:
    """PSIS-LOO from the training log-likelihood log_lik (S, N) = log p(y_n | θ_s), one row per
    global posterior draw (ArviZ's ``az.loo``, with reff = 1: SVI draws are independent). A
    point mass (``point_mass``: all rows equal) gives the in-sample lpd with p_loo = 0 and no
    k̂; too few draws, or k̂ over the threshold on more than :data:`UNRELIABLE_FRACTION` of the
    examples, make it unreliable, which its note says."""
    draws, n = log_lik.shape
    if point_mass:
        pointwise = log_lik[0]  # every row is the same
        note = (
            f"{POINT_MASS}: LOO is the in-sample log predictive density (p_loo = 0); "
            "Pareto k̂ does not apply"
        )
        return Loo(
            elpd=float(pointwise.sum()),
            se=standard_error(pointwise),
            p_loo=0.0,
            n=n,
            draws=draws,
            k_threshold=None,
            k_good=0,
            k_bad=0,
            k_inf=0,
            note=note,
            reliable=True,
        )
    az = arviz()
    with warnings.catch_warnings():  # the k̂ warning: reported below, with counts
        warnings.simplefilter("ignore")
        result = az.loo(az.from_dict(log_likelihood={"y": log_lik[None]}), reff=1.0, pointwise=True)
    k = result.pareto_k.values  # (N,)
    threshold = float(result.good_k)
    k_inf = int(np.isinf(k).sum())
    k_bad = int((k > threshold).sum()) - k_inf
    flagged = f"Pareto k̂ > {threshold:.2f} on {k_bad + k_inf} of {n} training examples" + (
        f" ({k_inf} infinite)" if k_inf else ""
    )
    problems = []
    if draws < MIN_LOO_DRAWS:
        problems.append(f"only {draws} global draws (the Pareto tail fit wants {MIN_LOO_DRAWS})")
    if k_bad + k_inf > UNRELIABLE_FRACTION * n:
        problems.append(flagged)
    if problems:
        note = f"{UNRELIABLE}: " + "; ".join(problems)
    else:
        note = flagged if k_bad + k_inf else ""
    return Loo(
        elpd=float(result.elpd_loo),
        se=float(result.se),
        p_loo=float(result.p_loo),
        n=n,
        draws=draws,
        k_threshold=threshold,
        k_good=n - k_bad - k_inf,
        k_bad=k_bad,
        k_inf=k_inf,
        note=note,
        reliable=not problems,
    )


def arviz():
    """ArviZ, imported on first use without its FutureWarning (ArviZ 0.23 announces its 1.0
    refactor on import); the one place probtrans imports it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, module="arviz")
        import arviz

    return arviz
