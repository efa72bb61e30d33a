"""A run: fit a model spec with an inference spec, evaluate it, and keep everything in one folder.

Run folder:
    model.toml, inference.toml   the specs, copied verbatim
    checkpoint.pt                classifier + guide state of the best validation epoch
    history.json                 per-epoch ELBO and validation metrics
    metrics.json                 test metrics, OOD scores, temperature-scaled metrics, post-hoc
                                 variants (:func:`probtrans.summary.summarise`) and the
                                 :class:`RunInfo`
    probs.npz                    class probabilities (S, N, C) of every variant on val/test/ood
    predictive.nc                ArviZ InferenceData (NetCDF) of the test posterior predictive
    report.png                   reliability diagram and ID vs OOD uncertainty histograms

``fit_run`` trains into ``DIR.partial`` and only replaces ``DIR`` once the run is complete, so a
failed or interrupted fit never destroys an earlier run. ``DIR.partial/resume.pt`` holds the whole
training state after the last finished epoch: fitting the same specs, seed and epochs into the same
folder again continues from there (the folder's ``resume.pt`` is removed once the run is complete).
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyro
import torch

from probtrans import report
from probtrans.checkpoint import load_checkpoint, save_checkpoint
from probtrans.data import DataBundle, load_data
from probtrans.errors import ProbtransError
from probtrans.inference.guide import build_guide
from probtrans.inference.posthoc import Probs, posterior_predictives
from probtrans.inference.predictive import inference_data
from probtrans.inference.train import BestState, Resumable, fit
from probtrans.io import atomic_write, read_json, read_npz, write_json, write_npz, write_text
from probtrans.model import Classifier, build_classifier
from probtrans.resolve import load_inference_spec, load_model_spec
from probtrans.specs import InferenceSpec, ModelSpec, updated
from probtrans.summary import SPLITS, summarise

#: the metrics ``fit`` and ``evaluate`` print
HEADLINE = ("accuracy", "nll", "ece", "mce", "brier", "mutual_information", "ood_auroc", "ood_aupr")


@dataclass
class RunInfo:
    """How a run was trained: written by ``fit`` into ``metrics.json`` beside the metrics and
    kept there when the run is evaluated again."""

    seed: int
    epochs: int  # asked for; ``compare`` refits a run trained for other epochs
    best_epoch: int  # the epoch whose state was kept
    train_seconds: float  # summed over resumed sessions

    @classmethod
    def read(cls, metrics: dict[str, Any]) -> dict[str, Any]:
        """The run information among a ``metrics.json``'s keys."""
        return {f.name: metrics[f.name] for f in dataclasses.fields(cls) if f.name in metrics}


@dataclass
class Run:
    """A fitted (or reloaded) model with its specs, data, guide and folder."""

    model_spec: ModelSpec
    inference_spec: InferenceSpec
    data: DataBundle
    classifier: Classifier
    guide: Callable
    path: Path

    def predictives(
        self, samples: int, device: str = "cpu", progress: bool = False
    ) -> tuple[Probs, dict[str, dict[str, np.ndarray]]]:
        """The plain posterior predictive and the spec's post-hoc variants
        (:func:`probtrans.inference.posthoc.posterior_predictives`)."""
        spec = self.inference_spec.predictive
        return posterior_predictives(
            self.classifier, self.guide, self.data, spec, samples, device, progress
        )


def check_device(device: str) -> str:
    if device not in ("cpu", "cuda"):
        raise ProbtransError(f"--device {device!r}: must be 'cpu' or 'cuda'")
    if device == "cuda" and not torch.cuda.is_available():
        raise ProbtransError("--device cuda: no CUDA device is available on this machine")
    return device


def fit_run(
    model_path: str | Path,
    inference_path: str | Path,
    out_dir: str | Path,
    *,
    epochs: int | None = None,
    seed: int = 0,
    device: str = "cpu",
    progress: bool = True,
) -> dict[str, float]:
    """Train, evaluate and write a complete run folder; returns the metrics.

    An earlier fit of the same specs, seed and epochs into ``out_dir`` that was interrupted is
    continued from its last finished epoch.
    """
    device = check_device(device)
    model_spec = load_model_spec(model_path)
    inference_spec = load_inference_spec(inference_path)
    if epochs is not None:
        inference_spec = updated(inference_spec, {"train.epochs": epochs}, f"--epochs = {epochs}")
    out_dir = Path(out_dir)
    staging = out_dir.with_name(out_dir.name + ".partial")
    texts = {
        "model_spec": Path(model_path).read_text(),
        "inference_spec": Path(inference_path).read_text(),
    }
    identity = {**texts, "seed": seed, "epochs": inference_spec.train.epochs}
    resumable = Resumable(staging / "resume.pt", identity)
    if resumable.saved is None:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        write_text(staging / "model.toml", texts["model_spec"])
        write_text(staging / "inference.toml", texts["inference_spec"])
    elif progress:
        print(f"resuming {staging} after epoch {resumable.saved['epoch']}", flush=True)

    data = load_data(model_spec.data)
    pyro.set_rng_seed(seed)  # the initial weights too depend on the seed
    classifier = build_classifier(model_spec, data)

    def checkpoint(best: BestState) -> None:
        save_checkpoint(
            staging / "checkpoint.pt",
            {
                "model_state": best.model_state,
                "guide_state": best.guide_state,
                "epoch": best.epoch,
                "seed": seed,
                **texts,
            },
        )

    result = fit(
        classifier,
        data,
        inference_spec,
        seed=seed,
        device=device,
        on_improve=checkpoint,
        resumable=resumable,
        progress=progress,
    )
    write_json(staging / "history.json", result.history)
    run = Run(model_spec, inference_spec, data, classifier, result.guide, staging)
    scores = evaluate(run, device=device, seed=seed, progress=progress)
    info = RunInfo(seed, inference_spec.train.epochs, result.best.epoch, result.seconds)
    scores.update(dataclasses.asdict(info))
    write_json(staging / "metrics.json", scores)
    resumable.path.unlink()
    _replace_dir(staging, out_dir)
    return scores


def _replace_dir(new: Path, old: Path) -> None:
    """Move the finished ``new`` folder to ``old``, removing the previous run only afterwards."""
    trash = old.with_name(old.name + ".old")
    shutil.rmtree(trash, ignore_errors=True)
    if old.exists():
        old.rename(trash)
    new.rename(old)
    shutil.rmtree(trash, ignore_errors=True)


def load_run(run_dir: str | Path, device: str = "cpu") -> Run:
    """Rebuild the classifier and guide of a run folder from its checkpoint and spec copies."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ProbtransError(f"{run_dir}: no such run folder")
    device = check_device(device)
    state = load_checkpoint(run_dir / "checkpoint.pt")
    model_spec = load_model_spec(run_dir / "model.toml")
    inference_spec = load_inference_spec(run_dir / "inference.toml")
    data = load_data(model_spec.data)
    classifier = build_classifier(model_spec, data).to(device)
    classifier.load_state_dict(state["model_state"])
    guide = build_guide(classifier, inference_spec.guide, data.train, device)
    guide.load_state_dict(state["guide_state"])
    return Run(model_spec, inference_spec, data, classifier, guide, run_dir)


def split_labels(data: DataBundle) -> dict[str, np.ndarray]:
    return {split: getattr(data, split).labels.numpy() for split in SPLITS}


def write_probs(path: Path, probs: Probs, labels: dict[str, np.ndarray]) -> None:
    """``probs.npz``: ``{variant}/{split}`` (S, N, C) and ``labels/{split}`` (N,)."""
    arrays = {f"{v}/{s}": p.astype(np.float32) for v, by in probs.items() for s, p in by.items()}
    arrays.update({f"labels/{split}": value for split, value in labels.items()})
    write_npz(path, arrays)


def read_probs(path: Path) -> tuple[Probs, dict[str, np.ndarray]]:
    """Inverse of :func:`write_probs`."""
    probs: Probs = {}
    labels = {}
    for key, value in read_npz(path).items():
        variant, split = key.split("/")
        if variant == "labels":
            labels[split] = value
        else:
            probs.setdefault(variant, {})[split] = value
    return probs, labels


def evaluate(
    run: Run,
    *,
    samples: int | None = None,
    device: str = "cpu",
    seed: int = 0,
    progress: bool = False,
) -> dict[str, float]:
    """Posterior predictive on the validation, in-domain test and out-of-domain splits; writes
    ``predictive.nc``, ``probs.npz`` and ``report.png`` into the run folder and returns the
    metrics (:func:`probtrans.summary.summarise`; post-hoc variants prefixed ``{variant}.``)."""
    samples = samples or run.inference_spec.predictive.samples
    pyro.set_rng_seed(seed)
    probs, plain = run.predictives(samples, device, progress)
    labels = split_labels(run.data)
    scores = summarise(probs["plain"], labels)
    for variant in probs.keys() - {"plain"}:
        scores.update({f"{variant}.{k}": v for k, v in summarise(probs[variant], labels).items()})
    scores["posterior_samples"] = samples
    write_probs(run.path / "probs.npz", probs, labels)
    idata = inference_data(plain["test"], labels["test"], run.data.class_names, ood=plain["ood"])
    atomic_write(
        run.path / "predictive.nc", lambda tmp: idata.to_netcdf(str(tmp), engine="h5netcdf")
    )
    report.save_run_figure(
        run.path / "report.png",
        probs["plain"]["test"],
        labels["test"],
        probs["plain"]["ood"],
        title=f"{run.data.name} · {run.model_spec.network.attention.kind} attention"
        f" · guide {run.inference_spec.guide.name} · {samples} samples",
    )
    return scores


def evaluate_run(
    run_dir: str | Path,
    *,
    samples: int | None = None,
    device: str = "cpu",
    seed: int = 0,
    progress: bool = False,
) -> dict[str, float]:
    """Reload a run folder, re-evaluate it and rewrite its metrics, predictive and report; the
    :class:`RunInfo` that ``fit`` wrote is kept."""
    run = load_run(run_dir, device)
    metrics_file = run.path / "metrics.json"
    previous = read_json(metrics_file) if metrics_file.is_file() else {}
    scores = evaluate(run, samples=samples, device=device, seed=seed, progress=progress)
    scores.update(RunInfo.read(previous))
    write_json(metrics_file, scores)
    return scores
