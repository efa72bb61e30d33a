"""Progress bars that suit where they are shown.

On a terminal, :func:`progress_bar` is tqdm's bar, redrawn in place (in a notebook, tqdm's
widget). When standard error is neither (a log file, a scheduler's output, a pipe), redraw
codes would fill the log: the bar then writes one plain line at its start, one every
:data:`LOG_INTERVAL` seconds and one at its end (:class:`LineStream`), e.g.
``epoch 2:  41%|####      | 82/199 [01:05<01:33,  1.25step/s]``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from tqdm.auto import tqdm

#: seconds between two lines of a bar whose output is not a terminal
LOG_INTERVAL = 30.0
#: the terminal codes a bar writes to redraw itself (carriage return, cursor moves, erasing)
REDRAW = re.compile(r"\r|\x1b\[[0-9;]*[A-Za-z]")
#: tqdm.auto chose its notebook widget (it did so on import: inside a Jupyter kernel)
NOTEBOOK = any(kind.__module__ == "tqdm.notebook" for kind in tqdm.__mro__)


class LineStream:
    """A stream for a tqdm bar that writes each state of the bar as one plain line: the redraw
    codes removed, blank states (a finished bar erasing itself) dropped."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        line = REDRAW.sub("", text).strip()
        if line:
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


def progress_bar(iterable: Iterable[Any] | None = None, **options: Any) -> tqdm:
    """tqdm's bar over ``iterable`` with ``options`` (``desc``, ``total``, ``disable``, ...) on
    a terminal; elsewhere plain lines every :data:`LOG_INTERVAL` seconds (module docstring)."""
    stream = options.get("file", sys.stderr)
    if not options.get("disable") and not NOTEBOOK and not _is_terminal(stream):
        options = {"mininterval": LOG_INTERVAL, "ascii": True, "ncols": 100, **options}
        options["file"] = LineStream(stream)
    return tqdm(iterable, **options)


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


@contextmanager
def no_thread_left() -> Iterator[None]:
    """tqdm starts a monitor thread with its first bar (it watches for stalled bars) and keeps
    it for the life of the process: one that a bar inside the block started is stopped when the
    block ends, so the caller's process has no thread it did not have; also a decorator."""
    before = tqdm.monitor
    try:
        yield
    finally:
        if before is None and tqdm.monitor is not None:
            tqdm.monitor.exit()
            tqdm.monitor = None
