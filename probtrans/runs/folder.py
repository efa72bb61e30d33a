"""The run folder: its files, the staging folder a fit writes into, and the small files that
are not the model (``timing.json``, the :class:`RunInfo` in ``metrics.json``, the saved data;
``probs.npz``: :mod:`probtrans.runs.kept`).

Run folder (:data:`RUN_FILES`):
    model.toml, inference.toml   the specs, copied verbatim
    checkpoint.pt                classifier + guide state of the best validation epoch (for a
                                 guide given in Python, which cannot be rebuilt from a file: its
                                 posterior draws), and the spec texts (what ``load_run`` reads)
    history.json                 per-epoch ELBO and validation metrics
    metrics.json                 test metrics, OOD scores, temperature-scaled metrics, post-hoc
                                 variants (:func:`probtrans.analysis.summary.summarise`), PSIS-LOO
                                 (:mod:`probtrans.runs.evaluation`) and the :class:`RunInfo`
    probs.npz                    class probabilities (S, N, C) of every variant on the validation
                                 and test splits and every out-of-domain set, free energies (N,),
                                 feature-space scores (N,), and the SHA-256 of the checkpoint.pt
                                 they were computed from: a probs.npz of another checkpoint (a
                                 copy from another run) is not read as this run's
    feature_scores.npz           the feature-space scores fitted on the training split
                                 (:mod:`probtrans.analysis.feature_scores`), for new inputs
    predictive.nc                ArviZ InferenceData (NetCDF): the test posterior predictive, the
                                 posterior draws of the global sites and the training
                                 log-likelihood that ``az.loo`` reads
    report.png                   reliability with bin counts, entropy and mutual information in vs
                                 out of domain, OOD ROC, risk–coverage, training curves
                                 (:func:`probtrans.analysis.figures.run_figure`)
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
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probtrans.data import DataBundle
from probtrans.data.saved import DATA_FILES, save_bundle
from probtrans.errors import ProbtransError
from probtrans.hub import RUN_BACKBONE
from probtrans.inference.posthoc import needs_training_split
from probtrans.inference.train import Resumable
from probtrans.runs.kept import checkpoint_fingerprint
from probtrans.specs.inference import PredictiveSpec
from probtrans.storage.checkpoint import UnreadableCheckpoint, load_checkpoint, set_aside
from probtrans.storage.io import (
    is_temporary_file,
    read_json,
    remove_temporary_files,
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
#: the fitted feature-space scores (:class:`probtrans.analysis.feature_scores.FittedScores`)
FEATURE_FILE = "feature_scores.npz"
#: the resume file of a staging folder
RESUME = "resume.pt"


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
    ``epoch_seconds`` (the wall time of each epoch), ``evaluate_seconds`` and
    ``evaluate_parts`` (part → seconds: :func:`probtrans.runs.evaluation.evaluate`); empty if
    the run has none."""
    path = folder / "timing.json"
    return read_json(path, expect=dict) if path.is_file() else {}


def save_run_data(folder: Path, data: DataBundle, predictive: PredictiveSpec) -> None:
    """Keep the run's data in its folder (:mod:`probtrans.data.saved`), with its checkpoint's
    fingerprint; the training split too where a post-hoc predictive or the feature scores are
    fitted on it or PSIS-LOO reads its log-likelihood."""
    train = needs_training_split(predictive) or predictive.loo_samples != 0
    train = (train or predictive.feature_scores) and len(data.train) > 0
    save_bundle(folder, data, checkpoint_fingerprint(folder), train)
