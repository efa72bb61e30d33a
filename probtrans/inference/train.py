"""SVI training loop: ELBO, optimiser with a learning-rate schedule, KL weight and annealing,
validation after every epoch, early stopping, best-state checkpoints, divergence detection and
resumption.

Each step minimises ``elbo.differentiable_loss(model, guide, ...)`` with a PyTorch optimiser over
the classifier's and the guide's parameters (Pyro's loop for PyroModules that keep their
parameters locally; see :mod:`probtrans.contract`). The guide is the one the inference spec names,
or one given in Python (:data:`~probtrans.inference.guide_builder.GuideChoice`); a guide with a
``laplace_approximation`` (``AutoLaplaceApproximation``) is trained as MAP and then replaced by
its Laplace approximation at the best state, on the whole training set; with ``guide.head_scales =
"fixed_point"`` a mean-field guide's head scales are set at the ELBO's fixed point for their means
at the best state (:mod:`~probtrans.inference.head_variances`). With a
:class:`Resumable`, the whole training state is saved after every epoch and an interrupted fit
continues from its last finished epoch, drawing the same batches and random numbers it would have
drawn without the interruption.

History (``TrainResult.history``, a run's ``history.json``): per epoch, the means over its steps
of the ELBO per example at full weight, ``elbo`` = ``expected_log_likelihood`` − ``kl``
(E_q[log p(y | x, W)] − KL(q ‖ p); ``kl`` = ``kl_global`` + ``kl_amortised``, the weights' KL and
the per-example KL terms such as SGPA's), and of ``objective``, the annealed and weighted ELBO the
step maximised (E_q[log p(y | ·)] − a_t (β KL_global + KL_amortised)), all from the step's own
traces (:func:`~probtrans.inference.objective.loss_and_terms`); the KL annealing a_t and learning
rate of the epoch's last step; the validation metrics. The history is also written, epoch by
epoch, to the training log ``train.logger`` names (:mod:`probtrans.inference.training_log`).
After training, ``TrainResult.elbo_terms`` holds the same terms at the kept state from one pass
over the whole training set (:meth:`SVITraining.training_set_elbo`).

Divergence: a loss that is not finite, a network that produces NaN or infinite values, or a loss
per example above ``train.divergence_factor`` times its scale at the start of the fit stops
training with :class:`TrainingDiverged`, naming the epoch, the step and the likely cause; the
states saved at earlier epochs are left as they were.

Data-parallel training (:mod:`probtrans.runtime.distributed`; ``torchrun --nproc_per_node N``):
every process draws the same permutation of the training set and takes its share of each global
batch of ``train.batch_size`` rows (:meth:`~probtrans.runtime.distributed.Processes.shard`); the
loss is the module :class:`ElboObjective`, wrapped in ``DistributedDataParallel``, which averages
the gradients of the classifier's and the guide's parameters. Each process's loss is weighted by its
share of the global batch (N · b_r / B), so that the averaged gradient is exactly that of the
global batch's ELBO whatever the sizes of the shares: for a deterministic model N processes
follow the path of one process with the same batch size. The validation metric is computed by
rank 0 and shared, so every process agrees on the best epoch and on early stopping; rank 0
alone writes the resume file, which keeps every process's random state.

Precision: ``train.precision = "bf16"`` runs the model and guide under ``torch.autocast`` in
bfloat16 (the SGPA kernel and Cholesky factors stay in float32 / float64); parameters, gradients
and the optimiser stay in float32.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyro
import pyro.util
import torch
from pyro import poutine
from pyro.infer import Trace_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro.optim.clipped_adam import ClippedAdam
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from probtrans.analysis.metrics import ranked_metric
from probtrans.classifier import Classifier
from probtrans.contract import outputs_unrecorded
from probtrans.data import DataBundle
from probtrans.errors import ProbtransError
from probtrans.inference.guide_builder import (
    GuideChoice,
    build_guide,
    given_guide,
    guide_parameters,
    spread_parameters,
)
from probtrans.inference.head_variances import (
    fixed_point_guide,
    head_fixed_point,
    head_guide,
    put_head_scales,
)
from probtrans.inference.objective import (
    TERMS,
    KLWeight,
    elbo_record,
    loss_and_terms,
    make_elbo,
    self_guided,
)
from probtrans.inference.predictive import sample_predictive
from probtrans.inference.training_log import open_log
from probtrans.internals.pyro import ParamsUnsent, quiet_reads
from probtrans.runtime.caller_state import caller_random_state, local_params
from probtrans.runtime.distributed import Processes, current
from probtrans.runtime.progress import progress_bar
from probtrans.specs import InferenceSpec, OptimSpec
from probtrans.storage.checkpoint import load_checkpoint, require, save_checkpoint

#: keys of the resume file besides :class:`TrainingState`'s: the objects
#: :meth:`SVITraining.stateful` returns
STATEFUL_KEYS = ("model_state", "guide_state", "optimizer", "schedule", "generator", "rng")


@dataclass
class BestState:
    """The classifier and guide at the epoch with the best validation metric."""

    model_state: dict
    guide_state: dict
    epoch: int
    val_metric: float


@dataclass
class TrainingState:
    """Where a fit stands after an epoch. Its fields and the keys of
    :meth:`SVITraining.stateful` are the keys of the resume file."""

    epoch: int = 0
    stopped: bool = False  # early stopping ended the fit
    bad_epochs: int = 0  # epochs since the best one
    seconds: float = 0.0  # training time, summed over resumed sessions
    epoch_seconds: list[float] = field(default_factory=list)  # wall time of each epoch
    history: list[dict] = field(default_factory=list)  # one record per epoch
    best: BestState | None = None

    def as_dict(self) -> dict[str, Any]:
        state = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {**state, "best": None if self.best is None else vars(self.best)}

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> TrainingState:
        state = {f.name: saved[f.name] for f in dataclasses.fields(cls)}
        best = None if state["best"] is None else BestState(**state["best"])
        return cls(**{**state, "best": best})


@dataclass
class TrainResult:
    guide: Callable
    history: list[dict]
    best: BestState
    seconds: float  # training time, summed over resumed sessions
    epoch_seconds: list[float]  # wall time of each epoch (training, validation, checkpoint)
    elbo_terms: dict[str, float]  # at the best state: SVITraining.training_set_elbo


@dataclass
class Resumable:
    """A file where :func:`fit` saves its whole state after every epoch, and the identity
    (e.g. specs, seed, epochs) that a saved state must match to be continued.

    ``saved`` is the state found in the file when it was opened, or None when there is none or it
    belongs to another fit. A file that cannot be read, or lacks part of the state, raises
    :class:`~probtrans.storage.checkpoint.UnreadableCheckpoint`.
    """

    path: Path
    identity: dict[str, Any]
    saved: dict[str, Any] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.path.is_file():
            state = load_checkpoint(self.path)
            keys = ["identity", *(f.name for f in dataclasses.fields(TrainingState))]
            require(state, self.path, [*keys, *STATEFUL_KEYS])
            if state["identity"] == self.identity:
                self.saved = state

    def save(self, state: dict[str, Any]) -> None:
        save_checkpoint(self.path, {"identity": self.identity, **state})


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


class TrainingDiverged(ProbtransError):
    """Training stopped because the loss or the network's values ran away."""

    def __init__(self, epoch: int, step: int, steps: int, what: str, spec: InferenceSpec) -> None:
        super().__init__(
            f"training diverged at epoch {epoch}, step {step} of {steps}: {what}. The likely "
            f"cause is a learning rate too high for this model (optim.lr = {spec.optim.lr:g}); "
            f"lower it (or raise train.batch_size, use optim.name = 'clipped_adam') and fit again"
        )


class ParamsState:
    """Named parameter tensors (a hand-written guide's, in the param store) as a
    :class:`Stateful`; loading copies the values in place, so optimisers keep their tensors."""

    def __init__(self, params: dict[str, Tensor]) -> None:
        self.params = params

    def state_dict(self) -> dict[str, Tensor]:
        return {name: p.detach().clone() for name, p in self.params.items()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        with torch.no_grad():
            for name, p in self.params.items():
                p.copy_(state[name])


class GeneratorState:
    """A ``torch.Generator`` (the batch order) as a :class:`Stateful`."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def state_dict(self) -> torch.Tensor:
        return self.generator.get_state()

    def load_state_dict(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)


class GlobalRNGState:
    """Pyro's torch / random / numpy generators as a :class:`Stateful` of plain data (numpy's
    keys as a tensor), so that the resume file loads with ``weights_only``."""

    def state_dict(self) -> dict[str, Any]:
        state = pyro.util.get_rng_state()
        name, keys, *rest = state["numpy"]
        return {**state, "numpy": (name, torch.from_numpy(keys.astype(np.int64)), *rest)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        name, keys, *rest = state["numpy"]
        pyro.util.set_rng_state({**state, "numpy": (name, keys.numpy().astype(np.uint32), *rest)})


def make_optimizer(
    spec: OptimSpec, params: list[torch.nn.Parameter] | list[dict], total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """Adam, AdamW or Pyro's ClippedAdam over ``params`` (or parameter groups, each with its
    own ``lr``), and a per-step schedule of every group's rate: a linear warm-up over the first
    ``warmup`` fraction of ``total_steps``, then constant, cosine or linear decay to 0 over the
    rest, or exponential."""
    if spec.name == "clipped_adam":
        optimizer = ClippedAdam(
            params, lr=spec.lr, weight_decay=spec.weight_decay, clip_norm=spec.clip_norm
        )
    else:
        kind = torch.optim.AdamW if spec.name == "adamw" else torch.optim.Adam
        optimizer = kind(params, lr=spec.lr, weight_decay=spec.weight_decay)
    warmup = int(spec.warmup * total_steps)

    def factor(step: int) -> float:
        if step < warmup:  # from 0, as transformers' get_linear_schedule_with_warmup
            return step / warmup
        done = min(step - warmup, total_steps - warmup) / max(total_steps - warmup, 1)
        if spec.schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * done))
        if spec.schedule == "linear":
            return 1.0 - done
        if spec.schedule == "exponential":
            return spec.gamma ** (step - warmup)
        return 1.0

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def kl_annealing_at(spec: InferenceSpec, epoch_progress: float) -> float:
    """Factor on every KL term after ``epoch_progress`` epochs: linear from 0 to 1 over
    ``kl_anneal_epochs`` (always 1 without annealing)."""
    if spec.elbo.kl_anneal_epochs == 0:
        return 1.0
    return min(1.0, epoch_progress / spec.elbo.kl_anneal_epochs)


def improves(value: float, best: BestState | None, monitor: str) -> bool:
    """Whether a validation ``monitor`` value beats the best state (higher or lower, as the
    metric's registration says)."""
    if best is None:
        return True
    higher = ranked_metric(monitor, "train.monitor").higher_is_better
    return value > best.val_metric if higher else value < best.val_metric


def validation_metric(
    classifier: Classifier, guide: Callable, data: DataBundle, spec: InferenceSpec, device: str
) -> dict[str, float]:
    probs = sample_predictive(
        classifier, guide, data.val, spec.train.val_samples, spec.predictive.batch_size, device
    )["probs"]
    labels = data.val.labels.numpy()
    names = dict.fromkeys(["accuracy", "mcc", "nll", spec.train.monitor])  # the curves, monitor
    return {
        f"val_{name}": ranked_metric(name, "train.monitor").function(probs, labels)
        for name in names
    }


class ElboObjective(nn.Module):
    """The negative ELBO of a batch as a module that holds everything it trains: the classifier
    and the guide (a module); what ``DistributedDataParallel`` wraps, as Pyro's ``ELBOModule``.

    It sends Pyro's handlers only what the ELBO reads. The ``param`` messages of the model and
    the guide (one per parameter a ``PyroModule`` reads, tens per step; their parameters are
    trained from ``.parameters()``, not from a trace) stop at a block around each, and inside
    it the classifier's modules read their parameters without sending them
    (:class:`~probtrans.internals.pyro.ParamsUnsent`). The classifier skips its output sites
    (:func:`~probtrans.contract.outputs_unrecorded`). The loss and its gradients are those of
    the model and guide without them."""

    def __init__(
        self,
        classifier: Classifier,
        guide: Callable,
        kl_weight: KLWeight,
        elbo: Trace_ELBO,
        n_data: int,
    ) -> None:
        super().__init__()
        self.classifier = classifier
        self.guide = guide if isinstance(guide, nn.Module) else None
        quiet_reads(classifier)  # a guide passed in keeps its class
        self.model = kl_weight(ParamsUnsent()(self_guided(classifier)))
        self.weighted_guide = kl_weight(poutine.block(guide, hide_types=["param"]))
        self.elbo, self.n_data = elbo, n_data

    def forward(
        self, index: Tensor, inputs: Tensor, mask: Tensor | None, labels: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The negative (weighted, annealed) ELBO of the batch for a training set of ``n_data``
        rows (the plate scales the likelihood by n_data / B), and the ELBO's terms of the same
        traces at full weight (:func:`~probtrans.inference.objective.loss_and_terms`)."""
        with outputs_unrecorded():
            return loss_and_terms(
                self.elbo,
                self.model,
                self.weighted_guide,
                inputs,
                mask,
                labels,
                index=index,
                n_data=self.n_data,
            )


class SVITraining:
    """The objects of one fit: self-guided model, guide, KL weight, ELBO (:class:`ElboObjective`,
    under ``DistributedDataParallel`` across processes), optimiser, schedule and the generator of
    the batch order."""

    def __init__(
        self,
        classifier: Classifier,
        data: DataBundle,
        spec: InferenceSpec,
        seed: int,
        device: str,
        guide: GuideChoice | None = None,
        processes: Processes | None = None,
    ) -> None:
        self.classifier, self.data, self.spec, self.device = classifier, data, spec, device
        self.processes = current() if processes is None else processes
        if guide is None:
            self.guide = build_guide(classifier, spec.guide, data.train, device)
        else:
            self.guide = given_guide(classifier, guide, data.train, device)
        guide_params = guide_parameters(classifier, self.guide, data.train, device)
        self.guide_state: Stateful = (
            self.guide if isinstance(self.guide, torch.nn.Module) else ParamsState(guide_params)
        )
        n_train = len(data.train)
        self.kl_weight = KLWeight.from_spec(spec.elbo, classifier, n_train)
        elbo = make_elbo(spec.elbo)
        self.objective = ElboObjective(classifier, self.guide, self.kl_weight, elbo, n_train)
        self.step_loss: nn.Module = self.objective
        if self.processes.distributed:
            self.step_loss = self.data_parallel(guide_params)
        self.steps_per_epoch = math.ceil(n_train / spec.train.batch_size)
        params = [*classifier.parameters(), *guide_params.values()]
        pretrained = classifier.pretrained_parameters() if spec.optim.backbone_lr else []
        spread = spread_parameters(self.guide) if spec.optim.scale_lr else []
        apart = {id(p) for p in [*pretrained, *spread]}  # their own rates
        groups = [{"params": [p for p in params if id(p) not in apart]}]
        if pretrained:
            groups.append({"params": pretrained, "lr": spec.optim.backbone_lr})
        if spread:
            groups.append({"params": spread, "lr": spec.optim.scale_lr})
        total = spec.train.epochs * self.steps_per_epoch
        self.optimizer, self.schedule = make_optimizer(spec.optim, groups, total)
        self.generator = torch.Generator().manual_seed(seed)

    def data_parallel(self, guide_params: dict[str, Tensor]) -> DistributedDataParallel:
        """The objective under ``DistributedDataParallel``, which averages the gradients of every
        parameter it holds across processes: the guide's must be in modules."""
        held = {id(p) for p in self.objective.parameters()}
        outside = [name for name, p in guide_params.items() if id(p) not in held]
        if outside:
            raise ProbtransError(
                f"data-parallel training: the guide's parameters {outside[:3]} are pyro.param "
                f"statements in the global param store, which DistributedDataParallel cannot "
                f"average; write the guide as a PyroModule (or use an autoguide) to train it on "
                f"several processes"
            )
        if self.spec.train.batch_size < self.processes.size:
            raise ProbtransError(
                f"train.batch_size = {self.spec.train.batch_size}: smaller than the "
                f"{self.processes.size} processes; each process needs rows of every batch"
            )
        on_gpu = torch.device(self.device).type == "cuda"
        return DistributedDataParallel(
            self.objective,
            device_ids=[torch.cuda.current_device()] if on_gpu else None,
            find_unused_parameters=self.has_unused_parameters(),
        )

    def has_unused_parameters(self) -> bool:
        """Whether a training step leaves a parameter without a gradient (e.g. one that only
        the predictive uses), found by one step on two training rows; leaves the gradients and
        every random generator as they were."""
        rng = pyro.util.get_rng_state()
        params = [p for p in self.objective.parameters() if p.requires_grad]
        try:
            self.loss(*next(self.data.train.batches(2)))[0].backward()
            return any(p.grad is None for p in params)
        finally:
            for p in params:
                p.grad = None
            pyro.util.set_rng_state(rng)

    def stateful(self) -> dict[str, Stateful]:
        """Everything with a state that changes during training, by its key in the resume file."""
        objects = (
            self.classifier,
            self.guide_state,
            self.optimizer,
            self.schedule,
            GeneratorState(self.generator),
            GlobalRNGState(),
        )
        return dict(zip(STATEFUL_KEYS, objects, strict=True))

    def to_device(self, tensor: Tensor) -> Tensor:
        """A batch tensor on the training device; to a GPU through pinned memory, asynchronously."""
        if torch.device(self.device).type != "cuda":
            return tensor
        return tensor.pin_memory().to(self.device, non_blocking=True)

    def loss(
        self,
        index: Tensor,
        inputs: Tensor,
        mask: Tensor | None,
        labels: Tensor,
        objective: nn.Module | None = None,
    ) -> tuple[Tensor, Tensor]:
        """The negative ELBO of a batch and its terms (see :class:`ElboObjective`), for the whole
        training set (the plate scales them), by ``objective`` (default: the objective without
        ``DistributedDataParallel``), in the spec's precision."""
        batch = [None if t is None else self.to_device(t) for t in (index, inputs, mask, labels)]
        autocast = torch.autocast(
            torch.device(self.device).type,
            dtype=torch.bfloat16,
            enabled=self.spec.train.precision == "bf16",
        )
        with autocast:
            return (objective or self.objective)(*batch)

    def training_loss(
        self, index: Tensor, inputs: Tensor, mask: Tensor | None, labels: Tensor
    ) -> tuple[Tensor, Tensor]:
        """:meth:`loss` as a training step computes it: by the step's objective (under
        ``DistributedDataParallel`` across processes), without Pyro's checks of the model, the
        guide and the distributions' arguments (their sites match and have the right shapes,
        every log-density and parameter is finite, module-local parameters): :meth:`loss_scale`
        makes them on the first batch before the first step of every session, and a loss that is
        not finite (a network that produces NaN) stops training (:class:`TrainingDiverged`).
        Each check of a value reads it back from the device, a wait for a GPU per distribution;
        the step reads one number, the loss. The same loss and gradients as with the checks."""
        with pyro.settings.context(
            validate_infer=False,
            validate_poutine=False,
            validate_distributions_pyro=False,
            validate_distributions_torch=False,
        ):
            return self.loss(index, inputs, mask, labels, objective=self.step_loss)

    @torch.no_grad()
    def loss_scale(self) -> float:
        """The size of the loss per example at the current state: that of the first training
        batch with every KL term at full weight (so that KL annealing cannot exceed it), at
        least 1 nat. Leaves every random generator as it was."""
        rng, annealing = pyro.util.get_rng_state(), self.kl_weight.annealing
        self.kl_weight.annealing = 1.0
        try:
            batch = next(self.data.train.batches(self.spec.train.batch_size))
            value = self.loss(*batch)[0].item() / len(self.data.train)
        finally:
            self.kl_weight.annealing = annealing
            pyro.util.set_rng_state(rng)
        return max(1.0, abs(value)) if math.isfinite(value) else 1.0

    def epoch(self, epoch: int, progress: bool, limit: float = math.inf) -> dict[str, float]:
        """One pass over the shuffled training data; returns the epoch's training record: the
        means over its steps of the ELBO and its terms per example (:func:`elbo_record`) and of
        the ``objective`` per example (−loss / N), the KL annealing and learning rate of its last
        step. Raises :class:`TrainingDiverged` when the loss per example is not finite (the
        network's values are not) or exceeds ``limit``."""
        n_train, train, processes = len(self.data.train), self.spec.train, self.processes
        self.classifier.train()
        batches = self.data.train.batch_indices(
            train.batch_size,
            shuffle=True,
            generator=self.generator,
            by_length=train.group_by_length,
        )
        bar = progress_bar(
            batches,
            total=self.steps_per_epoch,
            desc=f"epoch {epoch}",
            unit="step",
            leave=False,
            disable=not progress,
        )
        total, total_terms, lr = 0.0, torch.zeros(len(TERMS), dtype=torch.float64), math.nan
        for step, index in enumerate(bar):
            self.kl_weight.annealing = kl_annealing_at(
                self.spec, epoch - 1 + step / self.steps_per_epoch
            )
            self.optimizer.zero_grad()
            part = processes.shard(index)
            share = len(part) / len(index)  # of the global batch; 0 for a part left empty
            batch = self.data.train.batch(part if len(part) else index[:1])
            loss, terms = self.training_loss(*batch)
            loss = loss * (processes.size * share)
            weighted = torch.tensor([loss.item() / processes.size], dtype=torch.float64)
            summed = processes.sum(torch.cat([weighted, terms * share]))  # the global batch's
            value = summed[0].item()
            per_example = value / n_train
            if not per_example <= limit:  # also NaN: the network's values, or an overflow
                what = f"the loss per example is {per_example:.4g} (limit {limit:.4g})"
                raise TrainingDiverged(epoch, step + 1, self.steps_per_epoch, what, self.spec)
            loss.backward()
            lr = self.optimizer.param_groups[0]["lr"]
            self.optimizer.step()
            self.schedule.step()
            total += value
            total_terms += summed[1:]
        self.classifier.eval()
        mean_terms = total_terms / self.steps_per_epoch / n_train
        return {
            **elbo_record(mean_terms.tolist()),
            "objective": -total / self.steps_per_epoch / n_train,
            "kl_annealing": self.kl_weight.annealing,
            "lr": lr,
        }

    @torch.no_grad()
    def training_set_elbo(self, seed: int) -> dict[str, float]:
        """The ELBO per example and its terms (:func:`elbo_record`) at the current state, at full
        weight (unannealed, β = 1), from one pass over the whole training set in batches of
        ``train.batch_size`` rows, in order, each batch's estimate weighted by its rows, the
        network in evaluation mode (no dropout, as the predictive runs it). The draws are those
        of ``seed``; every random generator is left as it was."""
        n_train, rng = len(self.data.train), pyro.util.get_rng_state()
        self.classifier.eval()
        mean = torch.zeros(len(TERMS), dtype=torch.float64)
        try:
            pyro.set_rng_seed(seed)
            for batch in self.data.train.batches(self.spec.train.batch_size):
                per_example = self.loss(*batch)[1] / n_train  # this batch's estimate
                mean += per_example * (len(batch[0]) / n_train)
        finally:
            pyro.util.set_rng_state(rng)
        return elbo_record(mean.tolist())

    def best_state(self, epoch: int, value: float) -> BestState:
        return BestState(
            copy.deepcopy(self.classifier.state_dict()),
            copy.deepcopy(self.guide_state.state_dict()),
            epoch,
            value,
        )


@local_params()
@caller_random_state()
def train_classifier(
    classifier: Classifier,
    data: DataBundle,
    spec: InferenceSpec,
    *,
    seed: int = 0,
    device: str = "cpu",
    on_improve: Callable[[BestState, Callable], None] | None = None,
    resumable: Resumable | None = None,
    progress: bool = True,
    guide: GuideChoice | None = None,
    log_dir: Path | None = None,
) -> TrainResult:
    """Train ``classifier`` on ``data.train`` by SVI; keep the best state on validation.

    ``guide``: a guide given in Python instead of the one ``spec`` names. ``on_improve`` is
    called with every new best state and the guide (e.g. to write a checkpoint). With
    ``resumable``, the state is saved there after every epoch, and a matching saved state is
    continued instead of starting over. ``log_dir``: the run folder that gets the training log
    ``spec.train.logger`` names (:mod:`probtrans.inference.training_log`); none without it.
    The result's ``elbo_terms`` are those of :meth:`SVITraining.training_set_elbo` at the best
    state (before a Laplace approximation), with the draws of ``seed``. Seeded by ``seed``
    (each process by ``seed`` and its rank); the caller's random state is restored on return
    (:func:`~probtrans.runtime.caller_state.caller_random_state`).

    In a process group (:func:`probtrans.runtime.distributed.current`), every process calls this
    with the same arguments; rank 0's ``resumable``, ``on_improve`` and ``log_dir`` are used and the
    others' are ignored (see the module docstring).
    """
    processes = current()
    pyro.set_rng_seed(seed)
    classifier.to(device)
    classifier.paths = spec.paths.model_dump()  # the spec's [paths] overrides, in every call
    svi = SVITraining(classifier, data, spec, seed, device, guide, processes)
    head_part = None
    if spec.guide.head_scales == "fixed_point":  # checked before anything trains
        head_part = fixed_point_guide(
            classifier, svi.guide, spec.elbo.kl_weight, f"{spec.file}: guide.head_scales"
        )
    if spec.predictive.head_draws > 1:
        setting = f"{spec.file}: predictive.head_draws = {spec.predictive.head_draws}"
        head_guide(classifier, svi.guide, f"{setting} (else use 1)")
    state = TrainingState()
    saved = processes.share(lambda: None if resumable is None else resumable.saved)
    if saved is not None:
        state = TrainingState.from_dict(saved)
        for key, stateful in svi.stateful().items():
            rng = key == "rng" and processes.distributed  # one random state per process
            stateful.load_state_dict(saved[key][processes.rank] if rng else saved[key])
    limit = spec.train.divergence_factor * svi.loss_scale()
    if saved is None and not processes.is_main:  # its own attention noise and posterior draws
        pyro.set_rng_seed(int(np.random.SeedSequence((seed, processes.rank)).generate_state(1)[0]))
    last = state.epoch if state.stopped else spec.train.epochs
    monitor = f"val_{spec.train.monitor}"
    progress = progress and processes.is_main
    bar = progress_bar(
        range(state.epoch + 1, last + 1),
        desc="SVI",
        unit="epoch",
        initial=state.epoch,
        total=last,
        disable=not progress,
    )
    log = open_log(spec.train.logger, log_dir if processes.is_main else None, state.epoch + 1)
    with log:
        for epoch in bar:
            started = time.perf_counter()
            record = {"epoch": epoch, **svi.epoch(epoch, progress, limit)}
            record.update(
                processes.share(
                    lambda: validation_metric(classifier, svi.guide, data, spec, device)
                )
            )
            state.history.append(record)
            value = record[monitor]
            if improves(value, state.best, spec.train.monitor):
                state.best, state.bad_epochs = svi.best_state(epoch, value), 0
                if on_improve is not None and processes.is_main:
                    on_improve(state.best, svi.guide)
            else:
                state.bad_epochs += 1
            bar.set_postfix(elbo=f"{record['elbo']:.3f}", **{monitor: f"{value:.4f}"})
            state.epoch = epoch
            state.stopped = bool(spec.train.patience) and state.bad_epochs >= spec.train.patience
            seconds = time.perf_counter() - started
            state.seconds += seconds
            state.epoch_seconds.append(seconds)
            log.epoch(state.history, seconds)  # before the state: a resumed fit logs it again
            if resumable is not None or processes.distributed:
                stateful = {key: item.state_dict() for key, item in svi.stateful().items()}
                if processes.distributed:  # every process's random state, on rank 0
                    stateful["rng"] = processes.gather(stateful["rng"])
                if resumable is not None and processes.is_main:
                    resumable.save({**state.as_dict(), **stateful})
            if state.stopped:
                break
    bar.close()
    classifier.load_state_dict(state.best.model_state)
    svi.guide_state.load_state_dict(state.best.guide_state)
    if head_part is not None:
        state.best = fixed_point_head(svi, head_part, state.best, progress)
    elbo_terms = processes.share(lambda: svi.training_set_elbo(seed))
    trained = svi.guide
    if hasattr(trained, "laplace_approximation"):
        trained = laplace_guide(trained, data, device)
    return TrainResult(
        trained, state.history, state.best, state.seconds, state.epoch_seconds, elbo_terms
    )


def fixed_point_head(
    svi: SVITraining, part: AutoNormal, best: BestState, progress: bool
) -> BestState:
    """The kept state with ``part``'s head scales at the ELBO's fixed point
    (:mod:`~probtrans.inference.head_variances`), computed on the main process and set on
    every process; says how far they moved on stderr when ``progress``."""
    spec = svi.spec
    weight, bias = svi.processes.share(
        lambda: head_fixed_point(
            svi.classifier,
            svi.guide,
            svi.data.train,
            spec.elbo.kl_weight,
            spec.predictive.batch_size,
            svi.device,
        )
    )
    before, after = put_head_scales(part, weight, bias)
    if progress and svi.processes.is_main:
        print(
            f"note: guide.head_scales = 'fixed_point': the head's posterior standard deviations "
            f"set at the ELBO's fixed point for their means (median {before:.3g} → {after:.3g})",
            file=sys.stderr,
        )
    return dataclasses.replace(best, guide_state=copy.deepcopy(svi.guide_state.state_dict()))


def laplace_guide(guide: Callable, data: DataBundle, device: str) -> Callable:
    """The Laplace approximation around a MAP guide's point (Pyro's
    ``AutoLaplaceApproximation.laplace_approximation``): the Hessian of the negative log joint
    of the whole training set, in one pass."""
    train = data.train
    inputs, mask = train.inputs.to(device), None if train.mask is None else train.mask.to(device)
    return guide.laplace_approximation(inputs, mask, train.labels.to(device))
