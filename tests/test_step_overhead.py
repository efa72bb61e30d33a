"""The training step sends Pyro only what the ELBO reads (``ElboObjective``: no ``param``
messages past the model and the guide, no output sites; ``SVITraining.training_loss``: Pyro's
checks of the model and guide made on the first batch, not in every step) and still gives the
loss and the gradients of Pyro's own Trace_ELBO step, to the last bit."""

from __future__ import annotations

import warnings
from pathlib import Path

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import Trace_ELBO
from pyro.poutine.messenger import Messenger
from torch.testing import assert_close

from probtrans.classifier import build_classifier
from probtrans.inference.objective import self_guided
from probtrans.inference.train import SVITraining
from probtrans.resolve import load_inference_spec, load_model_spec
from probtrans.runtime.caller_state import local_params
from probtrans.specs import updated
from tests.conftest import tiny_spec

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "models" / "digits" / "h_sto.toml"
MAP = ROOT / "inference" / "map.toml"


class SeenSites(Messenger):
    """Records (type, name) of every message that reaches it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str]] = []

    def _process_message(self, msg: dict) -> None:
        self.seen.append((msg["type"], msg["name"]))


def digits_training(digits, guide_name: str) -> SVITraining:
    """The loop's objects for the default digits model (dropout 0.1, H-STO, a prior on the
    head) and ``inference/map.toml`` with the guide ``guide_name``, the network training."""
    inference = updated(load_inference_spec(MAP), {"guide.name": guide_name}, "test")
    classifier = build_classifier(load_model_spec(DIGITS), digits)
    svi = SVITraining(classifier, digits, inference, seed=0, device="cpu")
    classifier.train()
    return svi


def gradients(params: list[torch.Tensor]) -> list[torch.Tensor]:
    grads = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    return grads


@pytest.mark.parametrize("guide_name", ["delta", "normal"])
def test_training_step_gives_the_loss_and_gradients_of_pyros_trace_elbo_step(digits, guide_name):
    with local_params():  # as train_classifier runs
        svi = digits_training(digits, guide_name)
        params = svi.optimizer.param_groups[0]["params"]
        index, inputs, mask, labels = batch = digits.train.batch(torch.arange(32))

        pyro.set_rng_seed(1)
        with SeenSites() as fast:
            loss, _ = svi.training_loss(*batch)
        loss.backward()
        fast_grads = gradients(params)

        pyro.set_rng_seed(1)  # the same dropout masks, attention noise and guide draws
        with SeenSites() as plain:
            expected = Trace_ELBO().differentiable_loss(
                self_guided(svi.classifier),
                svi.guide,
                inputs,
                mask,
                labels,
                index=index,
                n_data=len(digits.train),
            )
        expected.backward()
        plain_grads = gradients(params)

    assert_close(loss, expected, rtol=0, atol=0)
    assert len(fast_grads) == len(plain_grads) == len(params) > 10
    for fast_grad, plain_grad in zip(fast_grads, plain_grads, strict=True):
        assert_close(fast_grad, plain_grad, rtol=0, atol=0)
    # Pyro's step sends every parameter read and the output sites; the training step neither
    for seen, shown in ((plain.seen, True), (fast.seen, False)):
        assert (("param", "encoder.layers.0.ln1.weight") in seen) is shown
        assert (("sample", "probs") in seen) is shown
        assert (("sample", "obs") in seen) is True


def test_pyros_checks_are_made_on_the_first_batch_and_not_repeated_in_every_step(digits):
    def guide(inputs, mask, labels, index=None, n_data=None):
        pyro.sample("extra", dist.Normal(0.0, 1.0))  # a site the model does not have

    classifier = build_classifier(tiny_spec("h_sto"), digits)
    inference = load_inference_spec(MAP)
    with local_params():
        svi = SVITraining(classifier, digits, inference, seed=0, device="cpu", guide=guide)
        with pytest.warns(UserWarning, match="guide but not model"):
            svi.loss_scale()  # before the first step of every session
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            loss, _ = svi.training_loss(*digits.train.batch(torch.arange(32)))
    assert torch.isfinite(loss)


#: the Tensor methods that read a value back to Python: on a GPU, each waits for the device
READS = ("item", "tolist", "__bool__", "__float__", "__int__")


@pytest.mark.parametrize("guide_name", ["delta", "normal"])
def test_the_training_steps_loss_reads_nothing_back_from_the_device(digits, guide_name):
    """Distribution checks (``if not valid.all()``), Pyro's ``.item()`` of every site's
    log-density and its NaN warning each make a GPU step wait for the device; the step's loss
    needs none of them (the loop reads the loss once, to stop on a diverged one). The optimiser
    reads its CPU step counters, which is no wait."""
    reads = []

    def reading(name):
        original = getattr(torch.Tensor, name)

        def read(tensor, *args):
            reads.append(name)
            return original(tensor, *args)

        return read

    with local_params():
        svi = digits_training(digits, guide_name)
        svi.loss_scale()  # Pyro's checks, on the first batch
        batch = digits.train.batch(torch.arange(32))
        with pytest.MonkeyPatch.context() as patch:
            for name in READS:
                patch.setattr(torch.Tensor, name, reading(name))
            loss, terms = svi.training_loss(*batch)
            loss.backward()
    assert reads == []
    assert torch.isfinite(loss) and terms.device.type == "cpu"
