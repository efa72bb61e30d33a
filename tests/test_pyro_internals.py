"""The private Pyro internals of :mod:`probtrans.pyro_internals`: checked against the Pyro
versions listed there, and each still behaving as probtrans uses it."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule, PyroSample

from probtrans.pyro_internals import (
    CHECKED_PYRO_VERSIONS,
    handler_stack,
    is_prototype_block,
    particle_loss,
    particle_traces,
    pyro_sample_names,
)


def test_the_installed_pyro_is_a_checked_version():
    assert pyro.__version__ in CHECKED_PYRO_VERSIONS, (
        f"pyro {pyro.__version__} is not among the versions probtrans's private Pyro internals "
        f"were checked against ({', '.join(CHECKED_PYRO_VERSIONS)}): re-check each function of "
        f"probtrans/pyro_internals.py against this version's source (_PYRO_STACK, "
        f"prototype_hide_fn, ELBO._get_traces and _differentiable_loss_particle, "
        f"PyroModule._pyro_samples), run this file, then add the version to "
        f"CHECKED_PYRO_VERSIONS"
    )


def model() -> None:
    with pyro.plate("data", 3):
        pyro.sample("z", dist.Normal(0.0, 1.0))


def test_the_handler_stack_lists_the_active_handlers_outermost_first():
    seen = []

    def probe() -> None:
        seen.extend(type(handler).__name__ for handler in handler_stack())

    with poutine.trace(), poutine.block():
        probe()
    assert seen[-2:] == ["TraceMessenger", "BlockMessenger"]
    assert handler_stack() == []


def test_an_autoguide_traces_its_prototype_inside_a_prototype_block():
    found = []

    def probed() -> None:
        found.append(any(is_prototype_block(h) for h in handler_stack()))
        model()

    AutoNormal(probed)()  # the first call traces the prototype, then runs the guide
    assert found[0]
    with poutine.block():
        probed()
    assert not found[-1]  # an ordinary block is not one


@pytest.mark.parametrize("elbo_class", [Trace_ELBO, TraceMeanField_ELBO])
@pytest.mark.parametrize("vectorize", [False, True])
def test_particle_traces_and_losses_give_the_elbos_own_loss(elbo_class, vectorize):
    """The loss of :func:`probtrans.inference.objective.loss_and_terms`: the particles' losses
    averaged, equal to ``differentiable_loss`` on the same draws."""
    guide = AutoNormal(model)
    guide()  # its parameters exist before the draws compared
    elbo = elbo_class(num_particles=3, vectorize_particles=vectorize, max_plate_nesting=1)
    pyro.set_rng_seed(0)
    expected = elbo.differentiable_loss(model, guide)
    pyro.set_rng_seed(0)
    traces = list(particle_traces(elbo, model, guide, (), {}))
    assert len(traces) == (1 if vectorize else 3)
    loss = sum(particle_loss(elbo, *pair)[0] for pair in traces) / elbo.num_particles
    torch.testing.assert_close(torch.as_tensor(loss), expected.detach())


def test_pyro_sample_names_are_a_modules_own_pyro_sample_attributes():
    class Layer(PyroModule):
        def __init__(self) -> None:
            super().__init__()
            self.w = PyroSample(dist.Normal(0.0, 1.0))
            self.child = PyroModule()
            self.child.u = PyroSample(dist.Normal(0.0, 1.0))

    layer = Layer()
    assert pyro_sample_names(layer) == ["w"]
    assert pyro_sample_names(layer.child) == ["u"]
    assert pyro_sample_names(torch.nn.Linear(2, 2)) == []
