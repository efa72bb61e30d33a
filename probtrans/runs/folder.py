"""The run folder: its files, the staging folder a fit writes into, and the small files that
are not the model (``probs.npz``, ``timing.json``, the :class:`RunInfo` in ``metrics.json``).

Run folder (:data:`RUN_FILES`):
    model.toml, inference.toml   the specs, copied verbatim
    checkpoint.pt                classifier + guide state of the best validation epoch (for a
                                 guide given in Python, which cannot be rebuilt from a file: its
                                 posterior draws), and the spec texts (what ``load_run`` reads)
    history.json                 per-epoch ELBO and validation metrics
    metrics.json                 test metrics, OOD scores, temperature-scaled metrics, post-hoc
                                 variants (:func:`probtrans.summary.summarise`), PSIS-LOO
                                 (:mod:`probtrans.runs.evaluation`) and the :class:`RunInfo`
    probs.npz                    class probabilities (S, N, C) of every variant on the validation
                                 and test splits and every out-of-domain set, free energies (N,),
                                 feature-space scores (N,), and the SHA-256 of the checkpoint.pt
                                 they were computed from: a probs.npz of another checkpoint (a
                                 copy from another run) is not read as this run's
    feature_scores.npz           the feature-space scores fitted on the training split
                                 (:mod:`probtrans.feature_scores`), for new inputs
    predictive.nc                ArviZ InferenceData (NetCDF): the test posterior predictive, the
                                 posterior draws of the global sites and the training
                                 log-likelihood that ``az.loo`` reads
    report.png                   reliability with bin counts, entropy and mutual information in vs
                                 out of domain, OOD ROC, risk–coverage, training curves
                                 (:func:`probtrans.figures.run_figure`)
    timing.json                  wall-clock seconds of training, of each epoch and of evaluation
    data.json, data.pt,          the data the run is evaluated on, its class names, tokenizer and
    tokenizer.json               image scaling (:mod:`probtrans.data.saved`): ``evaluate`` and
                                 ``predict`` need nothing but the folder
    backbone/config.json         a pretrained backbone's config (:mod:`probtrans.hub`; its
                                 weights are in the checkpoint): no network nor hub cache needed

A run's files are replaced together or not at all. A fit trains into ``DIR.partial``
(:func:`open_staging`) and only replaces ``DIR`` once the run is complete (:func:`replace_folder`),
so a failed or interrupted fit never destroys an earlier run; ``DIR.partial/resume.pt`` holds
the whole training state after the last finished epoch. ``evaluate`` rewrites a copy,
``DIR.evaluate.partial`` (:func:`staged_copy`: hard links of the files it keeps), and replaces
``DIR`` with it the same way: after a disk that fills up, a kill or a crash the folder is the
old complete run or the new one, never a mix.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from probtrans.checkpoint import UnreadableCheckpoint, load_checkpoint, set_aside
from probtrans.data.saved import DATA_FILES
from probtrans.errors import ProbtransError
from probtrans.feature_scores import FeatureDensity
from probtrans.hub import RUN_BACKBONE
from probtrans.inference.posthoc import Energy, Probs
from probtrans.inference.train import Resumable
from probtrans.io import (
    DamagedFile,
    checked_read,
    is_temporary_file,
    read_json,
    read_npz,
    remove_temporary_files,
    write_npz,
    write_text,
)

#: the files of a run folder; a folder holding anything else is not replaced without ``force``
RUN_FILES = frozenset(
    {
        "model.toml",
        "inference.toml",
        "checkpoint.pt",
        "history.json",
        "history.csv",  # the training log ([train] logger = "csv")
        "tensorboard",  # ... or its TensorBoard folder
        "metrics.json",
        "probs.npz",
        "predictive.nc",
        "report.png",
        "timing.json",
        "feature_scores.npz",
        RUN_BACKBONE,
        *DATA_FILES,
    }
)
#: the fitted feature-space scores (:class:`probtrans.feature_scores.FeatureDensity`)
FEATURE_FILE = "feature_scores.npz"
#: the resume file of a staging folder
RESUME = "resume.pt"
#: the prefix of the free energies' keys in ``probs.npz``
ENERGY = "energy."
#: the prefix of the feature-space scores' keys in ``probs.npz``
FEATURE = "feature."
#: the key of ``probs.npz`` holding the SHA-256 of the ``checkpoint.pt`` it was computed from
FINGERPRINT = "checkpoint/sha256"
FeatureScores = dict[str, dict[str, np.ndarray]]  # split → score → (N,)


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


def spec_label(path: str | Path) -> str:
    """A spec file as a run's name shows it: ``FOLDER/STEM`` (``digits/h_sto``), or ``STEM``
    for a spec in the working folder."""
    path = Path(path)
    folder = path.resolve().parent
    if folder == Path.cwd().resolve():
        return path.stem
    return f"{folder.name}/{path.stem}"


def run_name(model: str | Path, inference: str | Path, separator: str = "-") -> str:
    """The default name of a run folder of two spec files: ``digits-h_sto-map``."""
    return f"{spec_label(model).replace('/', '-')}{separator}{Path(inference).stem}"


def staging_folder(out: Path) -> Path:
    """``DIR.partial``: where a fit into ``DIR`` writes until the run is complete."""
    return out.with_name(out.name + ".partial")


def open_staging(
    out: Path, texts: dict[str, str], identity: dict, progress: bool, force: bool = False
) -> Resumable:
    """The staging folder of a fit into ``out``, continued if it holds this fit's resume file
    (``identity``: what must match), else new with the spec ``texts`` (it is replaced only if it
    holds nothing but a fit's files, or ``force``). A resume file that cannot be read is set
    aside as ``DIR.unreadable-resume.pt`` and the fit starts over."""
    staging = staging_folder(out)
    check_replaceable(staging, force, allowed=RUN_FILES | {RESUME})
    resume = staging / RESUME
    try:
        resumable = Resumable(resume, identity)
    except UnreadableCheckpoint as err:
        aside = out.with_name(out.name + ".unreadable-resume.pt")
        set_aside(err, aside, "the fit starts over")
        resumable = Resumable(resume, identity)
    if resumable.saved is None:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            write_text(staging / "model.toml", texts["model_spec"])
            write_text(staging / "inference.toml", texts["inference_spec"])
        except BaseException:  # a folder that cannot be written: nothing left behind
            shutil.rmtree(staging, ignore_errors=True)
            raise
    else:
        remove_temporary_files(staging)  # of writes a killed fit left unfinished
        if progress:
            print(f"resuming {staging} after epoch {resumable.saved['epoch']}", flush=True)
    return resumable


def keep_or_remove_staging(staging: Path) -> str:
    """After a fit that stopped: keep its staging folder if an epoch finished (the same command
    continues from it) or the run in it is complete, else remove it. Returns what was done, for
    the user."""
    resume = staging / RESUME
    if not resume.is_file() and (staging / "metrics.json").is_file():
        out = staging.with_name(staging.name.removesuffix(".partial"))
        return f"the complete run is kept in {staging}/; move it to {out} yourself"
    if resume.is_file():
        try:
            epoch = load_checkpoint(resume)["epoch"]
        except (ProbtransError, KeyError):
            epoch = "?"
        return (
            f"the state after epoch {epoch} is kept in {staging}/ (resume.pt, and checkpoint.pt "
            f"of the best epoch): the same command continues from it, other specs start over"
        )
    shutil.rmtree(staging, ignore_errors=True)
    return "no epoch had finished: nothing was kept"


def staged_copy(folder: Path) -> Path:
    """``DIR.evaluate.partial``: a copy of run folder ``folder`` for a command that rewrites
    some of its files, then puts it in place with :func:`replace_folder`. Files are hard links
    where the file system has them (every file is rewritten by renaming a new one over it, so
    the run's own files never change); a copy left by a killed command is replaced."""
    staging = folder.with_name(folder.name + ".evaluate.partial")
    if staging.exists():
        check_replaceable(staging)
        shutil.rmtree(staging)

    def link(source: str, target: str) -> None:
        try:
            os.link(source, target)
        except OSError:  # no hard links here (or across devices): a copy
            shutil.copy2(source, target)

    shutil.copytree(folder, staging, symlinks=True, copy_function=link)
    return staging


def replace_folder(new: Path, old: Path) -> None:
    """Move the finished ``new`` folder to ``old``, removing the previous run only afterwards
    (renames: no disk space needed)."""
    if not old.exists():
        new.rename(old)
        return
    trash = old.with_name(f".{old.name}.replaced-{os.getpid()}")
    shutil.rmtree(trash, ignore_errors=True)
    old.rename(trash)
    try:
        new.rename(old)
    except BaseException:
        trash.rename(old)  # the previous run back in place
        raise
    shutil.rmtree(trash)


def read_timing(folder: Path) -> dict[str, float]:
    """``timing.json`` of a run folder: ``train_seconds`` (summed over resumed sessions),
    ``epoch_seconds`` (the wall time of each epoch) and ``evaluate_seconds``; empty if the run
    has none."""
    path = folder / "timing.json"
    return read_json(path, expect=dict) if path.is_file() else {}


def write_probs(
    path: Path,
    probs: Probs,
    labels: dict[str, np.ndarray],
    energy: Energy,
    features: FeatureScores | None = None,
) -> None:
    """``probs.npz``: ``{variant}/{split}`` (S, N, C), ``labels/{split}`` (N,),
    ``energy.{variant}/{split}`` (N,), ``feature.{score}/{split}`` (N,) and ``checkpoint/sha256``,
    the :func:`checkpoint_fingerprint` of the run in the folder it is written into (by which it
    is known as that run's: :func:`probs_origin`)."""
    arrays = {f"{v}/{s}": p.astype(np.float32) for v, by in probs.items() for s, p in by.items()}
    fingerprint = checkpoint_fingerprint(Path(path).parent)
    if fingerprint is not None:
        arrays[FINGERPRINT] = np.array(fingerprint)
    arrays.update({f"labels/{split}": value for split, value in labels.items()})
    arrays.update(
        {
            f"{ENERGY}{v}/{s}": e.astype(np.float32)
            for v, by in energy.items()
            for s, e in by.items()
        }
    )
    arrays.update(
        {
            f"{FEATURE}{name}/{s}": value.astype(np.float32)
            for s, by in (features or {}).items()
            for name, value in by.items()
        }
    )
    write_npz(path, arrays)


@dataclass
class KeptPredictives:
    """What ``probs.npz`` keeps (:func:`read_probs`)."""

    probs: Probs  # variant → split → (S, N, C)
    labels: dict[str, np.ndarray]  # split → (N,)
    energy: Energy  # variant → split → (N,); none in runs written before they were kept
    features: FeatureScores  # split → score → (N,); none in runs without feature scores
    fingerprint: str | None = None  # of the checkpoint.pt computed from; None: not kept (old)

    def given(self, variant: str) -> dict[str, dict[str, np.ndarray]]:
        """split → score → (N,): the scores the network gives for ``variant``: its free energy
        and the run's feature-space scores (the same for every variant)."""
        return given_scores(self.energy.get(variant), self.features)


def given_scores(
    energy: dict[str, np.ndarray] | None, features: FeatureScores
) -> dict[str, dict[str, np.ndarray]]:
    """split → score → (N,): free energies (split → (N,)) and feature-space scores together, as
    :func:`probtrans.summary.summarise` takes them."""
    energy = energy or {}
    return {
        split: {**features.get(split, {}), **({"energy": energy[split]} if split in energy else {})}
        for split in set(energy) | set(features)
    }


def read_probs(path: Path) -> KeptPredictives:
    """Inverse of :func:`write_probs`. Checked: the plain predictive of the validation and test
    splits, (S, N, C) arrays whose N matches their split's labels; else an error naming the
    file."""
    probs: Probs = {}
    energy: Energy = {}
    features: FeatureScores = {}
    labels = {}
    arrays = read_npz(path)
    fingerprint = arrays.pop(FINGERPRINT, None)
    if fingerprint is not None and (fingerprint.ndim != 0 or fingerprint.dtype.kind != "U"):
        raise DamagedFile(path, f"an entry {FINGERPRINT} that is not a SHA-256 in hex")
    for key, value in arrays.items():
        variant, slash, split = key.partition("/")
        if not slash or not split:
            raise DamagedFile(path, f"an entry {key[:60]!r} that is not VARIANT/SPLIT")
        if variant == "labels":
            labels[split] = value
        elif variant.startswith(ENERGY):
            energy.setdefault(variant.removeprefix(ENERGY), {})[split] = value
        elif variant.startswith(FEATURE):
            features.setdefault(split, {})[variant.removeprefix(FEATURE)] = value
        else:
            probs.setdefault(variant, {})[split] = value
    for needed in ("plain/val", "plain/test"):
        variant, split = needed.split("/")
        if split not in probs.get(variant, {}):
            raise DamagedFile(path, f"no entry {needed} (damaged or not written by probtrans)")
    for variant, by_split in probs.items():
        for split, value in by_split.items():
            rows = labels.get(split)
            if value.ndim != 3 or rows is None or value.shape[1] != len(rows):
                raise DamagedFile(
                    path,
                    f"{variant}/{split} of shape {value.shape} does not match its labels "
                    f"({'none' if rows is None else len(rows)}): want (S, N, C)",
                )
    return KeptPredictives(
        probs, labels, energy, features, None if fingerprint is None else str(fingerprint)
    )


def checkpoint_fingerprint(folder: Path) -> str | None:
    """The SHA-256 (hex) of the bytes of ``folder/checkpoint.pt`` (None without one): what the
    run's ``probs.npz`` keeps. A checkpoint's bytes depend on nothing but its content
    (:func:`probtrans.checkpoint.save_checkpoint`)."""
    path = folder / "checkpoint.pt"
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def probs_origin(folder: Path, kept: KeptPredictives) -> str:
    """Whose ``probs.npz`` ``kept`` (read from ``folder``) is: ``"this run"`` (computed from
    the folder's ``checkpoint.pt``), ``"another run"`` (from another checkpoint: copied from
    another run, or left by an earlier fit), or ``"unknown"`` (a ``probs.npz`` written before
    it kept its checkpoint's fingerprint, or a folder without a checkpoint)."""
    own = checkpoint_fingerprint(folder)
    if kept.fingerprint is None or own is None:
        return "unknown"
    return "this run" if kept.fingerprint == own else "another run"


def read_feature_density(path: Path) -> FeatureDensity:
    """The feature-space scores kept in a run folder's ``feature_scores.npz``."""
    arrays = read_npz(path)
    with checked_read(path, "feature scores"):
        return FeatureDensity.from_arrays(arrays)


def check_samples(folder: Path, metrics: dict[str, Any], probs: Probs) -> None:
    """Refuse a run folder whose ``metrics.json`` and ``probs.npz`` come from two evaluations
    (their posterior sample counts differ)."""
    said, kept = metrics.get("posterior_samples"), len(probs["plain"]["test"])
    if said is not None and said != kept:
        raise DamagedFile(
            folder,
            f"metrics.json says {said} posterior samples but probs.npz holds {kept}: the files "
            f"come from two evaluations; run probtrans evaluate {folder} again",
        )
