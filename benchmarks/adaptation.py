"""Test-time adaptation under shift on digits-C (:mod:`probtrans.tta`).

Fits (or loads, ``--run DIR`` and ``--h-sto-run DIR``) the digits model with Gaussian-mixture
attention (``models/digits/gaussian_mixture.toml``) and the default H-STO digits model
(``models/digits/h_sto.toml``), both MAP (``inference/map.toml``), then predicts the test split,
clean and under every digits-C corruption at severities 1–5 (:mod:`probtrans.data.corruptions`,
corrupted as ``digits-c:NAME:SEVERITY`` corrupts it), with

- no adaptation, ``em`` (keys by EM, Eq. 29 of Movellan & Gabbur 2020), ``em`` with its
  precision step (keys, then query precisions, Eq. 29–30) and ``tent`` (entropy minimisation
  over the LayerNorm parameters) on the Gaussian-mixture model;
- no adaptation and ``tent`` on the H-STO model,

each with the defaults of :class:`~probtrans.tta.EmOptions` and
:class:`~probtrans.tta.TentOptions` (``precision=True`` aside), in batches of the runs'
``[predictive] batch_size`` examples. Prints the machine and commit, accuracy / NLL / ECE per
set and method, and their means over the corruptions per severity; writes the figure ``--plot``
(accuracy, NLL and ECE against severity, one line per method, and each adaptation's change in
accuracy against no adaptation of the same model).

``--tune`` instead searches the adaptation options on the *validation* split under the same
corruptions (never the test split) and prints every setting: the chosen one has the highest
validation accuracy averaged over severities 3–5 and the corruptions, among the settings that
lose at most 0.5 points of clean validation accuracy against no adaptation. The defaults of
``probtrans.tta`` come from this search::

    python benchmarks/adaptation.py [--run DIR] [--h-sto-run DIR] [--out runs/adaptation]
        [--plot benchmarks/adaptation.png] [--tune]
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import os
import platform
import subprocess
import time
from pathlib import Path

import numpy as np
import pyro
import torch
from matplotlib.figure import Figure

import probtrans
from probtrans.analysis import metrics
from probtrans.data import DataSplit
from probtrans.data.corruptions import CORRUPTIONS, SEVERITIES, corrupt
from probtrans.inference.predictive import sample_predictive
from probtrans.runs import Run
from probtrans.storage.io import save_png
from probtrans.tta import AdaptationOptions, EmOptions, TentOptions, adapted_predictive

ROOT = Path(__file__).resolve().parents[1]
GAUSSIAN_MIXTURE = "models/digits/gaussian_mixture.toml"
H_STO = "models/digits/h_sto.toml"
INFERENCE = "inference/map.toml"
#: method label → (model, adaptation: the defaults, and em with its precision step on)
METHODS: dict[str, tuple[str, AdaptationOptions | None]] = {
    "GM": ("gm", None),
    "GM + em": ("gm", EmOptions()),
    "GM + em (keys, α)": ("gm", EmOptions(precision=True)),
    "GM + tent": ("gm", TentOptions()),
    "H-STO": ("h_sto", None),
    "H-STO + tent": ("h_sto", TentOptions()),
}
MEASURES = ("accuracy", "nll", "ece")
#: the settings --tune tries
EM_GRID = [
    EmOptions(n_iter=n_iter, theta_xi=theta_xi, precision=precision, theta_alpha1=theta_alpha1)
    for n_iter, theta_xi, (precision, theta_alpha1) in itertools.product(
        (1, 3), (1.0, 3.0, 10.0, 30.0), ((False, 10.0), (True, 10.0), (True, 100.0))
    )
]
TENT_GRID = [
    TentOptions(steps=steps, lr=lr, optimizer=optimizer)
    for steps, lr, optimizer in (
        (1, 1e-3, "adam"),
        (1, 1e-2, "adam"),
        (3, 1e-3, "adam"),
        (3, 1e-2, "adam"),
        (3, 0.1, "sgd"),
    )
]


def machine() -> str:
    """The commit (``+`` when tracked files have changes), CPU, cores, torch and the date."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip()

    dirty = "+" if git("status", "--porcelain", "--untracked-files=no") else ""
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [
            line.split(":", 1)[1].strip()
            for line in cpuinfo.read_text().splitlines()
            if line.startswith("model name")
        ]
        cpu = names[0] if names else cpu
    return (
        f"commit {git('rev-parse', '--short', 'HEAD')}{dirty} · {cpu}, {os.cpu_count()} cores · "
        f"torch {torch.__version__} · {datetime.date.today().isoformat()}"
    )


def fitted(model: str, folder: Path, given: str | None) -> Run:
    """The run in ``given``, else the one in ``folder``, fitted there if missing."""
    if given:
        return Run.load(given)
    if not (folder / "metrics.json").is_file():
        probtrans.fit(ROOT / model, ROOT / INFERENCE, out=folder, progress=False)
    return Run.load(folder)


def shifted(split: DataSplit, seed: int) -> dict[str, DataSplit]:
    """``clean`` and ``NAME-SEVERITY`` for every corruption and severity."""
    sets = {"clean": split}
    images = split.inputs.numpy()
    for name in CORRUPTIONS:
        for severity in SEVERITIES:
            corrupted = torch.from_numpy(corrupt(images, name, severity, seed=seed))
            sets[f"{name}-{severity}"] = DataSplit(corrupted, split.labels)
    return sets


def predictive(
    run: Run, split: DataSplit, adapt: AdaptationOptions | None, batch: int
) -> np.ndarray:
    """The (adapted) posterior predictive (S, N, C) of ``split``, seeded as ``Run.predict``."""
    samples = run.predictive_samples()
    draws = run.posterior_samples(samples, seed=0)
    pyro.set_rng_seed(0)
    if adapt is None:
        return sample_predictive(run.classifier, None, split, samples, batch, draws=draws)["probs"]
    return adapted_predictive(run.classifier, None, split, adapt, samples, batch, draws=draws)[
        "probs"
    ]


def scores(probs: np.ndarray, labels: torch.Tensor) -> dict[str, float]:
    mean, y = metrics.predictive_mean(probs), labels.numpy()
    return {
        "accuracy": metrics.accuracy(mean, y),
        "nll": metrics.nll(mean, y),
        "ece": metrics.ece(mean, y),
    }


def by_severity(results: dict[str, dict[str, float]], measure: str) -> list[float]:
    """``measure`` at severity 0 (clean) … 5, averaged over the corruptions."""
    curve = [results["clean"][measure]]
    for severity in SEVERITIES:
        curve.append(float(np.mean([results[f"{c}-{severity}"][measure] for c in CORRUPTIONS])))
    return curve


def figure(curves: dict[str, dict[str, list[float]]], title: str) -> Figure:
    """Accuracy, NLL and ECE against severity, and the change in accuracy that each adaptation
    brings to its model (the difference is too small to see on the first panel)."""
    fig = Figure(figsize=(16.0, 3.8), layout="constrained")
    labels = {"accuracy": "accuracy", "nll": "NLL (nats)", "ece": "ECE"}
    axes = fig.subplots(1, 4)
    colours = {method: f"C{i}" for i, method in enumerate(curves)}
    for ax, measure in zip(axes, MEASURES, strict=False):
        for method, curve in curves.items():
            style = "--" if method.startswith("H-STO") else "-"
            ax.plot(curve[measure], style, color=colours[method], marker="o", label=method)
        ax.set_ylabel(labels[measure])
    for method, (model, options) in METHODS.items():
        if options is not None:
            base = next(m for m, (other, o) in METHODS.items() if other == model and o is None)
            change = 100 * (np.array(curves[method]["accuracy"]) - curves[base]["accuracy"])
            style = "--" if method.startswith("H-STO") else "-"
            axes[3].plot(change, style, color=colours[method], marker="o", label=method)
    axes[3].axhline(0.0, color="black", linewidth=0.8)
    axes[3].set_ylabel("accuracy change (points)")
    for ax in axes:
        ax.set_xlabel("corruption severity (0 = clean)")
        ax.set_xticks(range(len(SEVERITIES) + 1))
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(title)
    return fig


def benchmark(runs: dict[str, Run], batch: int | None, plot: str) -> None:
    seed = runs["gm"].model_spec.data.split_seed
    test = shifted(runs["gm"].data.test, seed)
    results: dict[str, dict[str, dict[str, float]]] = {}
    for method, (model, options) in METHODS.items():
        run = runs[model]
        size = batch or run.inference_spec.predictive.batch_size
        started = time.perf_counter()
        results[method] = {
            key: scores(predictive(run, split, options, size), split.labels)
            for key, split in test.items()
        }
        print(f"{method}: {time.perf_counter() - started:.0f} s", flush=True)
    print(f"\nEmOptions() = {EmOptions()}\nTentOptions() = {TentOptions()}\n")
    methods = list(METHODS)
    print(f"Per set (test split, N = {len(test['clean'])} each): accuracy / NLL / ECE")
    print("| set | " + " | ".join(methods) + " |")
    print("|---|" + "---|" * len(methods))
    for key in test:
        cells = [
            " / ".join(f"{results[m][key][measure]:.3f}" for measure in MEASURES) for m in methods
        ]
        print(f"| {key} | " + " | ".join(cells) + " |")
    print(f"\nMean over the {len(CORRUPTIONS)} corruptions per severity (0 = clean):")
    print("| method | measure | " + " | ".join(f"s{s}" for s in (0, *SEVERITIES)) + " |")
    print("|---|---|" + "---|" * (len(SEVERITIES) + 1))
    curves = {}
    for method in methods:
        curves[method] = {m: by_severity(results[method], m) for m in MEASURES}
        for measure in MEASURES:
            values = " | ".join(f"{v:.3f}" for v in curves[method][measure])
            print(f"| {method} | {measure} | {values} |")
    title = (
        f"digits-C test split, test-time adaptation; mean over {len(CORRUPTIONS)} corruptions, "
        f"{len(test['clean'])} digits each"
    )
    save_png(figure(curves, title), plot)
    print(f"\nwrote {plot}")


def tune(runs: dict[str, Run], batch: int | None) -> None:
    """Every setting of :data:`EM_GRID` (GM model) and :data:`TENT_GRID` (both models) on the
    corrupted validation split; the choice by the rule of the module docstring."""
    seed = runs["gm"].model_spec.data.split_seed
    val = shifted(runs["gm"].data.val, seed)

    def curve(run: Run, options: AdaptationOptions | None) -> list[float]:
        size = batch or run.inference_spec.predictive.batch_size
        results = {k: scores(predictive(run, s, options, size), s.labels) for k, s in val.items()}
        return by_severity(results, "accuracy")

    def search(name: str, grid: list, models: list[str]) -> None:
        base = {model: curve(runs[model], None) for model in models}
        print(f"\n{name}: validation accuracy, clean and mean over corruptions at s3–s5")
        for model in models:
            clean, severe = base[model][0], np.mean(base[model][3:])
            print(f"  no adaptation ({model}): clean {clean:.4f}, s3–s5 {severe:.4f}")
        best, best_gain = None, -np.inf
        for options in grid:
            gains, clean_ok, cells = [], True, []
            for model in models:
                c = curve(runs[model], options)
                gains.append(np.mean(c[3:]) - np.mean(base[model][3:]))
                clean_ok &= c[0] >= base[model][0] - 0.005 - 1e-9
                cells.append(f"{model}: clean {c[0]:.4f} s3–s5 {np.mean(c[3:]):.4f}")
            gain = float(np.mean(gains))
            note = "" if clean_ok else " (clean loss > 0.5 points)"
            print(f"  {options}: {'; '.join(cells)}; gain {gain:+.4f}{note}", flush=True)
            if clean_ok and gain > best_gain:
                best, best_gain = options, gain
        print(f"  chosen: {best} (gain {best_gain:+.4f})")

    search("em", EM_GRID, ["gm"])
    search("tent", TENT_GRID, ["gm", "h_sto"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", help="a fitted run of models/digits/gaussian_mixture.toml")
    parser.add_argument("--h-sto-run", help="a fitted run of models/digits/h_sto.toml")
    parser.add_argument("--out", default="runs/adaptation", help="folder of the runs it fits")
    parser.add_argument("--plot", default=str(ROOT / "benchmarks" / "adaptation.png"))
    parser.add_argument("--batch-size", type=int, help="examples per adapted batch")
    parser.add_argument("--tune", action="store_true", help="search the defaults on validation")
    args = parser.parse_args()
    started = time.perf_counter()
    print(machine())
    out = Path(args.out)
    runs = {
        "gm": fitted(GAUSSIAN_MIXTURE, out / "gaussian_mixture-map", args.run),
        "h_sto": fitted(H_STO, out / "h_sto-map", args.h_sto_run),
    }
    if args.tune:
        tune(runs, args.batch_size)
    else:
        benchmark(runs, args.batch_size, args.plot)
    print(f"done in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
