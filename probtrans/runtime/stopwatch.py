"""Where the seconds of a long computation go: :class:`Stopwatch` sums the wall time of its
named parts (evaluation writes them to a run's ``timing.json`` as ``evaluate_parts``), and
:func:`duration` writes a time to three significant figures at any scale (the benchmarks)."""

from __future__ import annotations

import math
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


def duration(seconds: float) -> str:
    """``seconds`` to three significant figures in s, ms or µs: ``"2.13 ms"``, ``"51.0 ms"``,
    ``"1.23 s"``, ``"184 s"``, ``"1230 s"``."""
    if seconds == 0:
        return "0 s"
    rounded = float(f"{seconds:.3g}")
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(rounded) >= scale or unit == "µs":
            value = round(rounded / scale, 9)
            digits = max(0, 2 - math.floor(math.log10(abs(value))))
            return f"{value:.{digits}f} {unit}"
    raise AssertionError("unreachable")
