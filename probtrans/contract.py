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
  one fused kernel without recording their sites (:mod:`probtrans.attention.gumbel`). Pyro
  broadcasts a site over the active vectorised plates, not the noise drawn without one, so the
  fused path draws its noise with :func:`plate_batch_shape`: one draw per sample of a
  vectorised plate (``Predictive(..., parallel=True)``, vectorised ELBO particles).
- *Output sites are for the predictive*: a classifier records its outputs (``features``,
  ``probs``, ``energy``) as deterministic sites for ``Predictive`` and the run's predictive;
  the training objective reads none of them (their log-density is 0), so it computes them
  under :func:`outputs_unrecorded`, where the classifier skips the sites and the work of
  ``probs`` and ``energy``.
- *Parameters live in their modules*: probtrans trains the parameters of its models and guides
  with a PyTorch optimiser, so its own work runs under :func:`local_params` (Pyro's
  ``module_local_params`` setting, scoped with ``pyro.settings.context``): nothing is read from or
  written to the global param store, and nothing global changes. Models are built under it, so
  they can then be called in either mode; the guides probtrans builds always keep their
  parameters locally (:func:`keep_params_local`), so two runs in one session never share one.
- *The caller's random state is the caller's*: probtrans seeds its own draws, and its public
  entry points (``probtrans.fit``, ``Run.load``, ``Run.predict``, ``Run.posterior_samples``,
  evaluation, ``train_classifier``) run under :func:`caller_random_state`, which saves the
  global generators on entry and restores them on exit, so a call leaves them as it found them;
  a generator (``Run.predict_chunks``) runs each of its steps so (:class:`SteppedRandomState`).
- *Mixed precision*: training may run a model under ``torch.autocast`` (bfloat16); the parts
  that must not be rounded to bfloat16 (SGPA's kernel matrices, Cholesky factors and GP
  conditionals, the Gaussian-mixture units, SNGP's spectral norm and random features, the
  classifier's logits) leave it with :func:`autocast_off` and compute in :func:`full_precision`.
- *Attention sites are no guide's business*: an autoguide built on a model whose attention sites
  are visible would become a per-example guide over attention matrices; :func:`sample_attention`
  refuses that and names :func:`probtrans.self_guided`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import Any

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule
from pyro.poutine.block_messenger import BlockMessenger
from pyro.poutine.runtime import get_plates
from torch import Tensor

from probtrans.errors import ProbtransError
from probtrans.pyro_internals import handler_stack, is_prototype_block

#: ``infer`` flag of sites whose guide is their own conditional distribution
SELF_GUIDED = "probtrans_self_guided"
#: ``infer`` flag of factor sites holding a per-example KL term
KL_TERM = "probtrans_kl_term"

_FUSED: ContextVar[bool] = ContextVar("probtrans_fused_attention", default=False)
_OUTPUTS: ContextVar[bool] = ContextVar("probtrans_output_sites", default=True)


def local_params() -> AbstractContextManager[None]:
    """Run with every ``PyroModule`` keeping its parameters in the module (Pyro's
    ``module_local_params``), for this block only; also a decorator."""
    return pyro.settings.context(module_local_params=True)


@contextmanager
def caller_random_state() -> Iterator[None]:
    """Restore the global random states on leaving the block as they were on entering it:
    Python's ``random``, NumPy's and torch's CPU generator (``pyro.util.get_rng_state``), and
    every CUDA device's where CUDA is initialised, whatever the block seeds or draws; also a
    decorator."""
    state = pyro.util.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        pyro.util.set_rng_state(state)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


class SteppedRandomState:
    """The global random states of a computation that runs in steps with the caller's code
    between them (a generator): each step, ``with state.step():``, runs under
    :func:`caller_random_state` and starts from the states the previous step left, so the
    steps draw as one uninterrupted computation would, and the caller's states between and
    after the steps are the caller's."""

    def __init__(self) -> None:
        self.state: dict[str, Any] | None = None
        self.cuda: list[Tensor] | None = None

    @contextmanager
    def step(self) -> Iterator[None]:
        with caller_random_state():
            if self.state is not None:
                pyro.util.set_rng_state(self.state)
            if self.cuda is not None:
                torch.cuda.set_rng_state_all(self.cuda)
            try:
                yield
            finally:
                self.state = pyro.util.get_rng_state()
                if torch.cuda.is_initialized():
                    self.cuda = torch.cuda.get_rng_state_all()


@contextmanager
def float32_default() -> Iterator[None]:
    """torch's default floating-point type is float32 inside the block, whatever the caller
    set (``torch.set_default_dtype(torch.float64)`` is common in GP code): a run's networks,
    checkpoints and data are float32. The caller's default is back on leaving; also a
    decorator."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


class LocalParams:
    """Mixin of a ``PyroModule`` class that is built and called under :func:`local_params`,
    whatever the global setting."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        with local_params():
            super().__init__(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with local_params():
            return super().__call__(*args, **kwargs)


@functools.cache
def _local_class(cls: type[PyroModule]) -> type[PyroModule]:
    return type(cls.__name__, (LocalParams, cls), {"__module__": cls.__module__})


def keep_params_local(module: PyroModule) -> PyroModule:
    """Make ``module`` (built under :func:`local_params`) keep its parameters locally whenever it
    is called, in place, as Pyro's ``to_pyro_module_`` changes a module's class; returns it."""
    module.__class__ = _local_class(type(module))
    return module


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


def full_precision(x: Tensor) -> Tensor:
    """``x`` in float32, or as it is if it is wider (float64): a bfloat16 or float16 tensor of an
    autocast region comes back in float32."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def autocast_off(x: Tensor) -> torch.autocast:
    """A block in which autocast is off on the device type of ``x``: its operations run in the
    dtype of their inputs (made :func:`full_precision`), even inside an autocast region."""
    return torch.autocast(x.device.type, enabled=False)
