"""Checkpoints that load without executing pickled code.

A checkpoint holds only tensors, numbers, strings and containers of them (state dicts, spec texts,
metadata). It is written atomically (:func:`probtrans.io.atomic_write`) and read with
``torch.load(weights_only=True)``, which refuses anything else.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from probtrans import __version__
from probtrans.errors import ProbtransError
from probtrans.io import atomic_write

FORMAT = 1


def save_checkpoint(path: str | os.PathLike[str], payload: dict[str, Any]) -> None:
    """Save ``payload`` with the checkpoint format and the library version."""
    data = {"format": FORMAT, "probtrans_version": __version__, **payload}
    atomic_write(path, lambda tmp: torch.save(data, tmp))


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint`, refusing anything but plain data."""
    path = Path(path)
    if not path.is_file():
        raise ProbtransError(f"{path}: no checkpoint here")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # unpickling refused, or a corrupt file
        raise ProbtransError(f"{path}: not a readable probtrans checkpoint ({err})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ProbtransError(f"{path}: not a probtrans checkpoint of format {FORMAT}")
    return data
