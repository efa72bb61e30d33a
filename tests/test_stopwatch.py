"""The stopwatch's parts and the three significant figures of a duration at any scale."""

from __future__ import annotations

import time

import pytest

from probtrans.runtime.stopwatch import Stopwatch, duration


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.002134, "2.13 ms"),
        (0.0509, "50.9 ms"),
        (0.0009995, "999 µs"),  # rounds within its unit
        (0.00099951, "1.00 ms"),  # rounds up into the next one
        (1.234, "1.23 s"),
        (0.99951, "1.00 s"),
        (184.2, "184 s"),
        (1234.5, "1230 s"),
        (1.2345e-05, "12.3 µs"),
        (4e-07, "0.400 µs"),
        (0.0, "0 s"),
    ],
)
def test_a_duration_has_three_significant_figures_in_its_unit(seconds, text):
    assert duration(seconds) == text


def test_a_part_that_runs_twice_sums_its_seconds():
    stopwatch = Stopwatch()
    for _ in range(2):
        with stopwatch.part("sleep"):
            time.sleep(0.01)
    assert list(stopwatch.seconds) == ["sleep"] and 0.02 <= stopwatch.seconds["sleep"] < 1.0
