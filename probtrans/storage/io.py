"""Files written atomically: text, JSON, PNG figures and NPZ arrays.

Every writer goes through :func:`atomic_write`: the content is written into a temporary sibling
and renamed over the target, so a reader never sees a half-written file and a failure leaves the
previous file as it was; :func:`write_together` does so for a set of files that must change
together, whatever signal comes. A writer killed before the rename leaves its temporary sibling
(``.NAME.*.partial``) behind; :func:`remove_temporary_files` clears a folder of them.
:class:`TemporaryFolder` is the lifetime of a result written into a temporary folder of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import threading
import weakref
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from probtrans.errors import ProbtransError, refused_write

_TEMPORARY = ".{name}.*.partial"  # the temporary siblings of atomic_write


def atomic_write(path: str | os.PathLike[str], write: Callable[[Path], Any]) -> Path:
    """Write ``path`` through ``write(tmp_path)`` into a temporary sibling, then rename it over
    ``path``. Creates missing parent folders; returns ``path`` as a :class:`~pathlib.Path`. A
    write the machine refuses (disk full, read-only folder: :data:`~probtrans.errors.
    WRITE_REFUSED`) raises :class:`~probtrans.errors.WriteRefused` naming ``path``; the previous
    file is left as it was either way."""
    path = Path(path)
    write_together({path: write})
    return path


def write_together(writes: Mapping[Path, Callable[[Path], Any]]) -> None:
    """Write several files as one set: each through ``write(tmp_path)`` into a temporary
    sibling (as :func:`atomic_write`), then all renamed into place while the stop signals are
    held back (:func:`signals_held`; one file's rename is atomic without it), so that a signal
    at any moment leaves every file as it was or every file new; a signal that came meanwhile
    is delivered after the renames. A failed or refused write leaves every file as it was."""
    written: dict[Path, str] = {}
    try:
        for path, write in writes.items():
            prefix, suffix = _TEMPORARY.format(name=path.name).split("*")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                fd, written[path] = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=suffix)
                os.close(fd)
                write(Path(written[path]))
                os.chmod(written[path], 0o666 & ~_umask())  # as open() would, not mkstemp's 0600
            except OSError as err:
                raise refused_write(err, path) or err from None
        with signals_held() if len(written) > 1 else nullcontext():  # one file: atomic alone
            for path, tmp in written.items():
                try:
                    os.replace(tmp, path)
                except OSError as err:
                    raise refused_write(err, path) or err from None
    finally:
        for tmp in written.values():
            if os.path.exists(tmp):
                os.unlink(tmp)


#: the signals a job scheduler (or ``timeout``, or a closed terminal) stops a command with;
#: the command handles them as Ctrl-C (:func:`probtrans.cli.stop_signals_as_interrupts`)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextmanager
def signals_held() -> Iterator[None]:
    """Inside the block Ctrl-C (SIGINT) and the :data:`STOP_SIGNALS` wait: their Python
    handlers only note them, and the first that arrived is raised again once the block ends and
    the handlers are back. (Blocking them with ``pthread_sigmask`` would not do: another thread
    of the process, torch's or tqdm's, receives a signal sent to the process.)"""
    if threading.current_thread() is not threading.main_thread():  # handlers are set there
        yield
        return
    arrived: list[int] = []
    held = [s for s in (signal.SIGINT, *STOP_SIGNALS) if signal.getsignal(s) is not None]
    previous = {s: signal.signal(s, lambda signum, _: arrived.append(signum)) for s in held}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if arrived:
            signal.raise_signal(arrived[0])


def write_bytes(path: str | os.PathLike[str], content: bytes) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_bytes(content))


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
    return atomic_write(path, text_writer(text))


def text_writer(text: str) -> Callable[[Path], Any]:
    """What writes ``text`` into a file (:func:`write_together`)."""
    return lambda tmp: tmp.write_text(text)


def write_json(path: str | os.PathLike[str], value: object) -> Path:
    """``value`` as indented JSON with a final newline."""
    return write_text(path, json_text(value))


def json_text(value: object) -> str:
    """``value`` as :func:`write_json` writes it: indented JSON with a final newline."""
    return json.dumps(value, indent=2) + "\n"


class TemporaryFolder:
    """Mixin of a result held in a folder ``self.path``: after :meth:`own_temporary_folder`, the
    folder (a temporary one made for it) is removed when the result is closed (:meth:`close`,
    or leaving ``with``) or collected, or the interpreter exits; otherwise it stays."""

    path: Path

    def own_temporary_folder(self) -> None:
        """Remove :attr:`path` when the result is closed or collected."""
        self._remove_folder = weakref.finalize(self, shutil.rmtree, self.path, True)

    def close(self) -> None:
        """Remove the temporary folder, if the result owns one."""
        remove = getattr(self, "_remove_folder", None)
        if remove is not None:
            remove()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class DamagedFile(ProbtransError):
    """A file that exists but cannot be used as what it should be; the message names it."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{path}: {reason}")


def check_is_file(path: str | os.PathLike[str], what: str = "file") -> Path:
    """``path`` if it is a file; else one error saying what is there instead."""
    path = Path(path)
    if path.is_dir():
        raise ProbtransError(f"{path}: is a folder, not a {what}")
    if not path.is_file():
        raise ProbtransError(f"{path}: no such {what}")
    return path


@contextmanager
def checked_read(path: str | os.PathLike[str], what: str) -> Iterator[None]:
    """Read ``path`` (a ``what``, e.g. "run's tokenizer") in the block: any error but a
    :class:`ProbtransError` becomes one :class:`DamagedFile` naming the file, what it should
    be and the first line of the cause."""
    try:
        yield
    except ProbtransError:
        raise
    except Exception as err:  # the parser's own error: a damaged file, whatever its type
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise DamagedFile(path, f"damaged {what} ({first})") from None


def read_json(path: str | os.PathLike[str], expect: type | None = None) -> Any:
    """The value of a JSON file; a missing or malformed file, or (``expect``) a value of
    another type, raises ProbtransError naming it."""
    path = check_is_file(path)
    try:
        value = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DamagedFile(path, f"not a valid JSON file ({err})") from None
    if expect is not None and not isinstance(value, expect):
        raise DamagedFile(path, f"holds {json_kind(value)}, not {json_kind(expect())}")
    return value


def json_kind(value: Any) -> str:
    """What a JSON value is, in words (for messages)."""
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    return "null" if value is None else kinds.get(type(value), "a number")


def save_png(figure: Any, path: str | os.PathLike[str], dpi: int = 120) -> Path:
    """Render a matplotlib ``Figure`` to the PNG ``path``."""
    return atomic_write(path, png_writer(figure, dpi))


def png_writer(figure: Any, dpi: int = 120) -> Callable[[Path], Any]:
    """What writes the matplotlib ``figure`` as a PNG file (:func:`write_together`)."""
    return lambda tmp: figure.savefig(tmp, format="png", dpi=dpi)


def write_npz(path: str | os.PathLike[str], arrays: Mapping[str, np.ndarray]) -> Path:
    """Compressed ``.npz`` of named arrays (names may contain ``/``)."""

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, **arrays)

    return atomic_write(path, write)


def read_npz(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file, refusing pickled objects; an unreadable file raises
    ProbtransError naming it and saying what it holds instead."""
    path = check_is_file(path)
    with open(path, "rb") as fh:
        head = fh.read(6)
    if head.startswith(b"\x93NUMPY"):
        raise DamagedFile(path, "one .npy array, not an .npz archive of named arrays")
    if not head.startswith(b"PK"):
        raise DamagedFile(path, f"not an .npz archive ({_shown(head)})")
    try:
        with np.load(path, allow_pickle=False) as arrays:
            return {name: arrays[name] for name in arrays.files}
    except ValueError as err:  # numpy's text suggests allow_pickle, which is not safe here
        reason = "it holds pickled Python objects, refused" if "pickle" in str(err) else err
        raise DamagedFile(path, f"not a readable .npz file ({reason})") from None
    except (OSError, EOFError, zipfile.BadZipFile) as err:
        raise DamagedFile(path, f"not a readable .npz file ({err})") from None


def _shown(head: bytes) -> str:
    """The first bytes of a file, for a message: empty, text, or escaped bytes."""
    if not head:
        return "it is empty"
    text = head.decode("ascii", "backslashreplace")
    looks = ", a text file?" if head.isascii() and head.decode().isprintable() else ""
    return f"it starts with {text!r}{looks}"
