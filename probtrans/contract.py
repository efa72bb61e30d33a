"""The contract between models and inference: which sites are self-guided, which are KL terms,
when stochastic attention may take its fused path, and where parameters live.

Models emit sites through :func:`sample_attention` and :func:`kl_term`; the objective
(:mod:`probtrans.inference.objective`) recognises them with :func:`is_self_guided` and
:func:`is_kl_term`, and lets attention skip its sites under :func:`fused_attention`.

- *Self-guided* sites are attention weights (and SGPA outputs) whose guide is their own
  conditional distribution: the paper's objective E_â[log p(y | x, â, W)] is the ELBO with that
  guide (Pei et al. 2022, §3), so the ELBO hides them and never computes their density.
- *KL terms* are per-example factors −KL (SGPA's amortised KL) that the KL weight and its
  annealing scale like the KL of the global sites.
- *Fused attention*: where the attention sites are hidden anyway, STO and H-STO return â v from
  one fused kernel without recording their sites (:mod:`probtrans.attention.gumbel`).
- *Parameters live in their modules*: probtrans trains ``model.parameters()`` and
  ``guide.parameters()`` with a PyTorch optimiser, so every PyroModule keeps its parameters
  locally (``pyro.settings`` ``module_local_params``); importing this module sets that.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import pyro
import pyro.distributions as dist
from torch import Tensor

#: ``infer`` flag of sites whose guide is their own conditional distribution
SELF_GUIDED = "probtrans_self_guided"
#: ``infer`` flag of factor sites holding a per-example KL term
KL_TERM = "probtrans_kl_term"

pyro.settings.set(module_local_params=True)

_FUSED: ContextVar[bool] = ContextVar("probtrans_fused_attention", default=False)


def sample_attention(name: str, distribution: dist.Distribution) -> Tensor:
    """Draw attention weights (or another self-guided quantity) as the sample site ``name``."""
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
def fused_attention() -> Iterator[None]:
    """Let stochastic attention return â v from a fused kernel without recording its sites.
    Only valid where those sites are hidden anyway (the self-guided objective, and the
    predictive without attention sites)."""
    token = _FUSED.set(True)
    try:
        yield
    finally:
        _FUSED.reset(token)


def fused_attention_enabled() -> bool:
    return _FUSED.get()
