"""Which uncertainty score flags what a model has not seen? Every score's OOD AUROC, measured.

Fits (or reuses) two runs and prints the AUROC of every uncertainty score of
``probtrans.analysis.metrics.UNCERTAINTY_SCORES`` against every out-of-domain set, then each score's
mean rank over all (run, set) pairs, the evidence for ``[predictive] ood_score``:

- digits (``models/digits/h_sto.toml``, ``inference/map.toml``): the held-out classes 8 and 9
  (near OOD) and digits-C at severity 5 of every corruption (covariate shift);
- IMDB, H-STO protocol (``models/imdb/trans.toml``, ``inference/imdb/map.toml``, the reduced
  budget of ``results/presets/hsto_imdb.toml``: 3 epochs): CR product reviews (its own OOD
  set) and CoLA sentences (in-domain and out-of-domain dev, 1,559 sentences, written to a CSV
  from ``$PROBTRANS_DATA_DIR/cola/raw``).

    python benchmarks/ood_scores.py --out runs/ood_scores [--only digits|imdb] [--device cuda]

A run already in ``OUT`` is reused when its specs and epochs are those asked (the same rule as
``probtrans compare``).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

from probtrans.analysis.metrics import UNCERTAINTY_SCORES
from probtrans.data.corruptions import CORRUPTIONS
from probtrans.storage.io import read_json

ROOT = Path(__file__).resolve().parents[1]


def cola_sentences(out: Path) -> Path:
    """The CoLA dev sentences (in-domain and out-of-domain) as a CSV with a ``text`` column."""
    import csv

    raw = Path(os.environ["PROBTRANS_DATA_DIR"]) / "cola" / "raw"
    path = out / "cola_sentences.csv"
    rows = []
    for name in ("in_domain_dev.tsv", "out_of_domain_dev.tsv"):
        for line in (raw / name).read_text(encoding="utf-8").splitlines():
            if line.strip():
                rows.append(line.split("\t")[3])
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text"])
        writer.writerows([row] for row in rows)
    return path


def specs(out: Path, which: str) -> tuple[Path, Path, int | None]:
    """The model spec (with its out-of-domain sets), inference spec and epochs of a run."""
    if which == "digits":
        base = (ROOT / "models/digits/h_sto.toml").read_text()
        sets = "".join(
            f'\n[[data.ood]]\nname = "{name}_5"\nsource = "digits-c:{name}:5"\n'
            for name in CORRUPTIONS
        )
        model = out / "digits_h_sto.toml"
        model.write_text(base + sets)
        return model, ROOT / "inference/map.toml", None
    base = (ROOT / "models/imdb/trans.toml").read_text()
    cola = cola_sentences(out)
    model = out / "imdb_trans.toml"
    model.write_text(base + f'\n[[data.ood]]\nname = "cola"\nsource = "{cola}"\n')
    return model, ROOT / "inference/imdb/map.toml", 3


def fitted(out: Path, which: str, device: str) -> dict:
    """The ``metrics.json`` of the run, fitted unless it is there with these specs."""
    model, inference, epochs = specs(out, which)
    folder = out / which
    argv = [sys.executable, "-m", "probtrans", "fit", str(model), "--inference", str(inference)]
    argv += ["--out", str(folder), "--device", device, "--quiet"]
    argv += ["--epochs", str(epochs)] if epochs else []
    kept = folder / "checkpoint.pt"
    if not kept.is_file() or not same_specs(kept, model, inference):
        subprocess.run(argv, check=True, cwd=ROOT)
    return read_json(folder / "metrics.json")


def same_specs(checkpoint: Path, model: Path, inference: Path) -> bool:
    from probtrans.storage.checkpoint import load_checkpoint

    state = load_checkpoint(checkpoint)
    return state["model_spec"] == model.read_text() and state["inference_spec"] == (
        inference.read_text()
    )


def table(results: dict[str, dict]) -> tuple[list[str], list[list[str]], dict[str, float]]:
    """Rows (run, set) × columns (scores) of AUROC, the best per row in bold, and each score's
    mean rank over the rows (1 = best)."""
    scores = list(UNCERTAINTY_SCORES)
    rows, ranks = [], {score: [] for score in scores}
    for run, metrics in results.items():
        for name, report in metrics["ood"].items():
            values = {s: report[s]["auroc"] for s in scores if s in report}
            order = sorted(values, key=values.get, reverse=True)
            for rank, score in enumerate(order, start=1):
                ranks[score].append(rank)
            best = order[0]
            cells = [
                "–"
                if s not in values
                else f"**{values[s]:.3f}**"
                if s == best
                else f"{values[s]:.3f}"
                for s in scores
            ]
            rows.append([run, name, *cells])
    mean_rank = {s: float(np.mean(r)) for s, r in ranks.items() if r}
    return ["run", "OOD set", *scores], rows, mean_rank


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/ood_scores")
    parser.add_argument("--only", choices=("digits", "imdb"))
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    which = [args.only] if args.only else ["digits", "imdb"]
    results = {name: fitted(out, name, args.device) for name in which}
    header, rows, mean_rank = table(results)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    print(
        f"OOD AUROC per score (higher = better separated); commit {commit}, "
        f"{platform.processor() or platform.machine()}, device {args.device}\n"
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print("\nmean rank over the rows (1 = best):")
    for score, rank in sorted(mean_rank.items(), key=lambda item: item[1]):
        print(f"  {score:22s} {rank:.2f}")


if __name__ == "__main__":
    main()
