"""Guides by name: the variational family over the model's global latent sites (the weights).

Attention sites are never seen here: guides are built on :func:`probtrans.objective.self_guided`
models. Every guide starts at the network's initial weights (``Classifier.initial_weights``).

=========== ==================================================================================
``delta``   point mass: MAP with weight priors, maximum likelihood without (``AutoDelta``)
``normal``  mean-field Normal (``AutoNormal``)
``lowrank`` low-rank-plus-diagonal multivariate Normal (``AutoLowRankMultivariateNormal``); with
            ``sites = "auto"`` nets with more than ``max_lowrank_dims`` latent dimensions get it
            on the last layer only and a point mass elsewhere
=========== ==================================================================================

Models with SGPA layers also have whitened inducing-variable sites ``*.u_g``; their guide is
chosen separately by ``guide.inducing`` (:data:`probtrans.gp.guides.INDUCING_GUIDES`) and
combined with the weight guide in an ``AutoGuideList``.
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

from probtrans.config import GuideSpec
from probtrans.gp.guides import INDUCING_GUIDES, inducing_sites
from probtrans.model import Classifier

LAST_LAYER = ("head.weight", "head.bias")


def _init(classifier: Classifier) -> Callable:
    return init_to_value(values=classifier.initial_weights, fallback=init_to_sample)


def delta_guide(model: Callable, classifier: Classifier, spec: GuideSpec) -> AutoGuide:
    return AutoDelta(model, init_loc_fn=_init(classifier))


def normal_guide(model: Callable, classifier: Classifier, spec: GuideSpec) -> AutoGuide:
    return AutoNormal(model, init_loc_fn=_init(classifier), init_scale=spec.init_scale)


def lowrank_guide(model: Callable, classifier: Classifier, spec: GuideSpec) -> AutoGuide:
    n_dims = sum(w.numel() for w in classifier.initial_weights.values())
    last_layer_only = spec.sites == "last_layer" or (
        spec.sites == "auto" and n_dims > spec.max_lowrank_dims
    )
    sites = [s for s in LAST_LAYER if s in classifier.initial_weights]
    if not last_layer_only or len(sites) == len(classifier.initial_weights):
        return AutoLowRankMultivariateNormal(
            model, init_loc_fn=_init(classifier), init_scale=spec.init_scale, rank=spec.rank
        )
    guide = AutoGuideList(model)
    guide.append(
        AutoLowRankMultivariateNormal(
            poutine.block(model, expose=sites),
            init_loc_fn=_init(classifier),
            init_scale=spec.init_scale,
            rank=spec.rank,
        )
    )
    guide.append(AutoDelta(poutine.block(model, hide=sites), init_loc_fn=_init(classifier)))
    return guide


#: name → builder(model, classifier, spec)
GUIDES: dict[str, Callable[[Callable, Classifier, GuideSpec], AutoGuide]] = {
    "delta": delta_guide,
    "normal": normal_guide,
    "lowrank": lowrank_guide,
}


def build_guide(model: Callable, classifier: Classifier, spec: GuideSpec) -> AutoGuide:
    """The guide named ``spec.name`` for ``model`` (a self-guided view of ``classifier``), with
    ``INDUCING_GUIDES[spec.inducing]`` on the SGPA inducing sites if there are any."""
    sites = inducing_sites(classifier)
    if not sites:
        return GUIDES[spec.name](model, classifier, spec)
    guide = AutoGuideList(model)
    guide.append(INDUCING_GUIDES[spec.inducing](poutine.block(model, expose=sites), spec))
    if classifier.initial_weights:
        guide.append(GUIDES[spec.name](poutine.block(model, hide=sites), classifier, spec))
    return guide
