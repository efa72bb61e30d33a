"""The training objective: ELBO over global weights with self-guided attention sites.

Stochastic attention (STO / H-STO) is trained on E_â[log p(y | x, â, W)] (Pei et al. 2022), which
is the ELBO whose guide for the attention weights â is their own conditional p(â | x, W): the
terms log p(â | x, W) − log q(â | x, W) cancel exactly. :func:`self_guided` realises that guide
without running the network twice: the attention sites are hidden from the ELBO's traces, so
Pyro draws them (reparameterised) from the model's own distribution inside the single model
pass and never computes their log-density (STO / H-STO even skip forming the weights: see
:mod:`probtrans.attention.gumbel`). Guides are built on the same hidden model, so they
only ever see global sites. Which sites are self-guided is the model's side of
:mod:`probtrans.contract`.

:class:`KLWeight` multiplies the log-densities of all remaining latent sites (model prior and
guide alike) by β·a_t, giving E_q[log p(y | ·)] − β·a_t KL(q(W) ‖ p(W)), and the per-example
KL terms added with :func:`probtrans.contract.kl_term` (e.g. SGPA's amortised KL) by a_t;
the annealing factor a_t can change between steps (linear warm-up from 0 to 1).

With ``elbo.kl_scale = "authors"`` (:meth:`KLWeight.from_spec`) the global inducing sites of SGPA
(:func:`probtrans.attention.base.inducing_sites`, e.g. ``encoder.layers.0.attn.u_g``) get β·N
instead, N the training-set size, and nothing else changes. With β = 1 the loss divided by N is
then the loss of Chen & Li (ICLR 2023): mean NLL over the batch + KL(q(u_g) ‖ p(u_g)) + the
batch mean of the amortised KL, plus KL(q(W) ‖ p(W)) / N for weight priors (e.g. the Normal
prior on the classification head), which the authors' model does not have and which keep the
ELBO's weight.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pyro import poutine
from pyro.infer import ELBO, Trace_ELBO, TraceMeanField_ELBO
from pyro.poutine.messenger import Messenger
from torch import nn

from probtrans.attention import inducing_sites
from probtrans.contract import fused_attention, is_kl_term, is_self_guided
from probtrans.specs import ElboSpec


def self_guided(model: Callable) -> Callable:
    """``model`` with its attention sites integrated by their own conditional distribution.

    The sites are hidden, so stochastic attention may take its fused path
    (:func:`probtrans.contract.fused_attention`).
    """
    blocked = poutine.block(model, hide_fn=is_self_guided)

    def self_guided_model(*args: Any, **kwargs: Any) -> Any:
        with fused_attention():
            return blocked(*args, **kwargs)

    return self_guided_model


class KLWeight(Messenger):
    """Scale latent sample sites by ``weight · annealing`` (by ``site_weights[name] · annealing``
    for the sites named there) and ``kl_term`` sites by ``annealing``; the likelihood is left
    alone."""

    def __init__(
        self, weight: float = 1.0, site_weights: Mapping[str, float] | None = None
    ) -> None:
        super().__init__()
        self.weight = weight
        self.site_weights = dict(site_weights or {})
        self.annealing = 1.0

    @classmethod
    def from_spec(cls, spec: ElboSpec, model: nn.Module, n_train: int) -> KLWeight:
        """β = ``spec.kl_weight`` on every latent site of ``model``; with ``kl_scale = "authors"``
        β·n_train on its inducing sites (see the module docstring)."""
        if spec.kl_scale == "dataset":
            return cls(spec.kl_weight)
        scaled = spec.kl_weight * n_train
        return cls(spec.kl_weight, {name: scaled for name in inducing_sites(model)})

    def _process_message(self, msg: dict) -> None:
        if msg["type"] != "sample":
            return
        if not msg["is_observed"]:
            weight = self.site_weights.get(msg["name"], self.weight)
            msg["scale"] = msg["scale"] * weight * self.annealing
        elif is_kl_term(msg):
            msg["scale"] = msg["scale"] * self.annealing


def make_elbo(spec: ElboSpec) -> ELBO:
    """``trace`` → Trace_ELBO (sampled KL), ``meanfield`` → TraceMeanField_ELBO (analytic KL)."""
    cls = TraceMeanField_ELBO if spec.name == "meanfield" else Trace_ELBO
    return cls(num_particles=spec.particles)
