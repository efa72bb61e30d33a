"""Weight guides by name: the variational family over a model's weights that carry priors.

Guides are built on :func:`probtrans.inference.objective.self_guided` models, so they only see
global sites; :func:`probtrans.inference.guide.build_guide` combines the weight guide named here
with the inducing-variable guide of SGPA layers. Every guide starts at the network's initial
weights (``initial``, site name → value).

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

from pyro import poutine
from pyro.infer.autoguide import (
    AutoDelta,
    AutoGuide,
    AutoGuideList,
    AutoLowRankMultivariateNormal,
    AutoNormal,
    init_to_sample,
    init_to_value,
)
from torch import Tensor

from probtrans.registry import Registry
from probtrans.specs import GuideSpec

#: the classification head's sites, where ``lowrank`` goes on large nets
LAST_LAYER = ("head.weight", "head.bias")

WeightGuide = Callable[[Callable, dict[str, Tensor], GuideSpec], AutoGuide]

#: ``guide.name`` → builder(self-guided model, initial weights, guide spec)
GUIDES: Registry[WeightGuide] = Registry("guide")


def _init(initial: dict[str, Tensor]) -> Callable:
    return init_to_value(values=initial, fallback=init_to_sample)


def delta_guide(model: Callable, initial: dict[str, Tensor], spec: GuideSpec) -> AutoGuide:
    return AutoDelta(model, init_loc_fn=_init(initial))


def normal_guide(model: Callable, initial: dict[str, Tensor], spec: GuideSpec) -> AutoGuide:
    return AutoNormal(model, init_loc_fn=_init(initial), init_scale=spec.init_scale)


def lowrank_guide(model: Callable, initial: dict[str, Tensor], spec: GuideSpec) -> AutoGuide:
    n_dims = sum(w.numel() for w in initial.values())
    last_layer_only = spec.sites == "last_layer" or (
        spec.sites == "auto" and n_dims > spec.max_lowrank_dims
    )
    sites = [s for s in LAST_LAYER if s in initial]
    if not last_layer_only or len(sites) == len(initial):
        return AutoLowRankMultivariateNormal(
            model, init_loc_fn=_init(initial), init_scale=spec.init_scale, rank=spec.rank
        )
    guide = AutoGuideList(model)
    guide.append(
        AutoLowRankMultivariateNormal(
            poutine.block(model, expose=sites),
            init_loc_fn=_init(initial),
            init_scale=spec.init_scale,
            rank=spec.rank,
        )
    )
    guide.append(AutoDelta(poutine.block(model, hide=sites), init_loc_fn=_init(initial)))
    return guide


GUIDES.register("delta", delta_guide)
GUIDES.register("normal", normal_guide)
GUIDES.register("lowrank", lowrank_guide)
