"""Files written atomically: text, JSON, PNG figures and NPZ arrays.

Every writer goes through :func:`atomic_write`: the content is written into a temporary sibling
and renamed over the target, so a reader never sees a half-written file and a failure leaves the
previous file as it was. A writer killed before the rename leaves its temporary sibling
(``.NAME.*.partial``) behind; :func:`remove_temporary_files` clears a folder of them.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from probtrans.errors import ProbtransError

_TEMPORARY = ".{name}.*.partial"  # the temporary siblings of atomic_write


def atomic_write(path: str | os.PathLike[str], write: Callable[[Path], Any]) -> Path:
    """Write ``path`` through ``write(tmp_path)`` into a temporary sibling, then rename it over
    ``path``. Creates missing parent folders; returns ``path`` as a :class:`~pathlib.Path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prefix, suffix = _TEMPORARY.format(name=path.name).split("*")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=suffix)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o666 & ~_umask())  # as open() would create it, not mkstemp's 0600
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _umask() -> int:
    """The process's file-creation mask (read by setting it, then set back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def is_temporary_file(path: Path) -> bool:
    """Whether ``path`` is the temporary file of an :func:`atomic_write`."""
    return path.match(_TEMPORARY.format(name="*"))


def remove_temporary_files(folder: str | os.PathLike[str]) -> list[Path]:
    """Delete the temporary files that interrupted :func:`atomic_write` calls left in
    ``folder``; returns them."""
    found = sorted(Path(folder).glob(_TEMPORARY.format(name="*")))
    for path in found:
        path.unlink()
    return found


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text))


def write_json(path: str | os.PathLike[str], value: object) -> Path:
    """``value`` as indented JSON with a final newline."""
    return write_text(path, json.dumps(value, indent=2) + "\n")


def read_json(path: str | os.PathLike[str]) -> Any:
    """The value of a JSON file; a missing or malformed file raises ProbtransError naming it."""
    path = Path(path)
    if not path.is_file():
        raise ProbtransError(f"{path}: no such file")
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ProbtransError(f"{path}: not a valid JSON file ({err})") from None


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
    """The arrays of an ``.npz`` file, refusing pickled objects; an unreadable file raises
    ProbtransError naming it."""
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):  # one .npy array, not named arrays
            raise ProbtransError(f"{path}: not an .npz archive of named arrays (one array)")
        with loaded as arrays:
            return {name: arrays[name] for name in arrays.files}
    except ValueError as err:  # numpy's text suggests allow_pickle, which is not safe here
        reason = "only pickled Python objects could be read, refused" * ("pickle" in str(err))
        raise ProbtransError(f"{path}: not a readable .npz file ({reason or err})") from None
    except (OSError, EOFError, zipfile.BadZipFile) as err:
        raise ProbtransError(f"{path}: not a readable .npz file ({err})") from None
