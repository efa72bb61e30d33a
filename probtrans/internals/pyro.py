r"""Every private Pyro internal that probtrans relies on, in one place.

Pyro does not promise these names across releases, so each is wrapped here, once, and
``tests/test_pyro_internals.py`` checks that each still behaves as used and fails on a Pyro
version not in :data:`CHECKED_PYRO_VERSIONS` (then re-check each function below against that
version's source and add it). Nothing else in probtrans imports a private Pyro name.

- :func:`handler_stack`: Pyro's stack of active handlers (``pyro.poutine.runtime._PYRO_STACK``),
  which :func:`probtrans.contract.sample_attention` walks to refuse an autoguide that would see
  an attention site.
- :func:`is_prototype_block`: whether a handler is the block an autoguide puts around the model
  to trace its prototype (its ``hide_fn`` is ``pyro.infer.autoguide.guides.prototype_hide_fn``,
  a function Pyro does not export).
- :func:`particle_traces` and :func:`particle_loss`: an ELBO's (model, guide) traces per
  particle and the loss of one (``ELBO._get_traces``, ``_differentiable_loss_particle``), so
  that :func:`probtrans.inference.objective.loss_and_terms` computes Pyro's loss and the ELBO's
  terms from the same traces.
- :func:`pyro_sample_names`: the ``PyroSample`` attributes of one module (``_pyro_samples``),
  which :meth:`probtrans.classifier.Classifier.sample_globals` draws outside the data plate.
- :class:`DeepPyroModule`: a ``PyroModule`` whose ``PyroModule``\ s sit deep inside plain
  ``nn.Module``\ s (a Hugging Face backbone): they are named after their path and share its
  Pyro context (``_pyro_set_supermodule``), as direct ``PyroModule`` attributes would.
- :class:`ParamsUnsent` and :func:`quiet_reads`: ``poutine.block(hide_types=["param"])``
  in which the ``PyroModule``\ s made quiet read their parameters, buffers and submodules as
  plain ``nn.Module``\ s do, without the ``param`` messages the block would stop anyway
  (``PyroModule.__getattr__`` sends one per parameter read; ``_pyro_params``,
  ``_pyro_samples``, ``_pyro_name`` and ``_pyro_context`` say which reads are plain).
- :func:`frozen_parameters_unwarned`: the warning ``pyro.module`` gives, with the global param
  store, for each parameter with ``requires_grad=False`` of a module in training mode (its text,
  :data:`FROZEN_PARAMETER_WARNING`), not shown inside the block.
"""

from __future__ import annotations

import copyreg
import functools
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from pyro.distributions.util import is_identically_zero
from pyro.infer import ELBO, Trace_ELBO
from pyro.infer.autoguide.guides import prototype_hide_fn
from pyro.nn import PyroModule
from pyro.poutine.block_messenger import BlockMessenger
from pyro.poutine.messenger import Messenger
from pyro.poutine.runtime import _PYRO_STACK
from pyro.poutine.trace_struct import Trace
from torch import nn

#: the Pyro versions whose source the functions below were checked against
CHECKED_PYRO_VERSIONS = ("1.9.2",)


def handler_stack() -> list[Messenger]:
    """The active Pyro handlers, outermost first (the live list: do not change it)."""
    return _PYRO_STACK


def is_prototype_block(handler: Messenger) -> bool:
    """Whether ``handler`` is the block an autoguide puts around its model while tracing it
    to find the latent sites (``AutoGuide._setup_prototype``)."""
    return isinstance(handler, BlockMessenger) and handler.hide_fn is prototype_hide_fn


def particle_traces(
    elbo: ELBO, model: Callable, guide: Callable, args: tuple, kwargs: dict
) -> Iterator[tuple[Trace, Trace]]:
    """The (model trace, guide trace) of each particle of ``elbo`` (one trace for vectorised
    particles), as ``elbo.differentiable_loss`` draws them."""
    return elbo._get_traces(model, guide, args, kwargs)


def particle_loss(elbo: ELBO, model_trace: Trace, guide_trace: Trace) -> tuple[Any, Any]:
    """(loss, surrogate loss) of one particle, as ``elbo.differentiable_loss`` sums them.

    ``Trace_ELBO`` sums the loss as a Python float, one ``.item()`` per sample site: on a GPU,
    one wait for the device per site. Where every guide site is reparameterised (no
    score-function term) the loss here is a float64 tensor instead, summed in the same order
    from the same float32 terms, so the same number, read nowhere; the surrogate is Pyro's
    (Σ log p − Σ of the guide's entropy terms). Other ELBOs and guides: Pyro's own."""
    guide_sites = [site for site in guide_trace.nodes.values() if site["type"] == "sample"]
    if type(elbo) is not Trace_ELBO or any(
        not is_identically_zero(site["score_parts"].score_function) for site in guide_sites
    ):
        return elbo._differentiable_loss_particle(model_trace, guide_trace)
    loss: Any = 0.0
    surrogate: Any = 0.0
    for site in model_trace.nodes.values():
        if site["type"] == "sample":
            loss = loss - _as_float64(site["log_prob_sum"])
            surrogate = surrogate - site["log_prob_sum"]
    for site in guide_sites:
        loss = loss + _as_float64(site["log_prob_sum"])
        entropy_term = site["score_parts"].entropy_term
        if not is_identically_zero(entropy_term):
            surrogate = surrogate + entropy_term.sum()
    return loss, surrogate


def _as_float64(value: Any) -> Any:
    """A term of the loss as ``torch_item`` reads it (a float64 number), without reading it."""
    return value.detach().double() if torch.is_tensor(value) else value


#: the warning ``pyro.module`` gives for a parameter with ``requires_grad=False`` (a regex)
FROZEN_PARAMETER_WARNING = r".* was not registered in the param store because requires_grad=False"


@contextmanager
def frozen_parameters_unwarned() -> Iterator[None]:
    """Inside the block, Pyro's warning for a frozen parameter of a module that a
    ``PyroModule`` reads under the global param store (``pyro.module`` skips it, and warns
    once per parameter while the module trains) is not shown: a frozen backbone is frozen on
    purpose, and a real one has hundreds of parameters. Every other warning is shown."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=FROZEN_PARAMETER_WARNING, category=UserWarning)
        yield


def pyro_sample_names(module: object) -> list[str]:
    """The names of the ``PyroSample`` attributes of ``module`` itself (not its children);
    none for a plain ``nn.Module``."""
    return list(getattr(module, "_pyro_samples", {}))


class DeepPyroModule(PyroModule):
    r"""A ``PyroModule`` that names every ``PyroModule`` inside it after its path and shares
    its Pyro context with them (so a ``PyroSample`` drawn once in a call is the same draw
    everywhere), also those held by plain ``nn.Module``\ s, which Pyro does not reach. Call
    :meth:`attach_deep` once they are in place; it runs again whenever this module is made
    the attribute of another ``PyroModule``."""

    def attach_deep(self) -> None:
        for path, module in self.named_modules():
            if module is not self and isinstance(module, PyroModule):
                name = f"{self._pyro_name}.{path}" if self._pyro_name else path
                module._pyro_set_supermodule(name, self._pyro_context)

    def _pyro_set_supermodule(self, name: str, context: Any) -> None:
        super()._pyro_set_supermodule(name, context)
        self.attach_deep()


_UNSENT: ContextVar[bool] = ContextVar("probtrans_params_unsent", default=False)


class ParamsUnsent(BlockMessenger):
    """``poutine.block(hide_types=["param"])`` whose quiet modules (:func:`quiet_reads`) send
    no ``param`` message at all: inside it, no handler sees their parameter reads (outside
    it none would, as the block stops them), and nothing else changes. For a training loop
    that trains ``.parameters()`` and reads no parameter from a trace."""

    def __init__(self) -> None:
        super().__init__(hide_types=["param"])
        self._tokens: list[Any] = []

    def __enter__(self) -> ParamsUnsent:
        self._tokens.append(_UNSENT.set(True))
        return super().__enter__()

    def __exit__(self, *exc: Any) -> Any:
        try:
            return super().__exit__(*exc)
        finally:
            _UNSENT.reset(self._tokens.pop())


def _plain_read(module: PyroModule, name: str) -> Any:
    """What ``module.name`` is without Pyro's messages where that is a parameter, buffer or
    named submodule of ``module`` (no ``PyroParam``, no ``PyroSample``), else ``None``."""
    state = module.__dict__
    for table in ("_parameters", "_buffers"):
        if name in state[table]:
            return state[table][name]
    child = state["_modules"].get(name)
    if isinstance(child, PyroModule) and not child._pyro_name:
        return None  # not yet named after its path: Pyro names it on this read
    return child


def _new_instance(cls: type, *args: Any) -> Any:
    """``copyreg.__newobj__`` without its check of the class: a quiet module unpickled."""
    return cls.__new__(cls, *args)


@functools.cache
def _quiet_class(cls: type[PyroModule]) -> type[PyroModule]:
    """``cls`` whose parameter reads and nested calls skip Pyro's messages inside
    :class:`ParamsUnsent`; pickled (and deep-copied) as a ``cls``."""

    def __getattr__(self: PyroModule, name: str) -> Any:
        if _UNSENT.get():
            value = _plain_read(self, name)
            if value is not None:
                return value
        return cls.__getattr__(self, name)

    def __call__(self: PyroModule, *args: Any, **kwargs: Any) -> Any:
        context = self._pyro_context
        if _UNSENT.get() and context.active:  # nested: Pyro checks only the outermost call
            with context:
                return nn.Module.__call__(self, *args, **kwargs)
        return cls.__call__(self, *args, **kwargs)

    def __reduce_ex__(self: PyroModule, protocol: Any) -> Any:
        reduced = list(cls.__reduce_ex__(self, protocol))
        args = reduced[1]
        if args and args[0] is type(self):  # rebuilt from its class: from cls instead
            reduced[1] = (cls, *args[1:])
            if reduced[0] is copyreg.__newobj__:  # which checks the class against the object's
                reduced[0] = _new_instance
        return tuple(reduced)

    namespace = {"__getattr__": __getattr__, "__call__": __call__, "__reduce_ex__": __reduce_ex__}
    namespace |= {"__module__": cls.__module__, "_probtrans_quiet": True}
    return type(cls.__name__, (cls,), namespace)


def quiet_reads(root: nn.Module) -> None:
    """Make every ``PyroModule`` in ``root`` quiet inside :class:`ParamsUnsent`, in place (as
    Pyro's ``to_pyro_module_`` changes a module's class); outside it they behave as before."""
    for module in root.modules():
        if isinstance(module, PyroModule) and not getattr(type(module), "_probtrans_quiet", False):
            module.__class__ = _quiet_class(type(module))
