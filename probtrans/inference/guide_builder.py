"""Building a classifier's guide: the one place where a guide is made ready for use.

A guide given in Python (:func:`given_guide`) takes the place of the named ones: a Pyro guide
(a hand-written function or module), or a factory ``model -> guide`` such as ``AutoNormal`` or
``functools.partial(AutoLowRankMultivariateNormal, rank=4)``, called on the self-guided model.

The guide covers the global sites of the self-guided model (:func:`~probtrans.inference.
objective.self_guided`): the weight guide named by ``guide.name``
(:data:`probtrans.guides.weights.GUIDES`) on the weights that carry priors, and the guide named by
``guide.inducing`` (:data:`probtrans.guides.inducing.INDUCING_GUIDES`) on the inducing variables of
SGPA layers, combined in an ``AutoGuideList`` when there are both. An autoguide creates its
parameters on its first call; :func:`build_guide` makes that call on an example batch, so the
guide's ``parameters()`` and ``state_dict()`` are complete when it is returned (to be optimised or
loaded). The guide keeps its parameters in its modules wherever it is called
(:func:`probtrans.runtime.caller_state.keep_params_local`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from pyro import poutine
from pyro.infer.autoguide import (
    AutoGuide,
    AutoGuideList,
    AutoLowRankMultivariateNormal,
    AutoNormal,
)
from torch import Tensor, nn

from probtrans.attention import inducing_sites
from probtrans.classifier import Classifier
from probtrans.data import DataSplit
from probtrans.errors import ProbtransError
from probtrans.guides.inducing import INDUCING_GUIDES, AutoInducingCholesky
from probtrans.guides.weights import GUIDES
from probtrans.inference.objective import self_guided
from probtrans.runtime.caller_state import keep_params_local, local_params
from probtrans.specs import GuideSpec

#: a guide given in Python: a Pyro guide, or a factory ``model -> guide`` (e.g. an autoguide class)
GuideChoice = Callable[..., Any]


@local_params()
def build_guide(
    classifier: Classifier, spec: GuideSpec, example: DataSplit, device: str = "cpu"
) -> AutoGuide:
    """The guide ``spec`` describes for ``classifier``, its parameters created on two rows of
    ``example`` (any split of the classifier's data) on ``device``, starting from the
    classifier's initial weights."""
    model = self_guided(classifier)
    weight_guide = GUIDES.get(spec.name, "guide.name").build
    sites = inducing_sites(classifier)
    initial = {name: value.to(device) for name, value in classifier.prior_sites.items()}
    if not sites:
        guide = weight_guide(model, initial, spec)
    else:
        guide = AutoGuideList(model)
        inducing_guide = INDUCING_GUIDES.get(spec.inducing, "guide.inducing").build
        guide.append(inducing_guide(poutine.block(model, expose=sites), initial, spec))
        if initial:
            hidden = poutine.block(model, hide=sites)
            guide.append(weight_guide(hidden, initial, spec))
    keep_params_local(guide)
    _, inputs, mask, labels = next(example.batches(2))
    with torch.no_grad():
        guide(inputs.to(device), None if mask is None else mask.to(device), labels.to(device))
    return guide


def guide_in_words(
    name: str, weight_priors: str = "all", inducing: str | None = None, given: bool = False
) -> str:
    """The guide called ``name`` in words (figure titles): its registered words
    (:class:`~probtrans.guides.weights.NamedGuide`; a guide given in Python, ``given``: ``name``,
    its label, even where it is a registered name), the weights' priors (``[model.prior] weights``)
    and, for a model with inducing variables, the words of their guide ``inducing`` (a
    ``guide.inducing``)."""
    named = GUIDES.get(name, "guide.name") if name in GUIDES and not given else None
    if named is not None and weight_priors == "none" and named.words_without_priors:
        words = named.words_without_priors
    else:
        words = name if named is None else named.words
        if weight_priors == "last_layer":
            words += " on the last layer"
        elif weight_priors == "none":
            words += " (no weight priors)"
    if inducing:
        words += f", inducing variables: {INDUCING_GUIDES.get(inducing, 'guide.inducing').words}"
    return words


def _binds(signature: inspect.Signature, *args: Any, **kwargs: Any) -> bool:
    try:
        signature.bind(*args, **kwargs)
    except TypeError:
        return False
    return True


def is_factory(choice: GuideChoice) -> bool:
    """Whether ``choice`` is a factory ``model -> guide`` rather than a guide: a class that is not
    yet a guide (``AutoNormal``), or a callable that takes one argument but not a model's
    ``(inputs, mask, labels, index=..., n_data=...)``."""
    if isinstance(choice, nn.Module):
        return False
    if isinstance(choice, type):
        return True
    try:
        signature = inspect.signature(choice)
    except (TypeError, ValueError):
        return False
    call = (None, None, None)
    if _binds(signature, *call, index=None, n_data=None):
        return False
    if _binds(signature, None):
        return True
    raise ProbtransError(
        f"guide {choice!r}: takes neither a model (a factory model -> guide) nor the model's "
        f"arguments (inputs, mask, labels, index=..., n_data=...) (a guide)"
    )


#: the ``init_scale`` of an autoguide class given in Python that names none: the inference
#: specs' (:class:`~probtrans.specs.GuideSpec`), where Pyro's own, 0.1, starts a mean-field guide
#: over a network's weights too noisy to train (it stayed at chance on digits)
AUTOGUIDE_INIT_SCALE: float = GuideSpec.model_fields["init_scale"].default


def with_init_scale(factory: Callable) -> Callable:
    """``factory`` with ``init_scale`` = :data:`AUTOGUIDE_INIT_SCALE` where it is an autoguide
    class, or a ``functools.partial`` of one, that takes one and was not given one."""
    target = factory.func if isinstance(factory, functools.partial) else factory
    given = factory.keywords if isinstance(factory, functools.partial) else {}
    takes = isinstance(target, type) and issubclass(target, AutoGuide)
    if takes and "init_scale" in inspect.signature(target).parameters and "init_scale" not in given:
        return functools.partial(factory, init_scale=AUTOGUIDE_INIT_SCALE)
    return factory


@local_params()
def given_guide(
    classifier: Classifier, choice: GuideChoice, example: DataSplit, device: str = "cpu"
) -> Callable:
    """The guide ``choice`` stands for on ``classifier`` (:data:`GuideChoice`; an autoguide class
    without ``init_scale`` gets :data:`AUTOGUIDE_INIT_SCALE`), called once on two rows of
    ``example`` so that its parameters exist."""
    model = self_guided(classifier)
    if is_factory(choice):
        guide = with_init_scale(choice)(model)
    elif isinstance(choice, AutoGuide):  # the model is built here, so it was built on another
        raise ProbtransError(
            f"guide {type(choice).__name__}: an autoguide built on another model; pass its "
            f"class or a factory instead (e.g. guide=AutoNormal, or guide=lambda model: "
            f"AutoNormal(model, init_scale=0.01)), and probtrans builds it on this model"
        )
    else:
        guide = choice
    _, inputs, mask, labels = next(example.batches(2))
    with torch.no_grad():
        guide(inputs.to(device), None if mask is None else mask.to(device), labels.to(device))
    return guide


def guide_parameters(
    classifier: Classifier, guide: Callable, example: DataSplit, device: str = "cpu"
) -> dict[str, Tensor]:
    """Every parameter the guide trains, by name: a module's ``named_parameters()`` and the
    parameters its ``pyro.param`` statements use (a hand-written guide's, in the param store),
    found by tracing it on two rows of ``example``. The classifier's own are left out."""
    own = {id(p) for p in classifier.parameters()}
    named = dict(guide.named_parameters()) if isinstance(guide, nn.Module) else {}
    _, inputs, mask, labels = next(example.batches(2))
    with local_params(), torch.no_grad(), poutine.trace(param_only=True) as tape:
        guide(inputs.to(device), None if mask is None else mask.to(device), labels.to(device))
    seen = {id(p) for p in named.values()}
    for name, site in tape.trace.nodes.items():
        value = site["value"]
        leaf = value.unconstrained() if hasattr(value, "unconstrained") else value
        if leaf.requires_grad and id(leaf) not in own | seen:
            named[name] = leaf
            seen.add(id(leaf))
    return named


def spread_parameters(guide: Callable) -> list[Tensor]:
    """The parameters that set a guide's spread, not its location (``[optim] scale_lr`` applies
    to them): ``AutoNormal``'s ``scales``, ``AutoLowRankMultivariateNormal``'s diagonal and
    ``cov_factor``, :class:`~probtrans.guides.inducing.AutoInducingCholesky`'s ``scale_trils``,
    wherever they sit in the guide (an ``AutoGuideList`` included). A point mass has none, nor
    have ``pyro.param`` statements: they train at ``lr``."""
    if not isinstance(guide, nn.Module):
        return []
    found: list[Tensor] = []
    for module in guide.modules():
        if isinstance(module, AutoNormal):
            found += module.scales.parameters()
        elif isinstance(module, AutoLowRankMultivariateNormal):
            found += [p for name, p in module.named_parameters(recurse=False) if name != "loc"]
        elif isinstance(module, AutoInducingCholesky):
            found += module.scale_trils.parameters()
    return found
