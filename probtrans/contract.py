"""The contract between models and inference: which sites are self-guided, which are KL terms,
when stochastic attention may take its fused path, and which output sites training skips.

Models emit sites through :func:`sample_attention` and :func:`kl_term`; the objective
(:mod:`probtrans.inference.objective`) recognises them with :func:`is_self_guided` and
:func:`is_kl_term`, and lets attention skip its sites under :func:`fused_attention`.

- *Self-guided* sites are attention weights (and SGPA outputs) whose guide is their own
  conditional distribution: the paper's objective E_â[log p(y | x, â, W)] is the ELBO with that
  guide (Pei et al. 2022, §3), so the ELBO hides them and never computes their density.
- *KL terms* are per-example factors −KL (SGPA's amortised KL) that the KL weight and its
  annealing scale like the KL of the global sites.
- *Fused attention*: where the attention sites are hidden anyway, STO and H-STO return â v from
  one fused kernel without recording their sites (:mod:`probtrans.attention.gumbel`). Pyro
  broadcasts a site over the active vectorised plates, not the noise drawn without one, so the
  fused path draws its noise with :func:`plate_batch_shape`: one draw per sample of a
  vectorised plate (``Predictive(..., parallel=True)``, vectorised ELBO particles).
- *Output sites are for the predictive*: a classifier records its outputs (``features``,
  ``probs``, ``energy``) as deterministic sites for ``Predictive`` and the run's predictive;
  the training objective reads none of them (their log-density is 0), so it computes them
  under :func:`outputs_unrecorded`, where the classifier skips the sites and the work of
  ``probs`` and ``energy``.
- *Attention sites are no guide's business*: an autoguide built on a model whose attention sites
  are visible would become a per-example guide over attention matrices; :func:`sample_attention`
  refuses that and names :func:`probtrans.self_guided`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar

import pyro
import pyro.distributions as dist
import torch
from pyro.poutine.block_messenger import BlockMessenger
from pyro.poutine.runtime import get_plates
from torch import Tensor

from probtrans.errors import ProbtransError
from probtrans.internals.pyro import handler_stack, is_prototype_block

#: ``infer`` flag of sites whose guide is their own conditional distribution
SELF_GUIDED = "probtrans_self_guided"
#: ``infer`` flag of factor sites holding a per-example KL term
KL_TERM = "probtrans_kl_term"

_FUSED: ContextVar[bool] = ContextVar("probtrans_fused_attention", default=False)
_OUTPUTS: ContextVar[bool] = ContextVar("probtrans_output_sites", default=True)


def _reaches_autoguide(name: str, distribution: dist.Distribution) -> bool:
    """Whether an autoguide is tracing the model to find its latent sites and the site ``name``
    would reach it, no block in between hiding it (as :func:`probtrans.self_guided` does)."""
    msg = {"type": "sample", "name": name, "fn": distribution, "is_observed": False}
    msg["infer"] = {SELF_GUIDED: True}
    for messenger in reversed(handler_stack()):  # innermost first
        if is_prototype_block(messenger):
            return True
        if isinstance(messenger, BlockMessenger) and messenger.hide_fn(msg):
            return False
    return False


def sample_attention(name: str, distribution: dist.Distribution) -> Tensor:
    """Draw attention weights (or another self-guided quantity) as the sample site ``name``.

    Raises if an autoguide is being built on a model that shows this site (see the module
    docstring)."""
    if _reaches_autoguide(name, distribution):
        raise ProbtransError(
            f"an autoguide is being built on a model with the attention site {name!r} visible; "
            f"build it on probtrans.self_guided(model), which integrates attention by its own "
            f"distribution (the training objective of stochastic attention and SGPA)"
        )
    return pyro.sample(name, distribution, infer={SELF_GUIDED: True})


def kl_term(name: str, kl: Tensor) -> None:
    """Subtract ``kl`` (batch shape: the data plate's) from the ELBO as the factor site ``name``."""
    unit = dist.Unit(-kl, has_rsample=True)
    pyro.sample(name, unit, obs=unit.sample(), infer={"is_auxiliary": True, KL_TERM: True})


def is_self_guided(msg: dict) -> bool:
    return msg["type"] == "sample" and bool(msg["infer"].get(SELF_GUIDED, False))


def is_kl_term(msg: dict) -> bool:
    return msg["type"] == "sample" and bool(msg["infer"].get(KL_TERM, False))


@contextmanager
def _switched(switch: ContextVar[bool], value: bool) -> Iterator[None]:
    """``switch`` set to ``value`` for the block."""
    token = switch.set(value)
    try:
        yield
    finally:
        switch.reset(token)


def fused_attention() -> AbstractContextManager[None]:
    """Let stochastic attention return â v from a fused kernel without recording its sites.
    Only valid where those sites are hidden anyway (the self-guided objective, and the
    predictive without attention sites)."""
    return _switched(_FUSED, True)


def fused_attention_enabled() -> bool:
    return _FUSED.get()


def outputs_unrecorded() -> AbstractContextManager[None]:
    """Let a classifier skip its deterministic output sites (``features``, ``probs``,
    ``energy``), which only the predictive reads. Only valid where nothing reads them (the
    training objective: their log-density is 0, so the ELBO and its gradients are the same)."""
    return _switched(_OUTPUTS, False)


def outputs_recorded() -> bool:
    return _OUTPUTS.get()


def plate_batch_shape(batch_shape: torch.Size) -> torch.Size:
    """``batch_shape`` broadcast with the active vectorised plates, each of its size at its
    dimension: the batch shape Pyro gives a site of that batch shape drawn here, for draws made
    without a sample site (the fused attention path). E.g. (B,) inside a plate of size S at
    dim −2 and a data plate of size B at dim −1 → (S, B); (B,) outside any plate → (B,)."""
    frames = [frame for frame in get_plates() if frame.vectorized]
    width = max([-frame.dim for frame in frames], default=0)
    plates = [1] * width
    for frame in frames:
        plates[frame.dim] = frame.size
    return torch.broadcast_shapes(batch_shape, torch.Size(plates))
