"""Weight guides by name: the variational family over a model's weights that carry priors.

Guides are built on :func:`probtrans.inference.objective.self_guided` models, so they only see
global sites; :func:`probtrans.inference.guide_builder.build_guide` combines the weight guide named
here with the inducing-variable guide of SGPA layers (:mod:`probtrans.guides.inducing`). Every
guide starts at the network's initial weights (``initial``, site name → value) and any other
site at its prior's mean (:func:`start_at`). A registry entry is a :class:`NamedGuide`: the
builder and what the guide is in words.

=========== ==================================================================================
``delta``   point mass: MAP with weight priors, maximum likelihood without (``AutoDelta``)
``normal``  mean-field Normal (``AutoNormal``)
``lowrank`` low-rank-plus-diagonal multivariate Normal (``AutoLowRankMultivariateNormal``); with
            ``sites = "auto"`` nets with more than ``max_lowrank_dims`` latent dimensions get it
            on the last layer only and a point mass elsewhere
=========== ==================================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyro import poutine
from pyro.infer.autoguide import (
    AutoDelta,
    AutoGuide,
    AutoGuideList,
    AutoLowRankMultivariateNormal,
    AutoNormal,
    init_to_mean,
    init_to_value,
)
from torch import Tensor

from probtrans.registry import Registry
from probtrans.specs import GuideSpec

#: the classification head's sites, where ``lowrank`` goes on large nets
LAST_LAYER = ("head.weight", "head.bias")

#: builder(model, initial values by site, guide spec) → the guide
GuideBuilder = Callable[[Callable, dict[str, Tensor], GuideSpec], AutoGuide]


@dataclass(frozen=True)
class NamedGuide:
    """A guide of a registry (:data:`GUIDES`,
    :data:`probtrans.guides.inducing.INDUCING_GUIDES`)."""

    build: GuideBuilder
    #: what it is, in words (figure titles)
    words: str
    #: what it is where the weights carry no priors (``[model.prior] weights = "none"``), if
    #: that changes its meaning: a point mass is then maximum likelihood
    words_without_priors: str | None = None


#: ``guide.name`` → the weight guide
GUIDES: Registry[NamedGuide] = Registry("guide")


def start_at(initial: dict[str, Tensor]) -> Callable:
    """The ``init_loc_fn`` of a guide: each site of ``initial`` at its value, any other (the
    inducing variables) at its prior's mean."""
    return init_to_value(values=initial, fallback=init_to_mean)


def delta_guide(model: Callable, initial: dict[str, Tensor], spec: GuideSpec) -> AutoGuide:
    """A point mass (MAP with priors, ``AutoDelta``), for weights and inducing variables."""
    return AutoDelta(model, init_loc_fn=start_at(initial))


def normal_guide(model: Callable, initial: dict[str, Tensor], spec: GuideSpec) -> AutoGuide:
    return AutoNormal(model, init_loc_fn=start_at(initial), init_scale=spec.init_scale)


def lowrank_guide(model: Callable, initial: dict[str, Tensor], spec: GuideSpec) -> AutoGuide:
    n_dims = sum(w.numel() for w in initial.values())
    last_layer_only = spec.sites == "last_layer" or (
        spec.sites == "auto" and n_dims > spec.max_lowrank_dims
    )
    sites = [s for s in LAST_LAYER if s in initial]
    if not last_layer_only or len(sites) == len(initial):
        return AutoLowRankMultivariateNormal(
            model, init_loc_fn=start_at(initial), init_scale=spec.init_scale, rank=spec.rank
        )
    guide = AutoGuideList(model)
    guide.append(
        AutoLowRankMultivariateNormal(
            poutine.block(model, expose=sites),
            init_loc_fn=start_at(initial),
            init_scale=spec.init_scale,
            rank=spec.rank,
        )
    )
    guide.append(AutoDelta(poutine.block(model, hide=sites), init_loc_fn=start_at(initial)))
    return guide


GUIDES.register(
    "delta", NamedGuide(delta_guide, "MAP (point mass)", "maximum likelihood (no weight priors)")
)
GUIDES.register("normal", NamedGuide(normal_guide, "mean-field normal"))
GUIDES.register("lowrank", NamedGuide(lowrank_guide, "low-rank + diagonal normal"))
