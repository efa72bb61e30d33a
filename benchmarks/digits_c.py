"""Digits-C: calibration under distribution shift on the embedded digits, the analogue of the
SGPA paper's CIFAR-10-C study (Chen & Li, ICLR 2023; corruptions in the manner of Hendrycks &
Dietterich 2019, :mod:`probtrans.data.corruptions`).

Fits TRANS (softmax attention; its MC dropout predictive from the same weights), H-STO and SGPA
on the default digits split (or reuses the runs in ``--out``), evaluates each on the in-domain
test split corrupted by every corruption at severities 1–5 (``probtrans evaluate --ood
NAME=digits-c:CORRUPTION:SEVERITY``), and prints accuracy, NLL and ECE per method and severity,
averaged over the corruptions (severity 0: the clean test split). Writes the figure
``benchmarks/digits_c.png`` (accuracy, NLL and ECE against severity, one line per method)::

    python benchmarks/digits_c.py [--out runs/digits-c] [--figure benchmarks/digits_c.png]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

import probtrans
from probtrans.data.corruptions import CORRUPTIONS, SEVERITIES
from probtrans.runs import evaluate_run
from probtrans.specs.model import OodSetSpec
from probtrans.storage.io import read_json, save_png

ROOT = Path(__file__).resolve().parents[1]
#: method → (model spec, inference spec, predictive variant)
METHODS = {
    "TRANS": ("models/digits/trans.toml", "inference/map_dropout.toml", "plain"),
    "MC dropout": ("models/digits/trans.toml", "inference/map_dropout.toml", "mc_dropout"),
    "H-STO": ("models/digits/h_sto.toml", "inference/map.toml", "plain"),
    "SGPA": ("models/digits/sgpa.toml", "inference/sgpa.toml", "plain"),
}
MEASURES = ("accuracy", "nll", "ece")


def shifted_sets() -> list[OodSetSpec]:
    return [
        OodSetSpec(name=f"{name}-{severity}", source=f"digits-c:{name}:{severity}")
        for name in CORRUPTIONS
        for severity in SEVERITIES
    ]


def evaluated_run(model: str, inference: str, out: Path) -> dict:
    """The metrics of the run of ``model`` + ``inference`` in ``out``, fitted if missing, with
    every corrupted set evaluated."""
    folder = out / f"{Path(model).stem}-{Path(inference).stem}"
    if not (folder / "metrics.json").is_file():
        probtrans.fit(ROOT / model, ROOT / inference, out=folder, progress=False)
    if "gaussian_noise-1" not in read_json(folder / "metrics.json")["ood"]:
        evaluate_run(folder, ood=shifted_sets())
    return read_json(folder / "metrics.json")


def by_severity(scores: dict, variant: str) -> dict[str, list[float]]:
    """measure → its value at severity 0 (clean) … 5, averaged over the corruptions."""
    prefix = "" if variant == "plain" else f"{variant}."
    sets = scores[f"{prefix}ood"]
    result = {}
    for measure in MEASURES:
        curve = [scores[f"{prefix}{measure}"]]
        for severity in SEVERITIES:
            curve.append(float(np.mean([sets[f"{c}-{severity}"][measure] for c in CORRUPTIONS])))
        result[measure] = curve
    return result


def figure(curves: dict[str, dict[str, list[float]]]) -> Figure:
    fig = Figure(figsize=(12.0, 3.8), layout="constrained")
    labels = {"accuracy": "accuracy", "nll": "NLL (nats)", "ece": "ECE"}
    for ax, measure in zip(fig.subplots(1, 3), MEASURES, strict=True):
        for method, curve in curves.items():
            ax.plot(range(len(curve[measure])), curve[measure], marker="o", label=method)
        ax.set_xlabel("corruption severity (0 = clean)")
        ax.set_ylabel(labels[measure])
        ax.set_xticks(range(len(SEVERITIES) + 1))
        ax.grid(alpha=0.3)
    fig.axes[0].legend()
    fig.suptitle(f"digits-C: mean over {len(CORRUPTIONS)} corruptions, 289 test digits each")
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/digits-c", help="folder of the runs")
    parser.add_argument("--figure", default=str(ROOT / "benchmarks" / "digits_c.png"))
    args = parser.parse_args()
    started = time.perf_counter()
    curves = {}
    for method, (model, inference, variant) in METHODS.items():
        curves[method] = by_severity(evaluated_run(model, inference, Path(args.out)), variant)
    print("| method | measure | " + " | ".join(f"s{s}" for s in (0, *SEVERITIES)) + " |")
    print("|---|---|" + "---|" * (len(SEVERITIES) + 1))
    for method, curve in curves.items():
        for measure in MEASURES:
            values = " | ".join(f"{v:.3f}" for v in curve[measure])
            print(f"| {method} | {measure} | {values} |")
    save_png(figure(curves), args.figure)
    print(f"wrote {os.path.relpath(args.figure)} in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
