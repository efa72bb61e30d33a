"""A run: fit a model spec with an inference spec, evaluate it, and keep everything in one folder.

Run folder:
    model.toml, inference.toml   the specs, copied verbatim
    checkpoint.pt                classifier + guide state of the best validation epoch
    history.json                 per-epoch ELBO and validation metrics
    metrics.json                 test metrics, OOD scores, temperature-scaled metrics, post-hoc
                                 variants (:func:`probtrans.summary.summarise`)
    probs.npz                    class probabilities (S, N, C) of every variant on val/test/ood
    predictive.nc                ArviZ InferenceData (NetCDF) of the test posterior predictive
    report.png                   reliability diagram and ID vs OOD uncertainty histograms

``fit_run`` trains into ``DIR.partial`` and only replaces ``DIR`` once the run is complete, so a
failed or interrupted fit never destroys an earlier run. ``DIR.partial/resume.pt`` holds the whole
training state after the last finished epoch: fitting the same specs, seed and epochs into the same
folder again continues from there (the folder's ``resume.pt`` is removed once the run is complete).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyro
import torch
from torch import Tensor

from probtrans import report
from probtrans.checkpoint import atomic_write, load_checkpoint, save_checkpoint
from probtrans.config import (
    InferenceSpec,
    ModelSpec,
    load_inference_spec,
    load_model_spec,
)
from probtrans.data import DataBundle, load_data
from probtrans.errors import ProbtransError
from probtrans.guides import build_guide
from probtrans.laplace import LastLayerLaplace
from probtrans.model import Classifier, build_classifier
from probtrans.objective import self_guided
from probtrans.predictive import inference_data, posterior_draws, predict
from probtrans.summary import SPLITS, summarise
from probtrans.train import Resumable, TrainState, fit

HEADLINE = ("accuracy", "nll", "ece", "mce", "brier", "mutual_information", "ood_auroc", "ood_aupr")


@dataclass
class Run:
    """A fitted (or reloaded) model with its specs, data, guide and folder."""

    model_spec: ModelSpec
    inference_spec: InferenceSpec
    data: DataBundle
    classifier: Classifier
    guide: Callable
    path: Path


def check_device(device: str) -> str:
    if device not in ("cpu", "cuda"):
        raise ProbtransError(f"--device {device!r}: must be 'cpu' or 'cuda'")
    if device == "cuda" and not torch.cuda.is_available():
        raise ProbtransError("--device cuda: no CUDA device is available on this machine")
    return device


def write_json(path: Path, value: object) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(value, indent=2) + "\n"))


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
        if epochs <= 0:
            raise ProbtransError(f"--epochs {epochs}: must be > 0")
        inference_spec.train.epochs = epochs
    out_dir = Path(out_dir)
    staging = out_dir.with_name(out_dir.name + ".partial")
    identity = {
        "model_spec": Path(model_path).read_text(),
        "inference_spec": Path(inference_path).read_text(),
        "seed": seed,
        "epochs": inference_spec.train.epochs,
    }
    resumable = Resumable(staging / "resume.pt", identity)
    if resumable.saved is None:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        (staging / "model.toml").write_text(identity["model_spec"])
        (staging / "inference.toml").write_text(identity["inference_spec"])
    elif progress:
        print(f"resuming {staging} after epoch {resumable.saved['epoch']}", flush=True)

    data = load_data(model_spec.data)
    pyro.set_rng_seed(seed)  # the initial weights too depend on the seed
    classifier = build_classifier(model_spec, data)

    def checkpoint(state: TrainState) -> None:
        save_checkpoint(
            staging / "checkpoint.pt",
            {
                "model_state": state.model_state,
                "guide_state": state.guide_state,
                "epoch": state.epoch,
                "seed": seed,
                "model_spec": identity["model_spec"],
                "inference_spec": identity["inference_spec"],
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
    scores.update(
        train_seconds=result.seconds,
        best_epoch=result.best.epoch,
        epochs=inference_spec.train.epochs,
        seed=seed,
    )
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
    model = self_guided(classifier)
    guide = build_guide(model, classifier, inference_spec.guide)
    index, inputs, mask, labels = next(data.train.batches(2))
    with torch.no_grad():  # create the guide's parameters, then overwrite them
        guide(inputs.to(device), None if mask is None else mask.to(device), labels.to(device))
    guide.load_state_dict(state["guide_state"])
    return Run(model_spec, inference_spec, data, classifier, guide, run_dir)


def predictives(
    run: Run, samples: int, device: str = "cpu", progress: bool = False
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """Posterior predictive class probabilities, variant → split → (S, N, C), for the ``plain``
    predictive and the spec's post-hoc variants, on the val, test and ood splits; and the full
    plain predictive of the test and ood splits (every site, for the InferenceData)."""
    spec = run.inference_spec.predictive
    laplace = "laplace" in spec.posthoc
    extra = ("features",) if laplace else ()
    splits = {"val": run.data.val, "test": run.data.test, "ood": run.data.ood}
    draws = posterior_draws(run.guide, samples, run.data.test)  # the same S draws everywhere

    def on(split: str, **options: Any) -> dict[str, np.ndarray]:
        return predict(
            run.classifier,
            run.guide,
            splits[split],
            samples,
            spec.batch_size,
            device,
            draws=draws,
            progress=progress,
            **options,
        )

    plain = {split: on(split, extra_sites=extra) for split in SPLITS}
    probs = {"plain": {split: out["probs"] for split, out in plain.items()}}
    if "mc_dropout" in spec.posthoc:
        probs["mc_dropout"] = {split: on(split, mc_dropout=True)["probs"] for split in SPLITS}
    if laplace:
        probs["laplace"] = last_layer_laplace(
            run, draws, {s: o["features"] for s, o in plain.items()}
        )
    for out in plain.values():
        out.pop("features", None)
    return probs, plain


def last_layer_laplace(
    run: Run, draws: dict[str, Tensor], features: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Last-layer Laplace predictive from the plain predictive's feature draws (S, N, D)."""
    batch = run.inference_spec.predictive.batch_size
    train = predict(
        run.classifier,
        run.guide,
        run.data.train,
        1,
        batch,
        extra_sites=("features",),
        draws={name: value[:1] for name, value in draws.items()},
    )["features"][0]
    weight = draws["head.weight"][0] if "head.weight" in draws else run.classifier.head.weight
    bias = draws["head.bias"][0] if "head.bias" in draws else run.classifier.head.bias
    posterior = LastLayerLaplace.fit(torch.as_tensor(train), weight, bias)
    prior_precision = run.inference_spec.predictive.laplace_prior_precision
    if prior_precision:
        posterior.prior_precision = prior_precision
    else:
        posterior.fit_prior_precision(
            torch.as_tensor(features["val"]), run.data.val.labels.numpy()
        )
    return {split: posterior.predictive(torch.as_tensor(f)) for split, f in features.items()}


def split_labels(data: DataBundle) -> dict[str, np.ndarray]:
    return {
        "val": data.val.labels.numpy(),
        "test": data.test.labels.numpy(),
        "ood": data.ood.labels.numpy(),
    }


def write_probs(path: Path, probs: dict[str, dict[str, np.ndarray]], labels: dict) -> None:
    """``probs.npz``: ``{variant}/{split}`` (S, N, C) and ``labels/{split}`` (N,)."""
    arrays = {f"{v}/{s}": p.astype(np.float32) for v, by in probs.items() for s, p in by.items()}
    arrays.update({f"labels/{split}": value for split, value in labels.items()})

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, **arrays)

    atomic_write(path, write)


def read_probs(path: Path) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """Inverse of :func:`write_probs`."""
    probs: dict[str, dict[str, np.ndarray]] = {}
    labels = {}
    with np.load(path, allow_pickle=False) as arrays:
        for key in arrays.files:
            variant, split = key.split("/")
            if variant == "labels":
                labels[split] = arrays[key]
            else:
                probs.setdefault(variant, {})[split] = arrays[key]
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
    probs, plain = predictives(run, samples, device, progress)
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
        title=f"{run.data.name} · {run.model_spec.model.attention.kind} attention"
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
    """Reload a run folder, re-evaluate it and rewrite its metrics, predictive and report."""
    run = load_run(run_dir, device)
    previous = (
        json.loads((run.path / "metrics.json").read_text())
        if (run.path / "metrics.json").is_file()
        else {}
    )
    scores = evaluate(run, samples=samples, device=device, seed=seed, progress=progress)
    for key in ("train_seconds", "best_epoch", "seed"):
        if key in previous:
            scores.setdefault(key, previous[key])
    write_json(run.path / "metrics.json", scores)
    return scores
