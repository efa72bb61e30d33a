"""Atomic checkpoints that load without executing pickled code.

A checkpoint holds only tensors, numbers and strings: the classifier and guide state dicts, the
model and inference spec files as text, the seed, the epoch and the library version. It is read
with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from probtrans.errors import ProbtransError

FORMAT = 1


def atomic_write(path: Path, write: Any) -> None:
    """Write a file through ``write(tmp_path)`` into a temporary sibling, then rename it over
    ``path``: readers never see a half-written file, and a failure leaves the old file intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """Save ``payload`` (state dicts, spec texts, metadata) atomically."""
    from probtrans import __version__

    data = {"format": FORMAT, "probtrans_version": __version__, **payload}
    atomic_write(path, lambda tmp: torch.save(data, tmp))


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint`, refusing anything but plain data."""
    path = Path(path)
    if not path.is_file():
        raise ProbtransError(f"{path}: no checkpoint here")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # unpickling refused or corrupt file
        raise ProbtransError(f"{path}: not a readable probtrans checkpoint ({err})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ProbtransError(f"{path}: not a probtrans checkpoint of format {FORMAT}")
    return data
