"""A run: fit a model spec with an inference spec, evaluate it, and keep everything in one folder.

Run folder (:data:`RUN_FILES`):
    model.toml, inference.toml   the specs, copied verbatim
    checkpoint.pt                classifier + guide state of the best validation epoch, and the
                                 spec texts (what ``load_run`` reads)
    history.json                 per-epoch ELBO and validation metrics
    metrics.json                 test metrics, OOD scores, temperature-scaled metrics, post-hoc
                                 variants (:func:`probtrans.summary.summarise`) and the
                                 :class:`RunInfo`
    probs.npz                    class probabilities (S, N, C) of every variant on val/test/ood
    predictive.nc                ArviZ InferenceData (NetCDF) of the test posterior predictive
    report.png                   reliability diagram and ID vs OOD uncertainty histograms
    timing.json                  wall-clock seconds of training and evaluation

Two fits with the same specs and seed write byte-identical files, ``timing.json`` aside.

``fit_run`` trains into ``DIR.partial`` and only replaces ``DIR`` once the run is complete, so a
failed or interrupted fit never destroys an earlier run; it replaces ``DIR`` only if that is a run
folder (or ``force``), and holds the lock ``DIR.lock`` (:mod:`probtrans.lock`) while it works.
``DIR.partial/resume.pt`` holds the whole training state after the last finished epoch: fitting
the same specs, seed and epochs into the same folder again continues from there (the folder's
``resume.pt`` is removed once the run is complete). A resume file that cannot be read is set aside
as ``DIR.unreadable-resume.pt`` and the fit starts over.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyro
import torch

from probtrans import report
from probtrans.checkpoint import (
    UnreadableCheckpoint,
    load_checkpoint,
    require,
    save_checkpoint,
    set_aside,
)
from probtrans.data import DataBundle, load_data
from probtrans.errors import ProbtransError, in_file
from probtrans.inference.guide import build_guide
from probtrans.inference.posthoc import Probs, posterior_predictives
from probtrans.inference.predictive import inference_data
from probtrans.inference.train import BestState, Resumable, TrainingDiverged, fit
from probtrans.io import (
    atomic_write,
    is_temporary_file,
    read_json,
    read_npz,
    remove_temporary_files,
    write_json,
    write_npz,
    write_text,
)
from probtrans.lock import folder_lock
from probtrans.model import Classifier, build_classifier
from probtrans.resolve import load_inference_spec, load_model_spec
from probtrans.specs import InferenceSpec, ModelSpec, read_spec_text, updated
from probtrans.summary import SPLITS, summarise

#: the metrics ``fit`` and ``evaluate`` print
HEADLINE = ("accuracy", "nll", "ece", "mce", "brier", "mutual_information", "ood_auroc", "ood_aupr")
#: the files of a run folder; a folder holding anything else is not replaced without ``force``
RUN_FILES = frozenset(
    {
        "model.toml",
        "inference.toml",
        "checkpoint.pt",
        "history.json",
        "metrics.json",
        "probs.npz",
        "predictive.nc",
        "report.png",
        "timing.json",
    }
)
#: seeds of numpy and scikit-learn (and so of a fit) are in 0 … 2**32 − 1
SEED_RANGE = range(2**32)


@dataclass
class RunInfo:
    """How a run was trained: written by ``fit`` into ``metrics.json`` beside the metrics and
    kept there when the run is evaluated again."""

    seed: int
    epochs: int  # asked for; ``compare`` refits a run trained for other epochs
    best_epoch: int  # the epoch whose state was kept

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
    guide: Callable | None  # None until fitted
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


def check_seed(seed: int, option: str = "--seed") -> int:
    if seed not in SEED_RANGE:
        raise ProbtransError(f"{option} {seed}: must be in 0 … 2**32 − 1")
    return seed


def check_replaceable(
    folder: Path, force: bool = False, allowed: frozenset[str] = RUN_FILES
) -> None:
    """Refuse to replace ``folder`` unless it is absent, or holds only ``allowed`` files (and
    temporary files of interrupted writes), or ``force``."""
    if not folder.exists() and not folder.is_symlink():
        above = next(p for p in folder.parents if p.exists() or p == Path(p.anchor))
        if not above.is_dir():
            raise ProbtransError(f"{folder}: cannot be created, {above} is a file")
        return
    if not folder.is_dir() or folder.is_symlink():
        raise ProbtransError(f"{folder}: exists and is not a folder; choose another --out")
    foreign = sorted(
        entry.name
        for entry in folder.iterdir()
        if entry.name not in allowed and not is_temporary_file(entry)
    )
    if foreign and not force:
        shown = ", ".join(foreign[:3]) + (
            f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        )
        raise ProbtransError(
            f"{folder}: not a probtrans run folder (it holds {shown}); choose another --out, "
            f"or pass --force to replace it and everything in it"
        )


def read_timing(folder: Path) -> dict[str, float]:
    """``timing.json`` of a run folder: ``train_seconds`` (summed over resumed sessions) and
    ``evaluate_seconds``; empty if the run has none."""
    path = folder / "timing.json"
    return read_json(path) if path.is_file() else {}


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
    force: bool = False,
) -> dict[str, float]:
    """Train, evaluate and write a complete run folder; returns the metrics.

    An earlier fit of the same specs, seed and epochs into ``out_dir`` that was interrupted is
    continued from its last finished epoch. ``out_dir`` is replaced only if it is a run folder,
    unless ``force``.
    """
    device, seed = check_device(device), check_seed(seed)
    model_path, inference_path, out_dir = Path(model_path), Path(inference_path), Path(out_dir)
    texts = {
        "model_spec": read_spec_text(model_path),
        "inference_spec": read_spec_text(inference_path),
    }
    model_spec = load_model_spec(model_path, texts["model_spec"])
    inference_spec = load_inference_spec(inference_path, texts["inference_spec"])
    if epochs is not None:
        inference_spec = updated(inference_spec, {"train.epochs": epochs}, f"--epochs = {epochs}")
    check_replaceable(out_dir, force)
    with in_file(model_spec.file):
        data = load_data(model_spec.data)
        pyro.set_rng_seed(seed)  # the initial weights too depend on the seed
        classifier = build_classifier(model_spec, data)

    with folder_lock(out_dir, "probtrans fit"):
        check_replaceable(out_dir, force)  # again, now that no other command writes it
        staging = out_dir.with_name(out_dir.name + ".partial")
        identity = {**texts, "seed": seed, "epochs": inference_spec.train.epochs}
        resumable = open_staging(staging, out_dir, texts, identity, progress, force)
        run = Run(model_spec, inference_spec, data, classifier, None, staging)
        try:
            scores = train_and_evaluate(run, resumable, texts, seed, device, progress)
        except TrainingDiverged as err:
            raise ProbtransError(f"{err}. {unfinished(staging)}") from None
        except BaseException:
            print(f"note: {unfinished(staging)}", file=sys.stderr)
            raise
        _replace_dir(staging, out_dir)
    return scores


def open_staging(
    staging: Path,
    out_dir: Path,
    texts: dict[str, str],
    identity: dict,
    progress: bool,
    force: bool = False,
) -> Resumable:
    """The staging folder of a fit, continued if it holds this fit's resume file, else new (it
    is replaced only if it holds nothing but a fit's files, or ``force``)."""
    check_replaceable(staging, force, allowed=RUN_FILES | {"resume.pt"})
    resume = staging / "resume.pt"
    try:
        resumable = Resumable(resume, identity)
    except UnreadableCheckpoint as err:
        aside = out_dir.with_name(out_dir.name + ".unreadable-resume.pt")
        set_aside(err, aside, "the fit starts over")
        resumable = Resumable(resume, identity)
    if resumable.saved is None:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        write_text(staging / "model.toml", texts["model_spec"])
        write_text(staging / "inference.toml", texts["inference_spec"])
    else:
        remove_temporary_files(staging)  # of writes a killed fit left unfinished
        if progress:
            print(f"resuming {staging} after epoch {resumable.saved['epoch']}", flush=True)
    return resumable


def train_and_evaluate(
    run: Run, resumable: Resumable, texts: dict[str, str], seed: int, device: str, progress: bool
) -> dict[str, float]:
    """Fit ``run``'s classifier, then evaluate it; writes every file of the run into
    ``run.path`` and returns the metrics."""

    def checkpoint(best: BestState) -> None:
        save_checkpoint(
            run.path / "checkpoint.pt",
            {
                "model_state": best.model_state,
                "guide_state": best.guide_state,
                "epoch": best.epoch,
                "seed": seed,
                **texts,
            },
        )

    result = fit(
        run.classifier,
        run.data,
        run.inference_spec,
        seed=seed,
        device=device,
        on_improve=checkpoint,
        resumable=resumable,
        progress=progress,
    )
    run.guide = result.guide
    write_json(run.path / "history.json", result.history)
    started = time.perf_counter()
    scores = evaluate(run, device=device, seed=seed, progress=progress)
    info = RunInfo(seed, run.inference_spec.train.epochs, result.best.epoch)
    scores.update(dataclasses.asdict(info))
    write_json(run.path / "metrics.json", scores)
    timing = {"train_seconds": result.seconds, "evaluate_seconds": time.perf_counter() - started}
    write_json(run.path / "timing.json", timing)
    resumable.path.unlink()
    remove_temporary_files(run.path)
    return scores


def unfinished(staging: Path) -> str:
    """What is left of a fit that stopped: its staging folder when an epoch finished (the same
    command continues it), else nothing (the folder is removed)."""
    resume = staging / "resume.pt"
    if resume.is_file():
        try:
            epoch = load_checkpoint(resume)["epoch"]
        except (ProbtransError, KeyError):
            epoch = "?"
        return (
            f"The state after epoch {epoch} is kept in {staging}/ (resume.pt, and checkpoint.pt "
            f"of the best epoch): the same command continues from it, other specs start over"
        )
    shutil.rmtree(staging, ignore_errors=True)
    return "No epoch had finished: nothing was kept"


def _replace_dir(new: Path, old: Path) -> None:
    """Move the finished ``new`` folder to ``old``, removing the previous run only afterwards."""
    if not old.exists():
        new.rename(old)
        return
    trash = Path(tempfile.mkdtemp(dir=old.parent, prefix=f".{old.name}.replaced-"))
    old.rename(trash / old.name)
    new.rename(old)
    shutil.rmtree(trash)


def load_run(run_dir: str | Path, device: str = "cpu") -> Run:
    """Rebuild the classifier and guide of a run folder from its checkpoint, with the spec texts
    the checkpoint keeps (the folder's copies are for reading; a note says if they differ)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ProbtransError(f"{run_dir}: no such run folder")
    device = check_device(device)
    path = run_dir / "checkpoint.pt"
    keys = ["model_state", "guide_state", "model_spec", "inference_spec"]
    state = require(load_checkpoint(path), path, keys)
    for key, name in (("model_spec", "model.toml"), ("inference_spec", "inference.toml")):
        copy = run_dir / name
        if not copy.is_file() or copy.read_bytes() != state[key].encode():
            print(
                f"note: {copy} is not the spec this run was trained with; using that one, kept "
                f"in {path}",
                file=sys.stderr,
            )
    model_spec = load_model_spec(f"{path} (model spec)", state["model_spec"])
    inference_spec = load_inference_spec(f"{path} (inference spec)", state["inference_spec"])
    with in_file(model_spec.file):
        data = load_data(model_spec.data)
        classifier = build_classifier(model_spec, data).to(device)
    try:
        classifier.load_state_dict(state["model_state"])
        guide = build_guide(classifier, inference_spec.guide, data.train, device)
        guide.load_state_dict(state["guide_state"])
    except (RuntimeError, KeyError) as err:
        reason = f"its weights do not fit its model spec ({str(err).splitlines()[0]})"
        raise UnreadableCheckpoint(path, reason) from None
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
    :class:`RunInfo` that ``fit`` wrote and its training time are kept."""
    seed = check_seed(seed)
    run = load_run(run_dir, device)
    metrics_file = run.path / "metrics.json"
    previous = read_json(metrics_file) if metrics_file.is_file() else {}
    timing = read_timing(run.path)
    if "train_seconds" in previous:  # a run written before timing.json: keep its training time
        timing.setdefault("train_seconds", previous["train_seconds"])
    with folder_lock(run.path, "probtrans evaluate"):
        started = time.perf_counter()
        scores = evaluate(run, samples=samples, device=device, seed=seed, progress=progress)
        scores.update(RunInfo.read(previous))
        write_json(metrics_file, scores)
        timing["evaluate_seconds"] = time.perf_counter() - started
        write_json(run.path / "timing.json", timing)
    return scores
