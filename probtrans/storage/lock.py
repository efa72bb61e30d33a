"""An exclusive lock on a folder that a command writes (a run folder, a comparison's runs).

The lock is the file ``DIR.lock`` beside ``DIR``, held with ``fcntl.flock`` for as long as the
command writes, and holding a line that names its holder (process id, host, command, start time).
The operating system releases the lock when its holder exits, however it exits, so a second
command on the same folder is refused only while the first is alive. A holder killed before it
could remove the file leaves a *stale* lock: the next command takes it over and says whose it was.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from probtrans.errors import ProbtransError, refused_write


def lock_path(folder: Path) -> Path:
    """The lock file of ``folder``: ``DIR.lock`` beside it."""
    return folder.with_name(folder.name + ".lock")


def _holder(command: str) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    return f"pid {os.getpid()} on host {socket.gethostname()} ({command}, started {started})"


def _read(fd: int) -> str:
    return os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()


def _acquire(path: Path) -> int:
    """An open descriptor of ``path`` holding its flock; refuses while another process holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd) or "another process"
            os.close(fd)
            raise ProbtransError(
                f"{path.with_suffix('')}: in use by {holder}; wait for it to finish, or choose "
                f"another folder"
            ) from None
        try:  # the holder we waited for may have removed the file in between: lock the new one
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


@contextmanager
def folder_lock(folder: str | os.PathLike[str], command: str) -> Iterator[None]:
    """Hold the lock of ``folder`` while the block runs (``command`` names the holder)."""
    path = lock_path(Path(folder))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = _acquire(path)
    except OSError as err:  # a read-only folder, a full disk: named
        raise refused_write(err, path) or err from None
    try:
        stale = _read(fd)
        if stale:
            print(f"note: {path}: took over the stale lock of {stale}", file=sys.stderr)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (_holder(command) + "\n").encode(), 0)
        except OSError as err:
            raise refused_write(err, path) or err from None
        yield
    finally:
        os.unlink(path)
        os.close(fd)
