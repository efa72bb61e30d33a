"""Test-time adaptation (TTA) of a trained classifier to each unlabelled test batch, before
predicting it: the extension point, the context and the loop over a split.

A method is an :class:`AdaptationMethod` with its options class (a
:class:`~probtrans.specs.base.Spec`, validated as every spec is, whose ``method`` field names
it), registered in :data:`ADAPTATION_METHODS` by :func:`register_adaptation`. Built in: EM
adaptation of Gaussian-mixture attention (:mod:`probtrans.tta.em`, Movellan & Gabbur 2020,
Eq. 29–30) and Tent (:mod:`probtrans.tta.tent`, Wang et al. ICLR 2021).

Use :func:`adapted_predictive`, :func:`probtrans.inference.predictive.sample_predictive` with
the adaptation, e.g. ``adapted_predictive(classifier, None, split, "em", samples, draws=draws)``
(the same arguments, and ``adapt``); or, batch by batch, the context
:func:`test_time_adaptation`, whose :meth:`Adaptation.adapt` prepares the model for one batch.

What the adaptation leaves as it was when it ends: every parameter's value, ``requires_grad``
and ``.grad``, the train/eval mode, the mixture layers' ``adaptation`` hooks, the Pyro param
store (parameters stay module-local) and the caller's random state.
"""

from __future__ import annotations

import contextlib
from abc import ABC
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from probtrans.data import DataSplit
from probtrans.errors import ProbtransError
from probtrans.inference.predictive import posterior_draws, sample_predictive
from probtrans.registry import Registry
from probtrans.runtime.progress import progress_bar
from probtrans.specs.base import Spec, parse

#: a method's options: a Spec whose ``method`` field is the method's name
AdaptationOptions = Spec


class AdaptationMethod(ABC):
    """One test-time adaptation of ``classifier`` with ``options``: refused on construction
    for a model it cannot adapt (:meth:`check`); while adapting, what :meth:`enter` sets up
    (undone by the stack), and before each batch :meth:`adapt`."""

    #: its name (``--adapt NAME``), the default of its options' ``method`` field
    name: ClassVar[str]
    #: its options, a Spec with a ``method`` field
    options_class: ClassVar[type[Spec]]

    def __init__(self, classifier: nn.Module, options: Any) -> None:
        self.classifier = classifier
        self.options = options
        self.check()

    def check(self) -> None:  # noqa: B027 (by default, any model)
        """Raise ProbtransError, in one line, for a model this method cannot adapt."""

    def enter(self, stack: contextlib.ExitStack) -> None:  # noqa: B027 (by default, nothing)
        """Set up the adaptation; register on ``stack`` what undoes it."""

    def adapt(  # noqa: B027 (by default, nothing: each forward pass adapts)
        self,
        inputs: Tensor,
        mask: Tensor | None,
        draws: dict[str, Tensor],
        samples: int,
        device: torch.device | str = "cpu",
    ) -> None:
        """Prepare the model for the batch (inputs, mask), whose predictive will use ``draws``
        (site → (S, ...)) and S = ``samples``."""


#: the test-time adaptation methods by name
ADAPTATION_METHODS: Registry[type[AdaptationMethod]] = Registry("test-time adaptation")


def register_adaptation(method: type[AdaptationMethod]) -> type[AdaptationMethod]:
    """Add ``method`` to :data:`ADAPTATION_METHODS` (a plugin's one call; usable as a
    decorator)."""
    return ADAPTATION_METHODS.register(method.name, method)


def adaptation_options(
    adapt: str | AdaptationOptions, online: bool = False, **options: object
) -> AdaptationOptions:
    """The options of ``adapt``: a method name (``"em"``, ``"tent"``, or a plugin's) with
    ``options`` by name (the fields of its options class), or an options object (``options``
    replace its fields). ``online=True`` carries the adapted state over from batch to batch,
    for a method with an ``online`` option (Tent). Bad options raise ConfigError in one line."""
    name = adapt if isinstance(adapt, str) else getattr(adapt, "method", None)
    method = ADAPTATION_METHODS.get(name, "test-time adaptation")
    online = online or options.pop("online", False) is True
    if online and "online" not in method.options_class.model_fields:
        stateful = [
            repr(other)
            for other, m in ADAPTATION_METHODS.items()
            if "online" in m.options_class.model_fields
        ]
        raise ProbtransError(
            f"online adaptation is for {' and '.join(stateful)} only: {name!r} keeps no adapted "
            f"state from one batch to the next"
        )
    table = {**options, **({"online": True} if online else {})}
    if isinstance(adapt, str):
        return parse(method.options_class, table, adapt)
    if not isinstance(adapt, method.options_class):
        raise ProbtransError(
            f"test-time adaptation {name!r}: options must be a {method.options_class.__name__}, "
            f"got a {type(adapt).__name__}"
        )
    return parse(method.options_class, {**adapt.model_dump(), **table}, name) if table else adapt


class Adaptation:
    """Test-time adaptation of ``classifier`` while the context is open (see
    :func:`test_time_adaptation`): its :attr:`method` set up on entering, :meth:`adapt` before
    each batch, everything restored on leaving."""

    def __init__(self, classifier: nn.Module, options: AdaptationOptions) -> None:
        method = ADAPTATION_METHODS.get(options.method, "test-time adaptation")
        self.method = method(classifier, options)  # refuses a model it cannot adapt
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self) -> Adaptation:
        stack = contextlib.ExitStack()
        self.method.enter(stack)
        self._stack = stack
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stack is not None
        self._stack.close()
        self._stack = None

    def adapt(
        self,
        inputs: Tensor,
        mask: Tensor | None,
        draws: dict[str, Tensor],
        samples: int,
        device: torch.device | str = "cpu",
    ) -> None:
        """The method's preparation for the batch (:meth:`AdaptationMethod.adapt`)."""
        if self._stack is None:
            raise RuntimeError("Adaptation.adapt: outside its context (use `with`)")
        self.method.adapt(inputs, mask, draws, samples, device)


def test_time_adaptation(
    classifier: nn.Module,
    adapt: str | AdaptationOptions,
    online: bool = False,
    **options: object,
) -> Adaptation:
    """The context in which ``classifier`` adapts to each test batch: ``adapt`` is a method's
    name with ``options`` by name, or its options object (:func:`adaptation_options`);
    ``online=True`` (Tent) carries the adapted state over between batches. A model the method
    cannot adapt (``em`` without Gaussian-mixture attention) raises
    :class:`~probtrans.errors.ProbtransError`.

    ::

        with test_time_adaptation(classifier, "tent") as adaptation:
            for inputs, mask in batches:
                adaptation.adapt(inputs, mask, draws, samples)  # Tent's steps; em: nothing
                ...  # predict the batch

    :func:`adapted_predictive` does this over a split."""
    return Adaptation(classifier, adaptation_options(adapt, online, **options))


test_time_adaptation.__test__ = False  # not a test, for pytest, when a test module imports it


def adapted_predictive(
    classifier: nn.Module,
    guide: object,
    split: DataSplit,
    adapt: str | AdaptationOptions,
    samples: int = 10,
    batch_size: int = 256,
    device: str = "cpu",
    attention: bool = False,
    draws: dict[str, Tensor] | None = None,
    mc_dropout: bool = False,
    extra_sites: Sequence[str] = (),
    progress: bool = False,
) -> dict[str, np.ndarray]:
    """:func:`probtrans.inference.predictive.sample_predictive`, each batch of ``batch_size``
    examples of ``split`` predicted after the model has adapted to it (``adapt``: see
    :func:`test_time_adaptation`). The same arguments, the same result; the S global draws are
    taken once and shared by every batch. Batches are cut as ``sample_predictive`` cuts them
    (rows in order of length); the predictive of one batch may take several passes."""
    adaptation = Adaptation(classifier, adaptation_options(adapt))  # checks the model
    same = dict(attention=attention, mc_dropout=mc_dropout, extra_sites=extra_sites)
    if len(split) == 0:
        return sample_predictive(
            classifier, guide, split, samples, batch_size, device, draws=draws, **same
        )
    if draws is None:
        draws = posterior_draws(guide, samples, split, device)
    chunks: list[dict[str, np.ndarray]] = []
    located: list[Tensor] = []
    indices = split.batch_indices(batch_size, by_length=True)
    with adaptation:
        for index in progress_bar(
            indices, desc="adapted predictive", leave=False, disable=not progress
        ):
            _, inputs, mask, labels = split.batch(index, trim=not attention)
            adaptation.adapt(inputs, mask, draws, samples, device)
            part = DataSplit(inputs, labels, mask)
            chunks.append(
                sample_predictive(
                    classifier, None, part, samples, batch_size, device, draws=draws, **same
                )
            )
            located.append(index)
    order = torch.cat(located).argsort().numpy()
    return {name: np.concatenate([c[name] for c in chunks], axis=1)[:, order] for name in chunks[0]}
