"""Building a classifier's guide: the one place where a guide is made ready for use.

The guide covers the global sites of the self-guided model (:func:`~probtrans.inference.
objective.self_guided`): the weight guide named by ``guide.name`` (:data:`probtrans.guides.GUIDES`)
on the weights that carry priors, and the guide named by ``guide.inducing``
(:data:`probtrans.gp.guides.INDUCING_GUIDES`) on the inducing variables of SGPA layers, combined
in an ``AutoGuideList`` when there are both. An autoguide creates its parameters on its first
call; :func:`build_guide` makes that call on an example batch, so the guide's ``parameters()`` and
``state_dict()`` are complete when it is returned (to be optimised or loaded). The guide keeps its
parameters in its modules wherever it is called (:func:`probtrans.contract.keep_params_local`).
"""

from __future__ import annotations

import torch
from pyro import poutine
from pyro.infer.autoguide import AutoGuide, AutoGuideList

from probtrans.attention import inducing_sites
from probtrans.contract import keep_params_local, local_params
from probtrans.data import DataSplit
from probtrans.gp.guides import INDUCING_GUIDES
from probtrans.guides import GUIDES
from probtrans.inference.objective import self_guided
from probtrans.model import Classifier
from probtrans.specs import GuideSpec


@local_params()
def build_guide(
    classifier: Classifier, spec: GuideSpec, example: DataSplit, device: str = "cpu"
) -> AutoGuide:
    """The guide ``spec`` describes for ``classifier``, its parameters created on two rows of
    ``example`` (any split of the classifier's data) on ``device``."""
    model = self_guided(classifier)
    weight_guide = GUIDES.get(spec.name, "guide.name")
    sites = inducing_sites(classifier)
    if not sites:
        guide = weight_guide(model, classifier.initial_weights, spec)
    else:
        guide = AutoGuideList(model)
        inducing_guide = INDUCING_GUIDES.get(spec.inducing, "guide.inducing")
        guide.append(inducing_guide(poutine.block(model, expose=sites), spec))
        if classifier.initial_weights:
            hidden = poutine.block(model, hide=sites)
            guide.append(weight_guide(hidden, classifier.initial_weights, spec))
    keep_params_local(guide)
    _, inputs, mask, labels = next(example.batches(2))
    with torch.no_grad():
        guide(inputs.to(device), None if mask is None else mask.to(device), labels.to(device))
    return guide
