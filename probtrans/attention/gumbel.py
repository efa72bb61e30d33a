"""Relaxed one-hot attention samples and the fused STO / H-STO attention kernel.

A row of RelaxedOneHotCategorical(τ, logits) is â = softmax((logits + g) / τ) with g iid
Gumbel(0, 1), g = −log(−log u), u ~ U(0, 1) (Jang et al. 2017; Maddison et al. 2017; Pei et
al. 2022, Eq. 9–11). Both attention paths of this package draw g with :func:`gumbel`:

- the *site* path: :class:`RelaxedOneHotCategorical` is Pyro's distribution of that name (same
  density, same reparameterised sample) whose ``rsample`` takes its noise from :func:`gumbel`;
  the attention weights are a Pyro sample site that traces, ``describe`` and Predictive record;
- the *fused* path: :func:`fused_relaxed_attention` returns â v without forming â or the logits,
  as PyTorch's fused ``scaled_dot_product_attention`` with the noise as additive mask:
  softmax(q kᵀ · (1/τ) + g/τ) v = softmax((q kᵀ + g) / τ) v. Same noise, same value, same
  gradients with respect to q, k and v; no log-density is computed and nothing but the noise is
  kept for the backward pass. H-STO's â_c, which that path does form (Eq. 15 needs it), is
  drawn by :func:`relaxed_draw`: the site's values without building its distribution.

On the CPU, large noise tensors are drawn in chunks on a thread pool, each chunk from its own
generator seeded from torch's default generator, so ``pyro.set_rng_seed`` still fixes every draw
and the result does not depend on the number of threads.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from functools import cache

import pyro.distributions as dist
import torch
from pyro.distributions.relaxed_straight_through import QuantizeCategorical
from torch import Tensor
from torch.distributions.utils import clamp_probs

from probtrans.attention.multihead import scaled_dot_product
from probtrans.contract import fused_attention_enabled, plate_batch_shape
from probtrans.runtime.paths import paths_for
from probtrans.runtime.precision import full_precision

#: elements per independently seeded chunk of CPU noise
CHUNK = 1 << 22


@cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=max(1, torch.get_num_threads()))


Shape = torch.Size | tuple[int, ...]


def uniform(shape: Shape, dtype: torch.dtype, device: torch.device) -> Tensor:
    """U(0, 1) draws of ``shape``; tensors above :data:`CHUNK` elements on the CPU are filled in
    parallel chunks (torch's CPU generator is sequential)."""
    out = torch.empty(shape, dtype=dtype, device=device)
    if out.device.type != "cpu" or out.numel() <= CHUNK:
        return out.uniform_()
    chunks = out.view(-1).split(CHUNK)
    seeds = torch.randint(2**62, (len(chunks),)).tolist()

    def fill(chunk: Tensor, seed: int) -> None:
        chunk.uniform_(generator=torch.Generator().manual_seed(seed))

    list(_pool().map(fill, chunks, seeds))
    return out


def gumbel(shape: Shape, dtype: torch.dtype, device: torch.device, scale: float = 1.0) -> Tensor:
    """Gumbel noise ``scale`` · g, g = −log(−log u), with u clamped as torch's relaxed samplers
    do (one in-place pass per operation; the scale is folded into the last one). Drawn in
    float32 at least, then given ``dtype``: bfloat16 draws of u (an autocast region's) would
    confine g to [−1.6, 4.9]."""
    drawn = torch.promote_types(dtype, torch.float32)
    eps = torch.finfo(drawn).eps
    noise = uniform(shape, drawn, device).clamp_(eps, 1 - eps).log_().neg_().log_().mul_(-scale)
    return noise.to(dtype)


def relaxed_sample(logits: Tensor, temperature: Tensor | float) -> Tensor:
    """softmax((logits + g) / τ) over the last dimension, g from :func:`gumbel`."""
    noise = gumbel(logits.shape, logits.dtype, logits.device)
    return torch.softmax((logits + noise) / temperature, dim=-1)


class RelaxedOneHotCategorical(dist.RelaxedOneHotCategorical):
    """Pyro's RelaxedOneHotCategorical drawing its noise with :func:`gumbel`."""

    def rsample(self, sample_shape: Shape = ()) -> Tensor:
        shape = self._extended_shape(sample_shape)
        return relaxed_sample(self.logits.expand(shape), self.temperature)


class RelaxedOneHotCategoricalStraightThrough(dist.RelaxedOneHotCategoricalStraightThrough):
    """Straight-through variant: one-hot forward, relaxed gradient backward."""

    def rsample(self, sample_shape: Shape = ()) -> Tensor:
        shape = self._extended_shape(sample_shape)
        soft = clamp_probs(relaxed_sample(self.logits.expand(shape), self.temperature))
        return QuantizeCategorical.apply(soft)


def relaxed_one_hot(temperature: float, logits: Tensor, hard: bool) -> dist.Distribution:
    """Row-wise (straight-through) relaxed one-hot categorical with event shape (H, L, K).

    logits: (*S, B, H, L, K). Batch shape is (*S, B), so the site sits in the data plate (and
    in the vectorised plates of *S). The distribution is in float32 at least: the probabilities
    of an autocast region's bfloat16 logits do not sum to 1 closely enough for its simplex
    check.
    """
    logits = full_precision(logits)
    tau = torch.tensor(temperature, dtype=logits.dtype, device=logits.device)
    cls = RelaxedOneHotCategoricalStraightThrough if hard else RelaxedOneHotCategorical
    return cls(tau, logits=logits).to_event(2)


def takes_fused_path(x: Tensor, hard: bool) -> bool:
    """Whether stochastic attention on ``x``'s device draws through :func:`relaxed_draw` and
    :func:`fused_relaxed_attention` instead of its sample sites: where the sites are hidden
    (:func:`probtrans.contract.fused_attention`), its samples are relaxed (not ``hard``), and the
    device's ``attention`` path (:mod:`probtrans.runtime.paths`) is ``"fused"``."""
    return fused_attention_enabled() and not hard and paths_for(x.device).attention == "fused"


def relaxed_draw(temperature: float, logits: Tensor) -> Tensor:
    """The draw of ``relaxed_one_hot(temperature, logits, hard=False)`` at a hidden site (its
    batch shape broadcast with the active vectorised plates, as Pyro would give it), without
    building the distribution: the same values, with the logits normalised as ``Categorical``
    normalises them, but no argument checks and no log-density. For the fused path, where the
    site is hidden and only the draw is used."""
    logits = full_precision(logits)
    logits = logits - logits.logsumexp(-1, keepdim=True)
    tau = torch.tensor(temperature, dtype=logits.dtype, device=logits.device)
    shape = plate_batch_shape(logits.shape[:-3]) + logits.shape[-3:]  # (*plates, B) + (H, L, K)
    return relaxed_sample(logits.expand(shape), tau)


def fused_relaxed_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    temperature: float,
    key_mask: Tensor | None = None,
    dropout: float = 0.0,
) -> Tensor:
    """â v with â ~ RelaxedOneHotCategorical(τ, logits = q kᵀ) row-wise, fused.

    q: (*S, B, H, L_q, d); k: (*S, B, H, L_k, d); v: (*S, B, H, L_k, d_v), their sample
    dimensions *S broadcasting; key_mask: (B, L_k), True for real tokens (padding keys get
    weight exactly 0) → (*S', B, H, L_q, d_v). The noise has the batch shape the site would
    have (:func:`~probtrans.contract.plate_batch_shape`): inside vectorised plates, *S' includes
    theirs and every sample gets its own noise. ``dropout`` drops sampled weights as
    ``F.dropout(â) @ v`` does.
    """
    events = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])  # (*S, B, H)
    batch = plate_batch_shape(events[:-1])  # the site's batch shape
    shape = (*batch, events[-1], q.shape[-2], k.shape[-2])  # (*S', B, H, L_q, L_k)
    noise = gumbel(shape, q.dtype, q.device, 1.0 / temperature)
    if key_mask is not None:
        noise.masked_fill_(~key_mask[..., None, None, :], -math.inf)
    return scaled_dot_product(q, k, v, noise, dropout_p=dropout, scale=1.0 / temperature)
