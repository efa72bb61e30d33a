"""Files written atomically: text, JSON, PNG figures and NPZ arrays.

Every writer goes through :func:`atomic_write`: the content is written into a temporary sibling
and renamed over the target, so a reader never sees a half-written file and a failure leaves the
previous file as it was.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np


def atomic_write(path: str | os.PathLike[str], write: Callable[[Path], Any]) -> Path:
    """Write ``path`` through ``write(tmp_path)`` into a temporary sibling, then rename it over
    ``path``. Creates missing parent folders; returns ``path`` as a :class:`~pathlib.Path`."""
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
    return path


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text))


def write_json(path: str | os.PathLike[str], value: object) -> Path:
    """``value`` as indented JSON with a final newline."""
    return write_text(path, json.dumps(value, indent=2) + "\n")


def read_json(path: str | os.PathLike[str]) -> Any:
    return json.loads(Path(path).read_text())


def save_png(figure: Any, path: str | os.PathLike[str], dpi: int = 120) -> Path:
    """Render a matplotlib ``Figure`` to the PNG ``path``."""
    return atomic_write(path, lambda tmp: figure.savefig(tmp, format="png", dpi=dpi))


def write_npz(path: str | os.PathLike[str], arrays: Mapping[str, np.ndarray]) -> Path:
    """Compressed ``.npz`` of named arrays (names may contain ``/``)."""

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, **arrays)

    return atomic_write(path, write)


def read_npz(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file, refusing pickled objects."""
    with np.load(path, allow_pickle=False) as arrays:
        return {name: arrays[name] for name in arrays.files}
