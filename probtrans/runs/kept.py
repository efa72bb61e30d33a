"""What a run folder keeps of its evaluation besides the tables: ``probs.npz`` (the predictive
of every split and variant, the free energies and feature-space scores, and the SHA-256 of the
``checkpoint.pt`` they were computed from, :func:`probs_origin`), ``feature_scores.npz`` (the
fitted feature-space scores) and the check that ``metrics.json`` and ``probs.npz`` come from one
evaluation."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from probtrans.analysis.feature_scores import FittedScores
from probtrans.analysis.results import PLAIN, RunMetrics
from probtrans.errors import ProbtransError
from probtrans.inference.posthoc import Energy, Probs
from probtrans.storage.io import DamagedFile, checked_read, read_npz, write_npz

#: the prefix of the free energies' keys in ``probs.npz``
ENERGY = "energy."
#: the prefix of the feature-space scores' keys in ``probs.npz``
FEATURE = "feature."
#: the key of ``probs.npz`` holding the SHA-256 of the ``checkpoint.pt`` it was computed from
FINGERPRINT = "checkpoint/sha256"
FeatureScores = dict[str, dict[str, np.ndarray]]  # split → score → (N,)


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
    :func:`probtrans.analysis.summary.summarise` takes them."""
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
    run's ``probs.npz`` and saved data keep. A checkpoint's bytes depend on nothing but its
    content (:func:`probtrans.storage.checkpoint.save_checkpoint`). Computed once per file: an
    evaluation asks for it several times (loading the run, writing ``probs.npz`` and the data),
    and the staging copy of a run is a hard link of its checkpoint; a checkpoint is written
    atomically, as a new file, so a rewritten one is read again."""
    path = folder / "checkpoint.pt"
    if not path.is_file():
        return None
    stat = path.stat()
    identity = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)  # a hard link's too
    if identity not in _FINGERPRINTS:
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        if len(_FINGERPRINTS) >= 16:  # a handful of runs per process at most
            _FINGERPRINTS.clear()
        _FINGERPRINTS[identity] = digest.hexdigest()
    return _FINGERPRINTS[identity]


#: file identity (device, inode, size, modification time) → the SHA-256 of its bytes
_FINGERPRINTS: dict[tuple[int, ...], str] = {}


def probs_origin(folder: Path, kept: KeptPredictives) -> str:
    """Whose ``probs.npz`` ``kept`` (read from ``folder``) is: ``"this run"`` (computed from
    the folder's ``checkpoint.pt``), ``"another run"`` (from another checkpoint: copied from
    another run, or left by an earlier fit), or ``"unknown"`` (a ``probs.npz`` written before
    it kept its checkpoint's fingerprint, or a folder without a checkpoint)."""
    own = checkpoint_fingerprint(folder)
    if kept.fingerprint is None or own is None:
        return "unknown"
    return "this run" if kept.fingerprint == own else "another run"


def write_feature_scores(path: Path, fitted: FittedScores) -> None:
    """``feature_scores.npz``: the fitted scores
    (:meth:`~probtrans.analysis.feature_scores.FittedScores.to_arrays`) and the
    :func:`checkpoint_fingerprint` of the run in the folder it is written into."""
    arrays = fitted.to_arrays()
    fingerprint = checkpoint_fingerprint(Path(path).parent)
    if fingerprint is not None:
        arrays[FINGERPRINT] = np.array(fingerprint)
    write_npz(path, arrays)


def read_feature_scores(
    path: Path, n_classes: int | None = None, dim: int | None = None
) -> FittedScores:
    """The feature-space scores kept in a run folder's ``feature_scores.npz``. Checked: fitted
    from the folder's own checkpoint (where the file says which), consistent
    (:meth:`~probtrans.analysis.feature_scores.FittedScores.check`: shapes, k, finite values) and,
    given them, of the run's ``n_classes`` and feature width ``dim``; else a
    :class:`DamagedFile` naming the file."""
    arrays = dict(read_npz(path))
    fingerprint = arrays.pop(FINGERPRINT, None)
    own = checkpoint_fingerprint(Path(path).parent)
    if fingerprint is not None and own is not None and str(fingerprint) != own:
        raise DamagedFile(
            path, "fitted for another checkpoint than this run's (copied from another run?)"
        )
    with checked_read(path, "feature scores"):
        try:
            fitted = FittedScores.from_arrays(arrays)
        except ProbtransError as err:
            raise DamagedFile(path, str(err).removeprefix("feature scores: ")) from None
    for what, kept, run in (
        ("classes", fitted.n_classes, n_classes),
        ("dimensions", fitted.dim, dim),
    ):
        if run is not None and kept != run:
            raise DamagedFile(path, f"fitted for {kept} {what}; this run's network has {run}")
    return fitted


def check_samples(folder: Path, metrics: dict[str, Any], probs: Probs) -> None:
    """Refuse a run folder whose ``metrics.json`` and ``probs.npz`` come from two evaluations
    (their posterior sample counts differ)."""
    said, kept = RunMetrics.from_json(metrics).posterior_samples, len(probs[PLAIN]["test"])
    if said is not None and said != kept:
        raise DamagedFile(
            folder,
            f"metrics.json says {said} posterior samples but probs.npz holds {kept}: the files "
            f"come from two evaluations; run probtrans evaluate {folder} again",
        )
