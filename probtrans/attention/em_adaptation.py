"""Inference-time adaptation of Gaussian-mixture attention (Movellan & Gabbur 2020, Eq. 22–38).

A trained layer of mixture units (:class:`~probtrans.attention.gaussian_mixture.MixtureUnits`)
can adapt its parameters to the batch it is given, without retraining, before it infers values:

- :func:`adapt_keys`: MAP keys under a Gaussian prior N(ξ⁰, θ_ξ⁻¹ I) centred on the trained keys
  ξ⁰, by EM on the batch's queries (Eq. 26–29);
- :func:`adapt_precision`: MAP query precisions α_k under a Gamma(θ_α1, θ_α2) prior (Eq. 30);
- :func:`propagate_corrections`: given the correct values of some units, MAP expected values μ
  (Gaussian prior at the trained μ⁰, Eq. 35–36), value precisions β (Gamma prior, Eq. 37) and
  priors π (Dirichlet prior, Eq. 38), after which every unit's value is inferred again.

Each is one call on a model and a batch and returns the model's output; the ``em_*`` functions
do the same on one layer's :class:`~probtrans.attention.gaussian_mixture.Mixture`. All updates
are closed-form EM steps of plain tensor operations, so they are differentiable.

Conventions the paper leaves open:

- The priors π are evaluated once at the trained parameters and then held fixed while keys or
  precisions adapt (Eq. 26–28 treat π as a constant), so every update is an exact EM step.
- Queries and units are the same tokens (self-attention): the units' padding mask also masks
  the queries, which then pull no key and count in no statistic.
- ``theta_alpha2 = None`` (and ``theta_beta2 = None``) centres the Gamma prior's mode
  (θ₁ − 1)/θ₂ on the trained precision; otherwise units that no query selects drift to the
  prior's mode. ``theta_pi = c`` is the Dirichlet prior θ_ik = 1 + c π⁰_ik, whose mode is the
  trained π⁰, so Eq. 38 reads π_ik = (w_ik + c π⁰_ik) / (1 + c).
- Eq. 38 updates the priors of the corrected units' own rows: the uncorrected rows have no new
  data (re-estimating them from their own query would count it twice). Corrections reach the
  other units through the units' shared μ and β.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import torch
from torch import Tensor, nn

from probtrans.attention.gaussian_mixture import (
    Mixture,
    MixtureUnits,
    log_joint,
    mask_units,
    responsibilities,
    square_distance,
)


# ---------------------------------------------------------------------------- one layer
def _query_weights(q: Tensor, mix: Mixture, query_mask: Tensor | None) -> Tensor:
    """E-step p(u_k | q_i) (Eq. 27), zero for padding queries: (B, H, L, n)."""
    w = responsibilities(q, mix)
    return w if query_mask is None else w * query_mask[:, None, :, None]


def em_keys(
    q: Tensor,
    mix: Mixture,
    n_iter: int = 1,
    theta_xi: float = 1.0,
    anchor: Literal["trained", "previous"] = "trained",
    query_mask: Tensor | None = None,
) -> Mixture:
    """MAP keys given the queries q (B, H, L, d) by ``n_iter`` EM steps (Eq. 27–29):

        ξ_k ← (θ_ξ ξ_k^a + α_k Σ_i w_ik q_i) / (θ_ξ + α_k Σ_i w_ik),

    with w recomputed from the current keys at every step. ``anchor = "trained"`` is the
    paper's prior, ξ^a = ξ⁰ (the trained keys): EM increases :func:`key_objective`.
    ``anchor = "previous"`` uses the previous iterate, ξ^a = ξ^t: a proximal EM step that
    increases the likelihood without a prior and lets keys move further with each step.
    """
    if not theta_xi > 0:
        raise ValueError(f"theta_xi = {theta_xi}: must be > 0")
    keys = mix.keys
    for _ in range(n_iter):
        w = _query_weights(q, mix.replace(keys=keys), query_mask)
        total = w.sum(-2).unsqueeze(-1)  # Σ_i w_ik (B, H, n, 1)
        pulled = w.transpose(-1, -2) @ q  # Σ_i w_ik q_i (B, H, n, d)
        alpha = mix.alpha.unsqueeze(-1)
        centre = mix.keys if anchor == "trained" else keys
        keys = (theta_xi * centre + alpha * pulled) / (theta_xi + alpha * total)
    return mix.replace(keys=keys)


def em_precision(
    q: Tensor,
    mix: Mixture,
    n_iter: int = 1,
    theta_alpha1: float = 2.0,
    theta_alpha2: float | None = None,
    query_mask: Tensor | None = None,
) -> Mixture:
    """MAP per-unit query precisions under a Gamma(θ_α1, θ_α2) prior (shape, rate) (Eq. 30):

        α_k ← (θ_α1 + d/2 Σ_i w_ik − 1) / (θ_α2 + ½ Σ_i w_ik ‖q_i − ξ_k‖²),

    ``n_iter`` EM steps; ``theta_alpha2 = None`` puts the prior's mode on the trained α.
    Returns a mixture with per-unit α (B, H, n).
    """
    if not theta_alpha1 > 1:
        raise ValueError(f"theta_alpha1 = {theta_alpha1}: must be > 1 (positive precisions)")
    rate = (theta_alpha1 - 1) / mix.alpha if theta_alpha2 is None else theta_alpha2
    d = q.shape[-1]
    alpha = mix.alpha
    for _ in range(n_iter):
        w = _query_weights(q, mix.replace(alpha=alpha), query_mask)
        spread = (w * square_distance(q, mix.keys)).sum(-2)  # Σ_i w_ik ‖q_i − ξ_k‖² (B, H, n)
        alpha = (theta_alpha1 + 0.5 * d * w.sum(-2) - 1) / (rate + 0.5 * spread)
    return mix.replace(alpha=alpha)


def em_corrections(
    q: Tensor,
    mix: Mixture,
    index: Tensor,
    values: Tensor,
    n_iter: int = 1,
    theta_mu: float = 1.0,
    theta_beta1: float | None = None,
    theta_beta2: float | None = None,
    theta_pi: float | None = None,
) -> Mixture:
    """MAP units given the correct values of some of them (Eq. 31–38), by ``n_iter`` EM steps.

    q: (B, H, n, d) queries of all units; index: (B, s) distinct corrected units; values:
    (B, s, m) or (B, H, s, m) their correct values. Each step: responsibilities of the corrected
    units given query and correct value (Eq. 36), then in turn

        μ_k ← (θ_μ μ_k⁰ + β_k Σ_c w_ck v_c) / (θ_μ + β_k Σ_c w_ck)                     (Eq. 35)
        β_k ← (θ_β1 + m/2 Σ_c w_ck − 1) / (θ_β2 + ½ Σ_c w_ck ‖v_c − μ_k‖²)            (Eq. 37)
        π_ck ← (w_ck + θ_π π⁰_ck) / (1 + θ_π), for the corrected rows c                (Eq. 38)

    with m the value dimension (the paper's d/2: its values and queries share the dimension d).
    β is updated only if ``theta_beta1`` is given and π only if ``theta_pi`` is. A layer in the
    β → 0 limit (``mix.beta is None``) has no value likelihood, so μ moves only once Eq. 37 has
    given it a β. Returns the updated mixture; :func:`corrections_objective` never decreases.
    """
    if not theta_mu > 0:
        raise ValueError(f"theta_mu = {theta_mu}: must be > 0")
    if theta_beta1 is not None and not theta_beta1 > 1:
        raise ValueError(f"theta_beta1 = {theta_beta1}: must be > 1 (positive precisions)")
    if theta_beta1 is not None and theta_beta2 is None and mix.beta is None:
        raise ValueError("theta_beta2 is needed: the layer has no trained β to centre the prior on")
    if theta_pi is not None and not theta_pi >= 0:
        raise ValueError(f"theta_pi = {theta_pi}: must be >= 0")
    values = values if values.dim() == 4 else values.unsqueeze(1)  # (B, H|1, s, m)
    batch, heads, n, d = q.shape
    rows = index[:, None, :, None]  # (B, 1, s, 1)
    q_c = q.gather(2, rows.expand(batch, heads, -1, d))  # (B, H, s, d)
    log_prior = mix.log_prior.expand(batch, heads, n, n)
    prior0_c = log_prior.gather(2, rows.expand(batch, heads, -1, n)).exp()  # π⁰ rows (B, H, s, n)
    rate = None
    if theta_beta1 is not None:
        rate = (theta_beta1 - 1) / mix.beta if theta_beta2 is None else theta_beta2
    current = mix
    for _ in range(n_iter):
        prior_c = log_prior.gather(2, rows.expand(batch, heads, -1, n))  # (B, H, s, n)
        w = responsibilities(q_c, current.replace(log_prior=prior_c), values)  # Eq. 36
        total = w.sum(-2)  # Σ_c w_ck (B, H, n)
        mu, beta = current.values, current.beta
        if beta is not None:
            gain = beta.expand(batch, heads, n).unsqueeze(-1)
            pulled = w.transpose(-1, -2) @ values  # Σ_c w_ck v_c (B, H, n, m)
            mu = (theta_mu * mix.values + gain * pulled) / (theta_mu + gain * total.unsqueeze(-1))
        if rate is not None:
            spread = (w * square_distance(values, mu)).sum(-2)
            beta = (theta_beta1 + 0.5 * values.shape[-1] * total - 1) / (rate + 0.5 * spread)
        if theta_pi is not None:
            new_rows = (w + theta_pi * prior0_c) / (1 + theta_pi)
            new_rows = mask_units(new_rows.clamp_min(torch.finfo(w.dtype).tiny).log(), mix.mask)
            log_prior = log_prior.scatter(2, rows.expand(batch, heads, -1, n), new_rows)
        current = current.replace(values=mu, beta=beta, log_prior=log_prior)
    return current


# ---------------------------------------------------------------- objectives (for checks)
def _masked_sum(per_query: Tensor, query_mask: Tensor | None) -> Tensor:
    """Sum (B, H, L) over queries, skipping padding ones → (B, H)."""
    if query_mask is not None:
        per_query = per_query.masked_fill(~query_mask[:, None, :], 0.0)
    return per_query.sum(-1)


def _unit_sum(per_unit: Tensor, mix: Mixture) -> Tensor:
    """Sum (B, H, n) over real units → (B, H)."""
    if mix.mask is not None:
        per_unit = per_unit.masked_fill(~mix.mask[:, None, :], 0.0)
    return per_unit.sum(-1)


def key_objective(
    q: Tensor,
    mix: Mixture,
    trained_keys: Tensor,
    theta_xi: float,
    query_mask: Tensor | None = None,
) -> Tensor:
    """log p(ξ) + Σ_i log p_i(q_i | ξ), what :func:`em_keys` maximises (Eq. 24, 26): (B, H)."""
    prior = -0.5 * theta_xi * (mix.keys - trained_keys).pow(2).sum(-1)
    return _masked_sum(log_joint(q, mix).logsumexp(-1), query_mask) + _unit_sum(prior, mix)


def corrections_objective(
    q: Tensor,
    mix: Mixture,
    index: Tensor,
    values: Tensor,
    prior: Mixture,
    theta_mu: float,
    theta_beta: tuple[float, float | Tensor] | None = None,
    theta_pi: float | None = None,
) -> Tensor:
    """log p(λ | q_1:n, v_1:s) + const (Eq. 33), maximised by :func:`em_corrections`: (B, H).

    ``prior`` is the trained mixture (μ⁰, π⁰); ``theta_beta`` the Gamma (shape, rate) of β.
    """
    values = values if values.dim() == 4 else values.unsqueeze(1)
    batch, heads, n, d = q.shape
    rows = index[:, None, :, None]
    log_prior = mix.log_prior.expand(batch, heads, n, n)
    prior_c = log_prior.gather(2, rows.expand(batch, heads, -1, n))
    q_c = q.gather(2, rows.expand(batch, heads, -1, d))
    corrected = log_joint(q_c, mix.replace(log_prior=prior_c), values).logsumexp(-1).sum(-1)
    others = log_joint(q, mix.replace(log_prior=log_prior)).logsumexp(-1)  # (B, H, n)
    uncorrected = torch.ones(batch, n, dtype=torch.bool, device=q.device).scatter(1, index, False)
    if mix.mask is not None:
        uncorrected = uncorrected & mix.mask
    total = corrected + _masked_sum(others, uncorrected)
    total = total - _unit_sum(0.5 * theta_mu * (mix.values - prior.values).pow(2).sum(-1), mix)
    if theta_beta is not None:
        beta = mix.beta.expand(batch, heads, n)
        total = total + _unit_sum((theta_beta[0] - 1) * beta.log() - theta_beta[1] * beta, mix)
    if theta_pi is not None:  # Dirichlet(1 + θ_π π⁰) on the corrected rows
        prior0_c = (
            prior.log_prior.expand(batch, heads, n, n)
            .gather(2, rows.expand(batch, heads, -1, n))
            .exp()
        )
        total = total + torch.xlogy(theta_pi * prior0_c, prior_c.exp()).sum((-1, -2))
    return total


# ------------------------------------------------------------------ models and batches
def mixture_layers(model: nn.Module) -> list[MixtureUnits]:
    """The Gaussian-mixture layers of ``model``, in module order."""
    return [module for module in model.modules() if isinstance(module, MixtureUnits)]


@contextmanager
def adapting(
    model: nn.Module,
    update: Callable[[Tensor, Mixture], Mixture],
    layers: list[MixtureUnits] | None = None,
) -> Iterator[None]:
    """Within the block, the mixture layers of ``model`` (or ``layers``) apply
    ``update(q, mixture) → mixture`` to their units before inferring values."""
    layers = mixture_layers(model) if layers is None else layers
    if not layers:
        raise ValueError(f"{type(model).__name__} has no Gaussian-mixture attention layer")
    previous = [layer.adaptation for layer in layers]
    for layer in layers:
        layer.adaptation = update
    try:
        yield
    finally:
        for layer, adaptation in zip(layers, previous, strict=True):
            layer.adaptation = adaptation


def adapt_keys(
    model: nn.Module,
    *inputs: Any,
    n_iter: int = 1,
    theta_xi: float = 1.0,
    anchor: Literal["trained", "previous"] = "trained",
    **kwargs: Any,
) -> Any:
    """``model(*inputs, **kwargs)`` with the keys of every mixture layer adapted to the batch's
    queries (:func:`em_keys`, Eq. 29). Large θ_ξ trusts the trained keys; small θ_ξ follows the
    batch."""

    def update(q: Tensor, mix: Mixture) -> Mixture:
        return em_keys(q, mix, n_iter, theta_xi, anchor, query_mask=mix.mask)

    with adapting(model, update):
        return model(*inputs, **kwargs)


def adapt_precision(
    model: nn.Module,
    *inputs: Any,
    n_iter: int = 1,
    theta_alpha1: float = 2.0,
    theta_alpha2: float | None = None,
    **kwargs: Any,
) -> Any:
    """``model(*inputs, **kwargs)`` with per-unit query precisions of every mixture layer
    adapted to the batch (:func:`em_precision`, Eq. 30)."""

    def update(q: Tensor, mix: Mixture) -> Mixture:
        return em_precision(q, mix, n_iter, theta_alpha1, theta_alpha2, query_mask=mix.mask)

    with adapting(model, update):
        return model(*inputs, **kwargs)


def propagate_corrections(
    model: nn.Module,
    *inputs: Any,
    index: Tensor,
    values: Tensor,
    n_iter: int = 1,
    theta_mu: float = 1.0,
    theta_beta1: float | None = None,
    theta_beta2: float | None = None,
    theta_pi: float | None = None,
    layer: MixtureUnits | None = None,
    **kwargs: Any,
) -> Any:
    """``model(*inputs, **kwargs)`` after the correct ``values`` (B, s, m) of the units ``index``
    (B, s) have updated μ, β, π of one mixture layer (:func:`em_corrections`, Eq. 35–38).

    The layer is ``layer``, by default the model's last mixture layer (for
    :class:`probtrans.segmentation.SegmentationModel`, the labelling units). Every unit's value is
    then inferred again from the updated mixture, corrected units included (not clamped).
    """
    layers = [layer] if layer is not None else mixture_layers(model)[-1:]

    def update(q: Tensor, mix: Mixture) -> Mixture:
        return em_corrections(
            q, mix, index, values, n_iter, theta_mu, theta_beta1, theta_beta2, theta_pi
        )

    with adapting(model, update, layers):
        return model(*inputs, **kwargs)
