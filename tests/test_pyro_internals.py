"""The private Pyro internals of :mod:`probtrans.internals.pyro`: checked against the Pyro
versions listed there, and each still behaving as probtrans uses it."""

from __future__ import annotations

import copy
import pickle

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule, PyroParam, PyroSample

from probtrans.internals.pyro import (
    CHECKED_PYRO_VERSIONS,
    ParamsUnsent,
    frozen_parameters_unwarned,
    handler_stack,
    is_prototype_block,
    particle_loss,
    particle_traces,
    pyro_sample_names,
    quiet_reads,
)
from probtrans.runtime.caller_state import local_params


def test_the_installed_pyro_is_a_checked_version():
    assert pyro.__version__ in CHECKED_PYRO_VERSIONS, (
        f"pyro {pyro.__version__} is not among the versions probtrans's private Pyro internals "
        f"were checked against ({', '.join(CHECKED_PYRO_VERSIONS)}): re-check each function of "
        f"probtrans/internals/pyro.py against this version's source (_PYRO_STACK, "
        f"prototype_hide_fn, ELBO._get_traces and _differentiable_loss_particle, "
        f"PyroModule._pyro_samples, PyroModule.__getattr__'s param messages and "
        f"_pyro_name, _pyro_context), run this file, then add the version to "
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
    torch.testing.assert_close(torch.as_tensor(loss, dtype=torch.float32), expected.detach())
    for pair in traces:  # Pyro's own particle loss: the same numbers, to the last bit
        (loss, surrogate), (pyros, pyros_surrogate) = (
            particle_loss(elbo, *pair),
            elbo._differentiable_loss_particle(*pair),
        )
        assert float(loss) == float(pyros)
        assert torch.equal(torch.as_tensor(surrogate), torch.as_tensor(pyros_surrogate))


def test_a_trace_elbos_particle_loss_reads_nothing_back_unless_a_guide_site_needs_a_score():
    """Trace_ELBO's own particle loss reads every site's log-density back (``.item()``: a wait
    for a GPU); with reparameterised guide sites :func:`particle_loss` reads none. A guide site
    with a score-function term (a Bernoulli) takes Pyro's own computation."""

    def model_with_a_coin() -> None:
        model()
        pyro.sample("coin", dist.Bernoulli(0.3))

    def guide_with_a_coin() -> None:
        guide()
        pyro.sample("coin", dist.Bernoulli(0.6))

    guide = AutoNormal(model)
    guide()
    elbo = Trace_ELBO()
    ((model_trace, guide_trace),) = particle_traces(elbo, model, guide, (), {})
    reads = []
    item = torch.Tensor.item

    def counted(tensor: torch.Tensor):
        reads.append(tensor)
        return item(tensor)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.Tensor, "item", counted)
        loss, _ = particle_loss(elbo, model_trace, guide_trace)
        assert torch.is_tensor(loss) and not reads
        ((model_trace, guide_trace),) = particle_traces(
            elbo, model_with_a_coin, guide_with_a_coin, (), {}
        )
        loss, _ = particle_loss(elbo, model_trace, guide_trace)
        assert isinstance(loss, float) and reads


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


class Net(PyroModule):
    """A parameter, a buffer, a Pyro submodule with a PyroSample, a plain submodule and a
    PyroParam: every kind of read PyroModule.__getattr__ treats apart."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor([0.5, -1.0]))
        self.register_buffer("b", torch.tensor([2.0, 3.0]))
        self.inner = PyroModule[torch.nn.Linear](2, 2)
        self.inner.bias = PyroSample(dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        self.plain = torch.nn.Linear(2, 1)
        self.positive = PyroParam(torch.tensor(2.0), constraint=dist.constraints.positive)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.plain(self.inner(x * self.a + self.b)).sum() * self.positive


class Messages(poutine.messenger.Messenger):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str]] = []

    def _process_message(self, msg: dict) -> None:
        self.seen.append((msg["type"], msg["name"]))


def run(net: Net, unsent: bool) -> tuple[torch.Tensor, list, poutine.Trace]:
    """net(x) under a trace and a param block (ParamsUnsent or Pyro's own), with a handler
    inside the block recording the messages that reach it."""
    x = torch.tensor([[1.0, 2.0]])
    block = ParamsUnsent() if unsent else poutine.block(hide_types=["param"])
    pyro.set_rng_seed(0)
    with poutine.trace() as tape, block, Messages() as inside:
        out = net(x)
    return out, inside.seen, tape.trace


@pytest.mark.parametrize("module_local", [True, False])
def test_quiet_modules_send_no_param_message_inside_params_unsent_and_compute_the_same(
    module_local,
):
    """Inside ParamsUnsent a quiet module's nn.Parameter reads send nothing (handlers inside
    the block saw them before); the PyroParam read and the PyroSample site still go through
    Pyro, and the value and the gradients are the same. Outside it, nothing changes."""
    pyro.clear_param_store()
    with pyro.settings.context(module_local_params=module_local):
        net = Net()
        loud_out, loud_seen, loud_trace = run(net, unsent=False)
        loud_grads = torch.autograd.grad(loud_out, list(net.parameters()))
        quiet_reads(net)
        assert type(net.plain) is torch.nn.Linear  # not a PyroModule: left as it is
        out, seen, trace = run(net, unsent=True)
        grads = torch.autograd.grad(out, list(net.parameters()))
        outside = run(net, unsent=False)
    loud_params = {name.replace("$$$", ".") for kind, name in loud_seen if kind == "param"}
    assert {"a", "inner.weight", "plain.weight", "plain.bias", "positive"} <= loud_params
    assert [name for kind, name in seen if kind == "param"] == ["positive"]  # the PyroParam
    assert [name for kind, name in seen if kind == "sample"] == ["inner.bias"]
    assert list(trace.nodes) == list(loud_trace.nodes) == ["inner.bias"]
    assert torch.equal(out, loud_out)
    for g, loud in zip(grads, loud_grads, strict=True):
        assert torch.equal(g, loud)
    assert outside[1] == loud_seen and torch.equal(outside[0], loud_out)


def test_a_quiet_module_pickles_and_copies_as_the_module_it_was():
    with local_params():
        net = Net()
        quiet_reads(net)
        quiet_reads(net)  # made quiet once: its class is not wrapped again
        assert type(net).__bases__[0] is Net
        assert type(net.inner).__bases__[0] is PyroModule[torch.nn.Linear]
        for copied in (copy.deepcopy(net), pickle.loads(pickle.dumps(net))):
            assert type(copied) is Net
            assert type(copied.inner) is PyroModule[torch.nn.Linear]
            state, expected = copied.state_dict(), net.state_dict()
            assert all(torch.equal(state[k], expected[k]) for k in expected)


def test_pyro_module_warns_for_each_frozen_parameter_and_the_block_hides_only_that():
    """``pyro.module`` (what a ``PyroModule`` calls on a plain submodule under the global param
    store) warns once per parameter with requires_grad=False of a training module, in the text
    :data:`FROZEN_PARAMETER_WARNING` matches; inside :func:`frozen_parameters_unwarned` those
    are not shown, any other warning is, and the trainable parameter is registered either way."""
    import warnings

    layer = torch.nn.Linear(2, 2)
    layer.weight.requires_grad_(False)
    pyro.clear_param_store()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pyro.module("layer", layer)
        with frozen_parameters_unwarned():
            pyro.module("layer", layer)
            warnings.warn("another warning", stacklevel=1)
    assert [str(w.message) for w in caught] == [
        "weight was not registered in the param store because requires_grad=False. You can "
        "silence this warning by calling my_module.train(False)",
        "another warning",
    ]
    assert list(pyro.get_param_store().keys()) == ["layer$$$bias"]
    pyro.clear_param_store()
