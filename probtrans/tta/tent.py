"""``tent``: Tent (Wang et al., ICLR 2021, "Tent: Fully Test-Time Adaptation by Entropy
Minimization"), for any model.

A few gradient steps per batch minimise the mean entropy of the batch's posterior predictive
(the mean of the S sampled probability vectors, :func:`predictive_mean_entropy`) over the affine
parameters (γ, β) of every LayerNorm, all other parameters frozen; then the batch is predicted.
LayerNorm has no batch statistics to re-estimate (the Tent paper's BatchNorm has), so the
gradient steps are the whole adaptation. The LayerNorm parameters and the optimiser are reset
to the trained state before every batch, unless ``online=True``: then they carry over from
batch to batch (the order of the batches then matters) and are reset when the adaptation ends.
Tent's passes draw their attention noise from a generator forked and seeded with
``TentOptions.seed``, so the predictive draws the same noise as it would without adaptation,
and a batch adapts the same whatever came before it.
"""

from __future__ import annotations

import contextlib
from typing import Literal

import torch
from pyro import poutine
from torch import Tensor, nn

from probtrans.attention import attention_sites
from probtrans.errors import ProbtransError
from probtrans.inference.objective import self_guided
from probtrans.inference.predictive import is_point_mass
from probtrans.internals.pyro import pyro_sample_names
from probtrans.runtime.caller_state import local_params
from probtrans.specs.base import NonNegativeInt, Positive, PositiveInt, Spec
from probtrans.tta.method import AdaptationMethod, register_adaptation


class TentOptions(Spec):
    """Tent: entropy minimisation over the LayerNorm affine parameters, per batch.

    The defaults are those that ``benchmarks/adaptation.py --tune`` chose on the digits
    validation split (never the test split) under the digits-C corruptions, for the
    Gaussian-mixture and H-STO models together (the rule of
    :class:`~probtrans.tta.em.EmOptions`): one Adam step of learning rate 10⁻³. Larger steps or
    more of them lowered accuracy at severities 4–5.
    """

    method: Literal["tent"] = "tent"
    steps: PositiveInt = 1
    """Gradient steps per batch."""
    lr: Positive = 1e-3
    """Learning rate."""
    optimizer: Literal["adam", "sgd"] = "adam"
    """Adam (Tent's choice on CIFAR) or SGD with momentum 0.9 (its choice on ImageNet)."""
    online: bool = False
    """Carry the adapted parameters and the optimiser's state over from batch to batch (reset
    when the adaptation ends); False: every batch starts from the trained state."""
    samples: PositiveInt | None = None
    """Posterior draws (or local-noise replicas) in the predictive whose entropy is minimised;
    None: those of the predictive. A pass holds ``samples`` × the batch's rows, with gradients."""
    seed: NonNegativeInt = 0
    """Seed of the attention noise Tent's own passes draw (the caller's generator is kept)."""


def layer_norm_parameters(classifier: nn.Module) -> list[nn.Parameter]:
    """The affine parameters (γ, β) of every LayerNorm of ``classifier``, which Tent adapts; an
    error where there are none, or where they carry priors (random weights: the draws of a
    guide, not parameters)."""
    norms = [m for m in classifier.modules() if isinstance(m, nn.LayerNorm)]
    drawn = [name for m in norms for name in pyro_sample_names(m)]
    if drawn:
        raise ProbtransError(
            "test-time adaptation 'tent' adapts the LayerNorm parameters, and this model's "
            "LayerNorm weights carry priors ([model.prior] weights = 'all'): use a model with "
            "priors on the last layer only"
        )
    parameters = [p for m in norms for p in m.parameters(recurse=False)]
    if not parameters:
        raise ProbtransError(
            "test-time adaptation 'tent' adapts the LayerNorm affine parameters, and this model "
            "has none"
        )
    return parameters


def _rows(inputs: Tensor, mask: Tensor | None, replicas: int, device: torch.device | str):
    rows = inputs.repeat(replicas, *[1] * (inputs.dim() - 1)).to(device)
    return rows, None if mask is None else mask.repeat(replicas, 1).to(device)


def predictive_mean_entropy(
    classifier: nn.Module,
    inputs: Tensor,
    mask: Tensor | None,
    draws: dict[str, Tensor],
    samples: int,
    device: torch.device | str = "cpu",
) -> Tensor:
    """The mean over the batch of the entropy of the posterior predictive
    p(y | x) = (1/S) Σ_s p(y | x, W_s, â_s), differentiable: what Tent minimises (a scalar).

    S passes of the draws (site → (S, ...)), or one pass of ``samples`` replicas of the batch
    when the draws are all equal and the model has local randomness, as
    :func:`probtrans.inference.predictive.sample_predictive` draws them."""
    model = self_guided(classifier)
    n = len(inputs)
    if is_point_mass(draws):
        local = bool(attention_sites(classifier))
        passes = [(0, samples if local else 1)]
    else:
        passes = [(s, 1) for s in range(samples)]
    total: Tensor | float = 0.0
    for s, replicas in passes:
        data = {name: value[s].to(device) for name, value in draws.items()}
        rows, rows_mask = _rows(inputs, mask, replicas, device)
        trace = poutine.trace(poutine.condition(model, data=data)).get_trace(rows, rows_mask)
        probs = trace.nodes["probs"]["value"]
        total = total + probs.reshape(replicas, n, -1).sum(0)
    mean = total / sum(replicas for _, replicas in passes)
    return -torch.xlogy(mean, mean).sum(-1).mean()


@register_adaptation
class Tent(AdaptationMethod):
    """The LayerNorm parameters stepped down the batch's predictive entropy before each batch."""

    name = "tent"
    options_class = TentOptions

    def check(self) -> None:
        self.parameters = layer_norm_parameters(self.classifier)
        self._optimiser: torch.optim.Optimizer | None = None

    def enter(self, stack: contextlib.ExitStack) -> None:
        everything = list(self.classifier.parameters())
        flags = [p.requires_grad for p in everything]
        grads = [p.grad for p in self.parameters]
        trained = [p.detach().clone() for p in self.parameters]

        def restore() -> None:
            with torch.no_grad():
                for p, value, grad in zip(self.parameters, trained, grads, strict=True):
                    p.copy_(value)
                    p.grad = grad
            for p, flag in zip(everything, flags, strict=True):
                p.requires_grad_(flag)
            self._optimiser = None

        stack.callback(restore)
        for p in everything:
            p.requires_grad_(False)
        for p in self.parameters:
            p.requires_grad_(True)
        self._trained = trained

    def adapt(
        self,
        inputs: Tensor,
        mask: Tensor | None,
        draws: dict[str, Tensor],
        samples: int,
        device: torch.device | str = "cpu",
    ) -> None:
        """Tent's gradient steps on the batch (from the trained state unless ``online``)."""
        options = self.options
        if not options.online or self._optimiser is None:
            with torch.no_grad():
                for p, value in zip(self.parameters, self._trained, strict=True):
                    p.copy_(value)
            self._optimiser = self._new_optimiser()
        if options.samples is not None:
            samples = min(samples, options.samples)
            if not is_point_mass(draws):
                draws = {name: value[:samples] for name, value in draws.items()}
        was_training = self.classifier.training
        self.classifier.eval()
        gpus = [torch.device(device).index or 0] if torch.device(device).type == "cuda" else []
        try:
            with torch.enable_grad(), local_params(), torch.random.fork_rng(devices=gpus):
                torch.manual_seed(options.seed)
                for _ in range(options.steps):
                    loss = predictive_mean_entropy(
                        self.classifier, inputs, mask, draws, samples, device
                    )
                    self._optimiser.zero_grad(set_to_none=True)
                    loss.backward()
                    self._optimiser.step()
        finally:
            self.classifier.train(was_training)

    def _new_optimiser(self) -> torch.optim.Optimizer:
        if self.options.optimizer == "adam":
            return torch.optim.Adam(self.parameters, lr=self.options.lr)
        return torch.optim.SGD(self.parameters, lr=self.options.lr, momentum=0.9)
