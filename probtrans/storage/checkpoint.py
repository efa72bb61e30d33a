"""Checkpoints that load without executing pickled code.

A checkpoint holds only tensors, numbers, strings and containers of them (state dicts, spec texts,
metadata). It is serialised in memory (so its bytes do not depend on a file name, and a write
the disk refuses is Python's own ``OSError``, not PyTorch's), written atomically
(:func:`probtrans.storage.io.write_bytes`), and read with ``torch.load(weights_only=True)``, which
refuses anything else.
"""

from __future__ import annotations

import errno
import io
import os
import pickle
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from probtrans import __version__
from probtrans.errors import ProbtransError
from probtrans.storage.io import DamagedFile, checked_read, write_bytes

FORMAT = 1
T = TypeVar("T")


class UnreadableCheckpoint(ProbtransError):
    """A checkpoint file that exists but cannot be used: empty, truncated, refused or incomplete."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        super().__init__(f"{path}: not a readable probtrans checkpoint ({reason})")


def save_checkpoint(path: str | os.PathLike[str], payload: dict[str, Any]) -> None:
    """Save ``payload`` with the checkpoint format and the library version."""
    data = {"format": FORMAT, "probtrans_version": __version__, **payload}
    buffer = io.BytesIO()
    torch.save(data, buffer)
    write_bytes(path, buffer.getvalue())


def _reason(err: Exception) -> str:
    """One line for why ``torch.load(weights_only=True)`` refused a file (PyTorch's own text
    runs to several lines and suggests ``weights_only=False``)."""
    text = str(err)
    if isinstance(err, pickle.UnpicklingError):
        found = re.search(r"Unsupported global: GLOBAL (\S+)", text)
        if found:
            name = found.group(1)
            return f"it holds a Python object ({name}), not only plain data; refused, not run"
        return "corrupt, or not written by torch.save"
    if "zip archive" in text or getattr(err, "errno", None) == errno.EINVAL:  # an archive cut short
        return "corrupt or truncated"
    lines = text.strip().splitlines()
    return lines[0] if lines else type(err).__name__


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint`, refusing anything but plain data.

    A missing file raises :class:`~probtrans.errors.ProbtransError`; one that exists but cannot
    be used raises :class:`UnreadableCheckpoint`."""
    path = Path(path)
    if not path.is_file():
        raise ProbtransError(f"{path}: no checkpoint here")
    if path.stat().st_size == 0:
        raise UnreadableCheckpoint(path, "empty file")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # unpickling refused, or a corrupt file
        raise UnreadableCheckpoint(path, _reason(err)) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UnreadableCheckpoint(path, f"not of probtrans checkpoint format {FORMAT}")
    return data


def require(data: dict[str, Any], path: Path, keys: list[str]) -> dict[str, Any]:
    """``data`` if it holds every key, else :class:`UnreadableCheckpoint` naming the missing."""
    missing = [key for key in keys if key not in data]
    if missing:
        raise UnreadableCheckpoint(path, f"incomplete: no {', '.join(missing)}")
    return data


def load_cached(
    path: Path, keys: list[str], check: Callable[[dict[str, Any]], T] | None = None
) -> T | dict[str, Any] | None:
    """A cache file written by :func:`save_checkpoint` with every key of ``keys``, and what
    ``check(payload)`` makes of it (it parses and checks every part the caller uses, raising
    on any problem); None if there is none, or if it cannot be used (unreadable, incomplete,
    or refused by ``check``): then it is set aside as ``NAME.unreadable`` (replacing an older
    one, never deleted) with a note, for the caller to rebuild."""
    if not path.is_file():
        return None
    try:
        payload = require(load_checkpoint(path), path, keys)
        if check is None:
            return payload
        with checked_read(path, "content"):
            return check(payload)
    except (UnreadableCheckpoint, DamagedFile) as err:
        set_aside(err, path.with_name(path.name + ".unreadable"), "rebuilt", what="cache ")
        return None


def set_aside(
    err: UnreadableCheckpoint | DamagedFile, aside: Path, then: str, what: str = ""
) -> None:
    """Rename the unreadable file of ``err`` to ``aside`` (never delete it) and say so, and
    what happens ``then``."""
    os.replace(err.path, aside)
    print(f"note: {what}{err}; set aside as {aside}; {then}", file=sys.stderr)
