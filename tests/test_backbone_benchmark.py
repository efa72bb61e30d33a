"""``benchmarks/pretrained.py`` on a tiny BERT: the three configurations run (each in its own
process) and the table gives both ratios."""

from __future__ import annotations

import re

from benchmarks.pretrained import main

TINY = ["--hidden", "32", "--heads", "2", "--layers", "2", "--steps", "2"]


def test_the_benchmark_prints_both_ratios(capsys):
    results = main([*TINY, "--batch", "4", "--length", "16"])
    out = capsys.readouterr().out
    assert set(results) == {"plain", "lora", "svi"}
    for result in results.values():
        assert result["seconds"] > 0 and result["process_peak_mib"] > 0
    assert "width 32, 2 layers, 2 heads" in out
    assert re.search(r"step time \(goal ≤ 1\.5×\)\s+\d+\.\d\d×", out), out
    assert re.search(r"step peak memory \(goal ≤ 1\.3×\)\s+\d+\.\d\d×", out), out
