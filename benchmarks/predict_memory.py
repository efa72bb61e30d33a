"""Peak memory and throughput of ``probtrans predict`` on many rows, before and after it
predicts in chunks.

A small text transformer (2 layers, width 64, softmax attention, MAP; its spec below) is fitted
for one epoch on CR, then ``probtrans predict RUN rows.csv --out predictions.csv --samples 2``
runs on generated files of 10⁴, 10⁵ and 10⁶ rows (sentences of 5 to 25 words drawn from CR's
vocabulary), each in a fresh process whose peak resident memory (``ru_maxrss``) it reports:

- **before**: the whole input in one chunk (``probtrans.runs.run.PREDICT_CHUNK_ROWS`` set
  above the row count): its tokens, draws and columns held at once, as ``predict`` did before it
  predicted in chunks;
- **after**: ``predict`` as it is: :data:`~probtrans.runs.run.PREDICT_CHUNK_ROWS` rows at a time
  read from the file (after a first pass that checks every row), tokenised, predicted and
  written to the output file before the next.

Needs the CR files (``PROBTRANS_DATA_DIR``). Run it alone (two torch processes on a 2-core
machine halve both).

    python benchmarks/predict_memory.py                 # about 10 minutes on a 2-core CPU
    python benchmarks/predict_memory.py --rows 10000 100000
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from adaptation import machine  # benchmarks/adaptation.py: commit, CPU, cores, torch, date

import probtrans
from probtrans.runs.run import PREDICT_CHUNK_ROWS

MODEL = """
[data]
name = "cr"
protocol = "h_sto"
max_len = 64

[model]
d_model = 64
n_heads = 4
n_layers = 2
d_ff = 128
max_positions = 64

[model.attention]
kind = "softmax"
"""
INFERENCE = '[guide]\nname = "delta"\n[train]\nepochs = 1\n[predictive]\nsamples = 2\n'
#: the child process: ``probtrans predict``, the chunk size set, then its peak memory in KiB
CHILD = """
import resource, sys, time
import probtrans.runs.run
from probtrans.cli import main
probtrans.runs.run.PREDICT_CHUNK_ROWS = int(sys.argv[1])
started = time.perf_counter()
status = main(sys.argv[2:])
seconds = time.perf_counter() - started
print(status, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, seconds)
"""


def rows_file(path: Path, rows: int, vocabulary: list[str], seed: int = 0) -> Path:
    """A CSV of ``rows`` generated sentences in a ``text`` column."""
    generator = np.random.default_rng(seed)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text"])
        for length in generator.integers(5, 26, size=rows):
            writer.writerow([" ".join(generator.choice(vocabulary, size=length))])
    return path


def predicted(run: Path, rows: Path, out: Path, chunk: int) -> tuple[float, float]:
    """Peak memory (MiB) and seconds of ``probtrans predict`` in a fresh process."""
    argv = [str(chunk), "predict", str(run), str(rows), "--out", str(out), "--force", "--quiet"]
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, check=True
    )
    status, peak, seconds = done.stdout.split()[-3:]
    if status != "0":
        sys.exit(f"predict failed: {done.stderr}")
    return int(peak) / 1024, float(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    args = parser.parse_args()
    print(f"# {machine()}")
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "model.toml").write_text(MODEL)
        (root / "inference.toml").write_text(INFERENCE)
        run = probtrans.fit(root / "model.toml", root / "inference.toml", out=root / "run")
        words = cr_words(run)
        print(
            "\n| rows | before: peak (MiB) | rows/s | after: peak (MiB) | rows/s |\n"
            "|---|---|---|---|---|"
        )
        for rows in args.rows:
            source = rows_file(root / f"rows_{rows}.csv", rows, words)
            figures = []
            for chunk in (rows + 1, PREDICT_CHUNK_ROWS):
                peak, seconds = predicted(root / "run", source, root / "out.csv", chunk)
                figures += [f"{peak:,.0f}", f"{rows / seconds:,.0f}"]
            print(f"| {rows:,} | " + " | ".join(figures) + " |", flush=True)


def cr_words(run: probtrans.Run) -> list[str]:
    """The words of the run's tokenizer vocabulary (no special tokens), sorted."""
    return sorted(word for word in run.data.tokenizer.get_vocab() if word.isalpha())


if __name__ == "__main__":
    main()
