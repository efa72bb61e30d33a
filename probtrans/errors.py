"""User-facing errors: one clear message naming the file, field or shape."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class ProbtransError(Exception):
    """A problem with the user's input (spec, file, data); the CLI prints it without a traceback."""


class ConfigError(ProbtransError):
    """A model or inference spec is invalid; the message names the file and the field."""


@contextmanager
def in_file(source: str) -> Iterator[None]:
    """Start the message of a ConfigError raised inside the block with ``source`` (the spec
    file) unless it already does, e.g. a data loader's ``data.patch_size = 3: ...``."""
    try:
        yield
    except ConfigError as err:
        if str(err).startswith(f"{source}:"):
            raise
        raise ConfigError(f"{source}: {err}") from None


#: why the machine refused a write (not a fault of probtrans or of the input), by errno
WRITE_REFUSED = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file too large for the file system",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}


class WriteRefused(ProbtransError):
    """A file that could not be written: the disk is full, the folder read-only, ..."""

    def __init__(self, path: str | os.PathLike[str], cause: str) -> None:
        self.path = Path(path)
        self.cause = cause
        super().__init__(f"{self.path.parent}: cannot write {self.path.name}: {cause}")


def refused_write(err: OSError, path: str | os.PathLike[str] | None = None) -> WriteRefused | None:
    """``err`` as a :class:`WriteRefused` of ``path`` (default: the error's own file name) if
    its errno is one of :data:`WRITE_REFUSED`, else None."""
    target = path if path is not None else err.filename
    if err.errno not in WRITE_REFUSED or target is None:
        return None
    return WriteRefused(target, WRITE_REFUSED[err.errno])
