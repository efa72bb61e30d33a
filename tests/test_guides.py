"""Guides by name: which sites each one covers."""

from __future__ import annotations

import pytest
import torch
from pyro import poutine
from pyro.infer.autoguide import AutoDelta, AutoGuideList, AutoLowRankMultivariateNormal

from probtrans.classifier import build_classifier
from probtrans.guides.inducing import INDUCING_GUIDES
from probtrans.guides.weights import GUIDES, delta_guide
from probtrans.inference.guide_builder import build_guide, guide_in_words, spread_parameters
from probtrans.specs import GuideSpec
from tests.conftest import tiny_spec


def guide_sites(guide, digits):
    _, inputs, mask, labels = next(digits.train.batches(4))
    trace = poutine.trace(guide).get_trace(inputs, mask, labels)
    return {
        name
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and not site["infer"].get("is_auxiliary")
    }


@pytest.mark.parametrize("max_dims,last_layer_only", [(10**9, False), (100, True)])
def test_lowrank_goes_on_the_last_layer_of_large_nets(digits, max_dims, last_layer_only):
    classifier = build_classifier(tiny_spec("sto", prior="all"), digits)
    spec = GuideSpec(name="lowrank", sites="auto", max_lowrank_dims=max_dims)
    guide = build_guide(classifier, spec, digits.train)
    sites = guide_sites(guide, digits)
    assert sites >= set(classifier.prior_sites)  # every weight with a prior is covered
    if last_layer_only:
        assert isinstance(guide, AutoGuideList)
        lowrank, delta = guide
        assert isinstance(lowrank, AutoLowRankMultivariateNormal) and isinstance(delta, AutoDelta)
        assert set(lowrank.prototype_trace.stochastic_nodes) == {"head.weight", "head.bias"}
    else:
        assert isinstance(guide, AutoLowRankMultivariateNormal)


@pytest.mark.parametrize(
    "kind,name,sites",
    [
        ("sto", "delta", "auto"),
        ("sto", "normal", "auto"),
        ("sto", "lowrank", "all"),
        ("sto", "lowrank", "last_layer"),  # in an AutoGuideList beside a point mass
        ("sgpa", "normal", "auto"),  # with the inducing variables' Cholesky guide
    ],
)
def test_spread_parameters_are_the_guides_scales_and_nothing_else(digits, kind, name, sites):
    """``[optim] scale_lr``'s parameters: by Pyro's own names, every scale, low-rank factor and
    Cholesky factor of the guide, and no location."""
    classifier = build_classifier(tiny_spec(kind, prior="all"), digits)
    guide = build_guide(classifier, GuideSpec(name=name, sites=sites), digits.train)
    names = {id(p): n for n, p in guide.named_parameters()}
    spread = {names[id(p)] for p in spread_parameters(guide)}
    # a parameter's own name in its guide, after the AutoGuideList's index: "scales.head.weight"
    own = {n: n.split(".", 1)[1] if n.split(".")[0].isdigit() else n for n in names.values()}
    expected = {n for n, o in own.items() if o.startswith("scale") or o == "cov_factor"}
    assert spread == expected
    assert bool(spread) == (name != "delta" or kind == "sgpa")
    assert not any(o.startswith("loc") for n, o in own.items() if n in spread)


def test_guides_never_see_attention_sites(digits):
    classifier = build_classifier(tiny_spec("h_sto", prior="last_layer"), digits)
    for name in ("delta", "normal", "lowrank"):
        guide = build_guide(classifier, GuideSpec(name=name), digits.train)
        assert guide_sites(guide, digits) == {"head.weight", "head.bias"}


@pytest.mark.parametrize("name", ["delta", "normal", "lowrank"])
def test_priors_and_guides_follow_the_classifier_to_its_device(digits, name, device):
    """Weight priors are built from buffers that ``.to`` moves (here also to float64, a change
    a CPU run can see); a guide built for ``device`` starts on it, at the initial weights."""
    classifier = build_classifier(tiny_spec("sto", prior="all"), digits)
    classifier.to(device, torch.float64)
    for draw in (classifier.head.weight, classifier.embedding.proj.weight):  # from the prior
        assert draw.device.type == device and draw.dtype == torch.float64
    classifier.float()
    guide = build_guide(classifier, GuideSpec(name=name), digits.train, device)
    assert all(param.device.type == device for param in guide.parameters())
    _, inputs, _, labels = next(digits.train.batches(4))
    start = guide.median(inputs.to(device), None, labels.to(device))
    for site, initial in classifier.prior_sites.items():
        torch.testing.assert_close(start[site], initial.to(device), msg=site)


def test_a_guide_in_words_is_its_registered_description():
    assert guide_in_words("delta") == "MAP (point mass)"
    assert guide_in_words("delta", "none") == "maximum likelihood (no weight priors)"
    assert guide_in_words("normal", "last_layer") == "mean-field normal on the last layer"
    assert guide_in_words("normal", "none") == "mean-field normal (no weight priors)"
    assert guide_in_words("my guide") == "my guide"  # a guide given in Python: what it is
    sgpa = guide_in_words("delta", "none", inducing="cholesky")
    assert sgpa == "maximum likelihood (no weight priors), inducing variables: full-rank normal"


def test_every_registered_guide_has_words():
    for registry in (GUIDES, INDUCING_GUIDES):
        assert all(registry.get(name, "name").words for name in registry)


def test_one_point_mass_guide_serves_weights_and_inducing_variables():
    assert GUIDES.get("delta", "guide.name").build is delta_guide
    assert INDUCING_GUIDES.get("delta", "guide.inducing").build is delta_guide


def test_an_autoguide_class_given_in_python_starts_at_the_specs_init_scale():
    """``fit(..., guide=AutoNormal)``: Pyro's default init_scale (0.1) is replaced by the
    inference specs' 0.01 unless the call names one (then it is kept)."""
    import functools

    from pyro.infer.autoguide import AutoNormal

    from probtrans.data import load_data
    from probtrans.inference.guide_builder import AUTOGUIDE_INIT_SCALE, given_guide
    from probtrans.runtime.caller_state import local_params

    spec = tiny_spec(prior="last_layer")
    data = load_data(spec.data)
    classifier = build_classifier(spec, data)
    asked = {None: AUTOGUIDE_INIT_SCALE, 0.2: 0.2}
    for given, expected in asked.items():
        factory = AutoNormal if given is None else functools.partial(AutoNormal, init_scale=given)
        guide = given_guide(classifier, factory, data.val)
        _, inputs, mask, labels = next(data.val.batches(2))
        with torch.no_grad(), local_params():  # each guide its own parameters
            draws = torch.stack([guide(inputs, mask, labels)["head.weight"] for _ in range(400)])
        spread = float(draws.std(0).mean())
        assert spread == pytest.approx(expected, rel=0.1), (given, spread)
    assert AUTOGUIDE_INIT_SCALE == GuideSpec().init_scale
