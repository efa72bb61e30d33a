"""The training objective: ELBO over global weights with self-guided attention sites.

Stochastic attention (STO / H-STO) is trained on E_â[log p(y | x, â, W)] (Pei et al. 2022), which
is the ELBO whose guide for the attention weights â is their own conditional p(â | x, W): the
terms log p(â | x, W) − log q(â | x, W) cancel exactly. :func:`self_guided` realises that guide
without running the network twice: the attention sites are hidden from the ELBO's traces, so
Pyro draws them (reparameterised) from the model's own distribution inside the single model
pass and never computes their log-density. Guides are built on the same hidden model, so they
only ever see global sites.

:class:`KLWeight` multiplies the log-densities of all remaining latent sites (model prior and
guide alike) by β, giving E_q[log p(y | ·)] − β KL(q(W) ‖ p(W)); β can change between steps
(linear annealing).
"""

from __future__ import annotations

from collections.abc import Callable

from pyro import poutine
from pyro.infer import ELBO, Trace_ELBO, TraceMeanField_ELBO
from pyro.poutine.messenger import Messenger

from probtrans.attention import SELF_GUIDED
from probtrans.config import ElboSpec


def is_self_guided(msg: dict) -> bool:
    return msg["type"] == "sample" and bool(msg["infer"].get(SELF_GUIDED, False))


def self_guided(model: Callable) -> Callable:
    """``model`` with its attention sites integrated by their own conditional distribution."""
    return poutine.block(model, hide_fn=is_self_guided)


class KLWeight(Messenger):
    """Scale the log-density of every latent (unobserved) sample site by ``self.weight``."""

    def __init__(self, weight: float = 1.0) -> None:
        super().__init__()
        self.weight = weight

    def _process_message(self, msg: dict) -> None:
        if msg["type"] == "sample" and not msg["is_observed"]:
            msg["scale"] = msg["scale"] * self.weight


def make_elbo(spec: ElboSpec) -> ELBO:
    """``trace`` → Trace_ELBO (sampled KL), ``meanfield`` → TraceMeanField_ELBO (analytic KL)."""
    cls = TraceMeanField_ELBO if spec.name == "meanfield" else Trace_ELBO
    return cls(num_particles=spec.particles)
