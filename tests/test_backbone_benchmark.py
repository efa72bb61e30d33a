"""``benchmarks/pretrained.py`` on a tiny BERT: the three configurations run (each in its own
process) and the table gives both ratios."""

from __future__ import annotations

import re

from benchmarks.pretrained import main
from tests.conftest import ROOT

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


def test_a_preset_times_each_training_against_the_plain_transformers_loop(tmp_path, capsys):
    """``--preset``: one row per training of the preset (two methods that differ only by their
    post-hoc variant share one) and the plain loop, with each step's ratio to the loop's."""
    from tests.tiny_backbones import save_tiny_backbone

    backbone = save_tiny_backbone("bert", tmp_path / "bert")
    model = '[data]\nname = "cola"\nmax_len = 16\n\n[model]\nbackbone = "{}"\ndropout = 0.0\n'
    (tmp_path / "plain.toml").write_text(
        model.format(backbone) + '\n[model.prior]\nweights = "none"\n'
    )
    (tmp_path / "h_sto.toml").write_text(
        model.format(backbone) + '\n[model.swap]\nlayers = [-1]\nattention = { kind = "h_sto" }\n'
    )
    preset = tmp_path / "results" / "presets" / "tiny.toml"
    preset.parent.mkdir(parents=True)
    methods = [
        ("plain", "plain.toml", "finetune.toml", ""),
        ("MAP", "plain.toml", "finetune_map.toml", ""),
        ("MC dropout", "plain.toml", "finetune_map.toml", 'variant = "mc_dropout"\n'),
        ("H-STO", "h_sto.toml", "finetune_swapped.toml", ""),
    ]
    preset.write_text(
        "".join(
            f'[[method]]\nname = "{name}"\nmodel = "{tmp_path / model}"\n'
            f'inference = "{ROOT / "inference" / "text" / inference}"\n{extra}\n'
            for name, model, inference, extra in methods
        )
    )
    results = main(["--preset", str(preset), "--batch", "4", "--length", "8", "--steps", "1"])
    out = capsys.readouterr().out
    assert list(results) == ["transformers", "t0", "t1", "t2"]  # MC dropout trains as MAP
    assert all(result["seconds"] > 0 for result in results.values())
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("MAP", "H-STO"))]
    assert len(rows) == 2 and all(re.fullmatch(r"\d+\.\d\d×", row[-3]) for row in rows), out
    assert "an epoch of 8551 examples = 2138 steps" in out
