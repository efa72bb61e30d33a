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

:func:`loss_and_terms` computes the loss as ``elbo.differentiable_loss`` does (the same value
and gradients; without reading the loss back from the device, as a GPU step should not wait: see
:func:`probtrans.internals.pyro.particle_loss`) and, from the same traces, the terms of the ELBO at
full weight (β = a_t = 1 whatever ``elbo.kl_weight``, ``kl_scale`` and the annealing):
ELBO = E_q[log p(y | x, W)] − KL, KL = KL_global + KL_amortised, where
KL_global = E_q[log q(W) − log p(W)] over the global sites (analytic KL(q ‖ p) per site with
``elbo.name = "meanfield"``, where Pyro has one: not for AutoNormal, whose weight sites are
Delta draws of auxiliary Normal sites) and KL_amortised is the sum of the ``kl_term`` sites.
For a delta (MAP) guide log q = 0, so "KL" is −log p(W).

With ``elbo.kl_scale = "authors"`` (:meth:`KLWeight.from_spec`) the global inducing sites of SGPA
(:func:`probtrans.attention.multihead.inducing_sites`, e.g. ``encoder.layers.0.attn.u_g``) get β·N
instead, N the training-set size, and nothing else changes. With β = 1 the loss divided by N is
then the loss of Chen & Li (ICLR 2023): mean NLL over the batch + KL(q(u_g) ‖ p(u_g)) + the
batch mean of the amortised KL, plus KL(q(W) ‖ p(W)) / N for weight priors (e.g. the Normal
prior on the classification head), which the authors' model does not have and which keep the
ELBO's weight.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from pyro import poutine
from pyro.distributions.util import scale_and_mask
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from pyro.poutine.messenger import Messenger
from pyro.poutine.trace_struct import Trace
from torch import Tensor, nn
from torch.distributions import kl_divergence

from probtrans.attention import inducing_sites
from probtrans.contract import fused_attention, is_kl_term, is_self_guided
from probtrans.internals.pyro import particle_loss, particle_traces
from probtrans.specs import ElboSpec

#: the ELBO's terms (summed over the data, like the loss) that :func:`loss_and_terms` returns,
#: in this order
TERMS = ("expected_log_likelihood", "kl_global", "kl_amortised")
#: the keys of :func:`elbo_record` (per example), in ``history.json`` and ``metrics.json``
ELBO_KEYS = ("elbo", "expected_log_likelihood", "kl", "kl_global", "kl_amortised")
#: ``infer`` key where :class:`KLWeight` keeps the scale a site had before its weight
UNWEIGHTED_SCALE = "probtrans_unweighted_scale"


class SelfGuided(nn.Module):
    """``model`` with its attention sites integrated by their own conditional distribution: what
    :func:`self_guided` returns. A module that holds the model (an ``nn.Module``, or the module a
    bound method belongs to) as its submodule ``model``, so ``.parameters()``, ``state_dict``,
    ``.to(device)``, ``torch.compile`` and Pyro's module-local training loop
    (``Trace_ELBO()(self_guided(model), guide).parameters()``) see the whole network. A plain
    nn.Module, not a ``PyroModule``: the model's sites keep their names (no ``model.`` prefix)."""

    def __init__(self, model: Callable) -> None:
        super().__init__()
        owner = model if isinstance(model, nn.Module) else getattr(model, "__self__", None)
        if isinstance(owner, nn.Module):
            self.model = owner
        self.__dict__["wrapped"] = model  # called, but not registered a second time

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The model's return value, its self-guided sites hidden from every handler outside
        (so stochastic attention may take its fused path)."""
        with fused_attention(), poutine.block(hide_fn=is_self_guided):
            return self.wrapped(*args, **kwargs)


def self_guided(model: Callable) -> SelfGuided:
    """``model`` with its attention sites integrated by their own conditional distribution, as a
    module that holds ``model`` (:class:`SelfGuided`): build guides on it and train it (SVI, or
    Pyro's module-local loop ``Trace_ELBO()(self_guided(model), guide)``, whose ``.parameters()``
    hold the network's and the guide's parameters).

    The sites are hidden, so stochastic attention may take its fused path
    (:func:`probtrans.contract.fused_attention`); every other site keeps its name.
    """
    return SelfGuided(model)


class KLWeight(Messenger):
    """Scale latent sample sites by ``weight · annealing`` (by ``site_weights[name] · annealing``
    for the sites named there) and ``kl_term`` sites by ``annealing``; the likelihood is left
    alone. The scale a site had before is kept in its ``infer[UNWEIGHTED_SCALE]``."""

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
            msg["infer"][UNWEIGHTED_SCALE] = msg["scale"]
            msg["scale"] = msg["scale"] * weight * self.annealing
        elif is_kl_term(msg):
            msg["infer"][UNWEIGHTED_SCALE] = msg["scale"]
            msg["scale"] = msg["scale"] * self.annealing


def make_elbo(spec: ElboSpec) -> Trace_ELBO:
    """``trace`` → Trace_ELBO (sampled KL), ``meanfield`` → TraceMeanField_ELBO (analytic KL)."""
    cls = TraceMeanField_ELBO if spec.name == "meanfield" else Trace_ELBO
    return cls(num_particles=spec.particles)


def loss_and_terms(
    elbo: Trace_ELBO, model: Callable, guide: Callable, *args: Any, **kwargs: Any
) -> tuple[Tensor, Tensor]:
    """``elbo.differentiable_loss(model, guide, *args, **kwargs)`` (the same value and gradients,
    computed without reading the device), and the ELBO's :data:`TERMS` of the same traces at
    full weight, averaged over the particles (vectorised ones too): a float64 tensor on the CPU
    without gradient, each term scaled by the data plate like the loss."""
    analytic = isinstance(elbo, TraceMeanField_ELBO)
    loss, surrogate_loss, terms = 0.0, 0.0, 0.0
    for model_trace, guide_trace in particle_traces(elbo, model, guide, args, kwargs):
        loss_particle, surrogate_loss_particle = particle_loss(elbo, model_trace, guide_trace)
        surrogate_loss += surrogate_loss_particle / elbo.num_particles
        loss += loss_particle / elbo.num_particles
        with torch.no_grad():
            terms = terms + particle_terms(model_trace, guide_trace, analytic) / elbo.num_particles
    # the loss's value with the surrogate's gradients, read nowhere (Pyro reads the surrogate
    # back and warns of NaN: two waits for a GPU; the training loop checks the loss once)
    loss = (loss + (surrogate_loss - surrogate_loss.detach())).to(surrogate_loss.dtype)
    return loss, terms.cpu()  # one read of the device, for the history


def particle_terms(model_trace: Trace, guide_trace: Trace, analytic: bool) -> Tensor:
    """The :data:`TERMS` of one particle: Σ log p of the observed sites; Σ log q of the guide's
    sites − Σ log p of the model's latent ones (``analytic``: KL(q ‖ p) of a site where Pyro
    knows it, as ``TraceMeanField_ELBO``); −Σ of the ``kl_term`` sites."""
    likelihood: Tensor | float = 0.0
    kl_global: Tensor | float = 0.0
    kl_amortised: Tensor | float = 0.0
    analytic_sites = set()
    for name, site in model_trace.nodes.items():
        if site["type"] != "sample":
            continue
        if is_kl_term(site):
            kl_amortised = kl_amortised - full_weight(site)
        elif site["is_observed"]:
            likelihood = likelihood + full_weight(site)
        elif analytic and (kl := analytic_kl(site, guide_trace.nodes.get(name))) is not None:
            kl_global = kl_global + kl
            analytic_sites.add(name)
        else:
            kl_global = kl_global - full_weight(site)
    for name, site in guide_trace.nodes.items():
        if site["type"] == "sample" and name not in analytic_sites:
            kl_global = kl_global + full_weight(site)
    values = (likelihood, kl_global, kl_amortised)
    device = next((v.device for v in values if torch.is_tensor(v)), None)
    return torch.stack([torch.as_tensor(v, dtype=torch.float64, device=device) for v in values])


def unweighted_scale(site: dict) -> Any:
    """A traced site's scale without :class:`KLWeight`'s weight (its plate's N/B)."""
    return site["infer"].get(UNWEIGHTED_SCALE, site["scale"])


def full_weight(site: dict) -> Tensor:
    """Σ log-density of a traced site (log-probabilities computed) at its unweighted scale."""
    log_prob = site["unscaled_log_prob"].detach().double()
    return scale_and_mask(log_prob, unweighted_scale(site), site["mask"]).sum()


def analytic_kl(model_site: dict, guide_site: dict | None) -> Tensor | float | None:
    """KL(q ‖ p) of a global site at its unweighted scale, or None where Pyro does not know it
    (or the guide lacks the site)."""
    if guide_site is None:
        return None
    try:
        kl = kl_divergence(guide_site["fn"], model_site["fn"])
    except NotImplementedError:
        return None
    kl = scale_and_mask(kl, unweighted_scale(guide_site), guide_site["mask"])
    if not torch.is_tensor(kl):  # a number: the same KL for every batch element
        return kl * guide_site["fn"].batch_shape.numel()
    return kl.detach().double().sum()


def elbo_record(terms: Sequence[float]) -> dict[str, float]:
    """The ELBO and its terms by name from the values of :data:`TERMS` (per example):
    ELBO = E_q[log p(y | ·)] − KL, KL = KL_global + KL_amortised."""
    likelihood, kl_global, kl_amortised = terms
    kl = kl_global + kl_amortised
    return dict(
        zip(ELBO_KEYS, (likelihood - kl, likelihood, kl, kl_global, kl_amortised), strict=True)
    )
