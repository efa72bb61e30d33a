"""What probtrans's public entry points leave as they found them: Pyro's global param store,
the global random generators and torch's default dtype.

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
- *float32 whatever the caller's default*: the entry points run under :func:`float32_default`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pyro
import torch
from pyro.nn import PyroModule
from torch import Tensor


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
