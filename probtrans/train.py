"""SVI training loop: ELBO, optimiser with a learning-rate schedule, KL weight and annealing,
validation after every epoch, early stopping, best-state checkpoints, and resumption: with a
:class:`Resumable`, the whole training state is saved after every epoch and an interrupted fit
continues from its last finished epoch, drawing the same batches and random numbers it would have
drawn without the interruption.

Each step minimises ``elbo.differentiable_loss(model, guide, ...)`` with a PyTorch optimiser over
the classifier's and the guide's parameters: Pyro's recommended loop for PyroModules that keep
their parameters locally (see :mod:`probtrans`).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyro
import pyro.util
import torch
from pyro.optim.clipped_adam import ClippedAdam
from tqdm.auto import tqdm

from probtrans import metrics
from probtrans.checkpoint import load_checkpoint, save_checkpoint
from probtrans.config import InferenceSpec, OptimSpec
from probtrans.data import DataBundle
from probtrans.guides import build_guide
from probtrans.model import Classifier
from probtrans.objective import KLWeight, make_elbo, self_guided
from probtrans.predictive import predict


@dataclass
class TrainState:
    """Everything needed to resume or evaluate: module and guide state dicts, where it stopped."""

    model_state: dict
    guide_state: dict
    epoch: int
    val_metric: float


@dataclass
class TrainResult:
    guide: Callable
    history: list[dict] = field(default_factory=list)
    best: TrainState | None = None
    seconds: float = 0.0  # training time, summed over resumed sessions


@dataclass
class Resumable:
    """A file where :func:`fit` saves its whole state after every epoch (weights, optimiser,
    schedule, batch order and random number generators, history, best state), and the identity
    (e.g. specs, seed, epochs) that a saved state must match to be continued.

    ``saved`` is the state found in the file when it was opened, or None when there is none or it
    belongs to another fit.
    """

    path: Path
    identity: dict[str, Any]
    saved: dict[str, Any] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.path.is_file():
            state = load_checkpoint(self.path)
            if state.get("identity") == self.identity:
                self.saved = state

    def save(self, state: dict[str, Any]) -> None:
        save_checkpoint(self.path, {"identity": self.identity, **state})


def rng_state() -> dict[str, Any]:
    """Pyro's torch/random/numpy generator states as plain data (numpy's keys as a tensor), so
    that the resume file loads with ``weights_only``."""
    state = pyro.util.get_rng_state()
    name, keys, *rest = state["numpy"]
    return {**state, "numpy": (name, torch.from_numpy(keys.astype(np.int64)), *rest)}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore generator states saved by :func:`rng_state`."""
    name, keys, *rest = state["numpy"]
    pyro.util.set_rng_state({**state, "numpy": (name, keys.numpy().astype(np.uint32), *rest)})


def make_optimizer(
    spec: OptimSpec, params: list[torch.nn.Parameter], total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """Adam or Pyro's ClippedAdam, and a per-step schedule (constant, cosine decay, exponential)."""
    if spec.name == "clipped_adam":
        optimizer = ClippedAdam(
            params, lr=spec.lr, weight_decay=spec.weight_decay, clip_norm=spec.clip_norm
        )
    else:
        optimizer = torch.optim.Adam(params, lr=spec.lr, weight_decay=spec.weight_decay)
    schedules = {
        "constant": lambda step: 1.0,
        "cosine": lambda step: (
            0.5 * (1.0 + math.cos(math.pi * min(step, total_steps) / total_steps))
        ),
        "exponential": lambda step: spec.gamma**step,
    }
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedules[spec.schedule])


def kl_annealing_at(spec: InferenceSpec, epoch_progress: float) -> float:
    """Factor on every KL term after ``epoch_progress`` epochs: linear from 0 to 1 over
    ``kl_anneal_epochs`` (always 1 without annealing)."""
    if spec.elbo.kl_anneal_epochs == 0:
        return 1.0
    return min(1.0, epoch_progress / spec.elbo.kl_anneal_epochs)


def validation_metric(
    classifier: Classifier, guide: Callable, data: DataBundle, spec: InferenceSpec, device: str
) -> dict[str, float]:
    probs = predict(
        classifier, guide, data.val, spec.train.val_samples, spec.predictive.batch_size, device
    )["probs"]
    mean = metrics.predictive_mean(probs)
    labels = data.val.labels.numpy()
    return {
        "val_accuracy": metrics.accuracy(mean, labels),
        "val_mcc": metrics.mcc(mean, labels),
        "val_nll": metrics.nll(mean, labels),
    }


def fit(
    classifier: Classifier,
    data: DataBundle,
    spec: InferenceSpec,
    *,
    seed: int = 0,
    device: str = "cpu",
    on_improve: Callable[[TrainState], None] | None = None,
    resumable: Resumable | None = None,
    progress: bool = True,
) -> TrainResult:
    """Train ``classifier`` on ``data.train`` by SVI; keep the best state on validation.

    ``on_improve`` is called with every new best state (e.g. to write a checkpoint). With
    ``resumable``, the state is saved there after every epoch, and a matching saved state is
    continued instead of starting over.
    """
    pyro.set_rng_seed(seed)
    classifier.to(device)
    model = self_guided(classifier)
    guide = build_guide(model, classifier, spec.guide)
    n_train = len(data.train)
    kl = KLWeight(spec.elbo.kl_weight * (n_train if spec.elbo.kl_scale == "authors" else 1))
    model, guide_fn = kl(model), kl(guide)
    elbo = make_elbo(spec.elbo)
    first = next(data.train.batches(2))
    with torch.no_grad():  # the guide creates its parameters on its first call
        guide(*(t if t is None else t.to(device) for t in first[1:]))
    params = list(classifier.parameters()) + list(guide.parameters())
    steps_per_epoch = math.ceil(n_train / spec.train.batch_size)
    optimizer, schedule = make_optimizer(spec.optim, params, spec.train.epochs * steps_per_epoch)
    generator = torch.Generator().manual_seed(seed)

    result = TrainResult(guide=guide)
    higher_is_better = spec.train.monitor != "nll"
    bad_epochs, done, stopped = 0, 0, False
    saved = None if resumable is None else resumable.saved
    if saved is not None:
        classifier.load_state_dict(saved["model_state"])
        guide.load_state_dict(saved["guide_state"])
        optimizer.load_state_dict(saved["optimizer"])
        schedule.load_state_dict(saved["schedule"])
        generator.set_state(saved["generator"])
        set_rng_state(saved["rng"])
        result.history, result.seconds = saved["history"], saved["seconds"]
        result.best = TrainState(**saved["best"])
        bad_epochs, done, stopped = saved["bad_epochs"], saved["epoch"], saved["stopped"]
    last = done if stopped else spec.train.epochs
    bar = tqdm(
        range(done + 1, last + 1),
        desc="SVI",
        unit="epoch",
        initial=done,
        total=last,
        disable=not progress,
    )
    for epoch in bar:
        started = time.perf_counter()
        classifier.train()
        total = 0.0
        batches = tqdm(
            data.train.batches(
                spec.train.batch_size,
                shuffle=True,
                generator=generator,
                by_length=spec.train.group_by_length,
            ),
            total=steps_per_epoch,
            desc=f"epoch {epoch}",
            unit="step",
            leave=False,
            disable=not progress,
        )
        for step, (index, inputs, mask, labels) in enumerate(batches):
            kl.annealing = kl_annealing_at(spec, epoch - 1 + step / steps_per_epoch)
            inputs, labels = inputs.to(device), labels.to(device)
            mask = None if mask is None else mask.to(device)
            optimizer.zero_grad()
            loss = elbo.differentiable_loss(
                model, guide_fn, inputs, mask, labels, index=index.to(device), n_data=n_train
            )
            loss.backward()
            optimizer.step()
            schedule.step()
            total += loss.item()
        classifier.eval()
        record = {
            "epoch": epoch,
            "elbo": -total / steps_per_epoch / n_train,
            "kl_annealing": kl.annealing,
        }
        record.update(validation_metric(classifier, guide, data, spec, device))
        result.history.append(record)
        value = record[f"val_{spec.train.monitor}"]
        improved = result.best is None or (
            value > result.best.val_metric if higher_is_better else value < result.best.val_metric
        )
        if improved:
            result.best = TrainState(
                copy.deepcopy(classifier.state_dict()),
                copy.deepcopy(guide.state_dict()),
                epoch,
                value,
            )
            bad_epochs = 0
            if on_improve is not None:
                on_improve(result.best)
        else:
            bad_epochs += 1
        bar.set_postfix(
            elbo=f"{record['elbo']:.3f}", **{f"val_{spec.train.monitor}": f"{value:.4f}"}
        )
        stopped = bool(spec.train.patience) and bad_epochs >= spec.train.patience
        result.seconds += time.perf_counter() - started
        if resumable is not None:
            resumable.save(
                {
                    "epoch": epoch,
                    "stopped": stopped,
                    "seconds": result.seconds,
                    "model_state": classifier.state_dict(),
                    "guide_state": guide.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "schedule": schedule.state_dict(),
                    "generator": generator.get_state(),
                    "rng": rng_state(),
                    "history": result.history,
                    "best": vars(result.best),
                    "bad_epochs": bad_epochs,
                }
            )
        if stopped:
            break
    bar.close()
    classifier.load_state_dict(result.best.model_state)
    guide.load_state_dict(result.best.guide_state)
    return result
