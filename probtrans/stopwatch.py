"""Where the seconds of a long computation go: :class:`Stopwatch` sums the wall time of its
named parts (evaluation writes them to a run's ``timing.json`` as ``evaluate_parts``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class Stopwatch:
    """Wall-clock seconds by part name, summed over every time the part runs."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Time the block as part ``name`` (added to what ``name`` already holds)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - started
            self.seconds[name] = self.seconds.get(name, 0.0) + spent
