"""Multi-head self-attention skeleton shared by every attention kind.

An attention kind subclasses :class:`MultiHeadAttention` and implements :meth:`attend` on
per-head queries, keys and values. Stochastic kinds draw their attention weights with
:func:`sample_attention`, which makes them Pyro sample sites that the training objective
integrates with their own conditional distribution (see :mod:`probtrans.objective`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import ClassVar

import pyro
import torch
from torch import Tensor, nn

from probtrans.attention.gumbel import (
    RelaxedOneHotCategorical,
    RelaxedOneHotCategoricalStraightThrough,
)

#: ``infer`` flag of attention sites whose guide is their own conditional distribution.
SELF_GUIDED = "probtrans_self_guided"
#: ``infer`` flag of factor sites holding a per-example KL term (annealed like the global KL).
KL_TERM = "probtrans_kl_term"

_FUSED: ContextVar[bool] = ContextVar("probtrans_fused_attention", default=False)


@contextmanager
def fused_attention() -> Iterator[None]:
    """Let stochastic attention kinds return â v from a fused kernel without recording their
    attention sites. Only valid where those sites are hidden anyway: the self-guided objective
    and Predictive without attention sites (:func:`probtrans.objective.self_guided`)."""
    token = _FUSED.set(True)
    try:
        yield
    finally:
        _FUSED.reset(token)


def fused_attention_enabled() -> bool:
    return _FUSED.get()


def sample_attention(name: str, distribution: pyro.distributions.Distribution) -> Tensor:
    """Draw attention weights as the Pyro sample site ``name``, marked self-guided."""
    return pyro.sample(name, distribution, infer={SELF_GUIDED: True})


def kl_term(name: str, kl: Tensor) -> None:
    """Subtract ``kl`` (batch shape: the data plate's) from the ELBO as the factor site ``name``,
    which :class:`probtrans.objective.KLWeight` anneals."""
    unit = pyro.distributions.Unit(-kl, has_rsample=True)
    pyro.sample(name, unit, obs=unit.sample(), infer={"is_auxiliary": True, KL_TERM: True})


def masked_logits(logits: Tensor, key_mask: Tensor | None) -> Tensor:
    """Give padding keys logit −∞ so they get exactly zero attention weight.

    logits: (B, H, L_q, L_k); key_mask: (B, L_k), True for real tokens.
    """
    if key_mask is None:
        return logits
    return logits.masked_fill(~key_mask[:, None, None, :], float("-inf"))


class MultiHeadAttention(nn.Module):
    """Query/key/value/output projections around a per-head :meth:`attend`.

    Args:
        d_model: width of the token representations.
        n_heads: number of heads; must divide ``d_model``.
        site_prefix: name prefix of this layer's Pyro sample sites, e.g. ``"layers.0.attn"``.
        fused_qkv: build the fused query/key/value projection; kinds with their own projections
            (SGPA's shared W_qk) pass False and override :meth:`forward`.
    """

    #: names (without prefix) of the local sample sites :meth:`attend` draws
    sample_sites: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self, d_model: int, n_heads: int, site_prefix: str, fused_qkv: bool = True
    ) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads = {n_heads} must divide d_model = {d_model}")
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.site_prefix = site_prefix
        if fused_qkv:
            self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor, key_mask: Tensor | None = None) -> Tensor:
        """x: (B, L, D); key_mask: (B, L) bool, True for real tokens → (B, L, D)."""
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.n_heads, self.d_head).unbind(2)
        h = self.attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), key_mask)
        return self.out(h.transpose(1, 2).reshape(batch, length, width))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> Tensor:
        """q, k, v: (B, H, L, d_head) → (B, H, L, d_head)."""
        raise NotImplementedError

    def site(self, name: str) -> str:
        return f"{self.site_prefix}.{name}"


def relaxed_one_hot(
    temperature: float, logits: Tensor, hard: bool
) -> pyro.distributions.Distribution:
    """Row-wise (straight-through) relaxed one-hot categorical with event shape (H, L, K).

    logits: (B, H, L, K). Batch shape is (B,), so the site sits in the data plate.
    """
    tau = torch.tensor(temperature, dtype=logits.dtype, device=logits.device)
    cls = RelaxedOneHotCategoricalStraightThrough if hard else RelaxedOneHotCategorical
    return cls(tau, logits=logits).to_event(2)
