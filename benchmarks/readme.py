"""Re-measure every figure of the README's results and performance sections, in one run.

Writes ``benchmarks/readme_figures.md``: the output of each part, under the commit and machine
it was measured on (``--only`` re-measures some parts and keeps the others' sections):

1. ``results``: ``probtrans fit`` of the four default-data rows (``models/digits/*.toml`` with
   ``inference/*.toml``, seed 0) and their table ("Results on the default data"); the default
   run's ``report.png`` is copied to ``results/digits/report.png``;
2. ``compare``: ``probtrans compare`` of the H-STO model's three guides (MAP, MFVI, low-rank)
   over seeds 0 and 1 into ``results/digits/compare``, whose ``table.md`` and ``figure.png`` the
   README shows;
3. ``guides``: ``benchmarks/guides.py`` ("Fit a spec, with any guide");
4. ``digits_c``: ``benchmarks/digits_c.py`` (Digits-C, and ``benchmarks/digits_c.png``);
5. ``speed``, ``step_profile``, ``length_grouping``, ``scaling``: the Performance and Scaling
   sections (``length_grouping`` needs the IMDB data: ``PROBTRANS_DATA_DIR`` or the Hugging
   Face hub).

    python benchmarks/readme.py                   # about 20 minutes on a 2-core CPU
    python benchmarks/readme.py --only results compare

Run it on a quiet machine from a clean checkout: the timings are of whatever else runs too.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import probtrans
from probtrans.storage.io import write_text

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "benchmarks" / "readme_figures.md"
DIGITS = ROOT / "results" / "digits"
#: the rows of "Results on the default data": (model, inference)
RESULT_ROWS = (("h_sto", "map"), ("h_sto", "mfvi"), ("h_sto", "lowrank"), ("sgpa", "sgpa"))
#: the benchmark scripts and their arguments, in the order they run
SCRIPTS = {
    "guides": ["benchmarks/guides.py"],
    "digits_c": ["benchmarks/digits_c.py"],
    "speed": ["benchmarks/speed.py", "--repeats", "3"],
    "step_profile": ["benchmarks/step_profile.py"],
    "length_grouping": ["benchmarks/length_grouping.py"],
    "scaling": ["benchmarks/scaling.py"],
}
PARTS = ("results", "compare", *SCRIPTS)


def machine() -> str:
    """The commit (``+`` when the tree has changes), CPU, cores, torch and the date."""
    commit = git("rev-parse", "--short", "HEAD")
    dirty = "+" if git("status", "--porcelain", "--untracked-files=no") else ""
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        models = [
            line.split(":", 1)[1].strip()
            for line in cpuinfo.read_text().splitlines()
            if line.startswith("model name")
        ]
        cpu = models[0] if models else cpu
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (
        f"commit {commit}{dirty} · {cpu}, {os.cpu_count()} cores, {gpu} · torch "
        f"{torch.__version__} · Python {platform.python_version()} · "
        f"{datetime.date.today().isoformat()}"
    )


def git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout.strip()


def results() -> str:
    """The four default-data fits and their table; the default run's report.png kept."""
    lines = [
        "| model + inference spec | accuracy | NLL | ECE | Brier | test ELPD (SE) "
        "| OOD AUROC (entropy) | best / trained epochs | train s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as root:
        for model, inference in RESULT_ROWS:
            out = Path(root) / f"{model}-{inference}"
            run = probtrans.fit(
                ROOT / "models" / "digits" / f"{model}.toml",
                ROOT / "inference" / f"{inference}.toml",
                out=out,
                progress=False,
            )
            m = run.metrics
            history = json.loads((out / "history.json").read_text())
            seconds = json.loads((out / "timing.json").read_text())["train_seconds"]
            auroc = ", ".join(f"{r['entropy']['auroc']:.3f}" for r in m["ood"].values())
            lines.append(
                f"| `{model}` + `{inference}` | {m['accuracy']:.4f} | {m['nll']:.3f} "
                f"| {m['ece']:.3f} | {m['brier']:.3f} | {m['test_elpd']:.1f} "
                f"({m['test_elpd_se']:.1f}) | {auroc} | {m['best_epoch']} / {len(history)} "
                f"| {seconds:.0f} |"
            )
            print(lines[-1], flush=True)
            if (model, inference) == RESULT_ROWS[0]:
                DIGITS.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(out / "report.png", DIGITS / "report.png")
    return "\n".join(lines)


def compare() -> str:
    """The H-STO model's three guides over two seeds, into results/digits/compare."""
    out = DIGITS / "compare"
    shutil.rmtree(out / "runs", ignore_errors=True)  # trained anew at this commit
    command = [sys.executable, "-m", "probtrans", "compare", "models/digits/h_sto.toml"]
    command += ["--inference", "inference/map.toml", "inference/mfvi.toml"]
    command += ["inference/lowrank.toml", "--seeds", "0", "1", "--out", str(out), "--quiet"]
    text = script(command)
    shutil.rmtree(out / "runs")  # the table, csv and figure are kept; the runs are large
    return text


def script(command: list[str]) -> str:
    """Run ``command`` from the project root, echoing and returning its standard output."""
    print("$", " ".join(command[1:] if command[0] == sys.executable else command), flush=True)
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    print(done.stdout, flush=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS))
    args = parser.parse_args()
    sections = read_sections()
    measured_on = machine()  # before this script writes into the tree (report.png, compare/)
    for part in args.only:
        started = time.perf_counter()
        print(f"== {part}", flush=True)
        if part == "results":
            text = results()
        elif part == "compare":
            text = compare()
        elif part == "digits_c":  # fitted anew, not from runs an earlier call left behind
            with tempfile.TemporaryDirectory() as out:
                text = script([sys.executable, *SCRIPTS[part], "--out", out])
        else:
            text = script([sys.executable, *SCRIPTS[part]])
        minutes = (time.perf_counter() - started) / 60
        sections[part] = f"{measured_on} · {minutes:.1f} min\n\n```text\n{text.rstrip()}\n```\n"
        write_sections(sections)  # what is measured so far survives a failure
    print(f"wrote {OUTPUT.relative_to(ROOT)}")


def read_sections() -> dict[str, str]:
    """The parts of :data:`OUTPUT` by name (a part re-measured with ``--only`` replaces its
    own section; the others keep theirs, with the commit they were measured at)."""
    if not OUTPUT.is_file():
        return {}
    pieces = re.split(f"^## ({'|'.join(PARTS)})\n\n", OUTPUT.read_text(), flags=re.MULTILINE)
    texts = zip(pieces[1::2], pieces[2::2], strict=True)
    return {part: text.rstrip() + "\n" for part, text in texts}


def write_sections(sections: dict[str, str]) -> None:
    ordered = [f"## {part}\n\n{sections[part]}" for part in PARTS if part in sections]
    write_text(OUTPUT, "# README figures\n\n" + "\n".join(ordered))


if __name__ == "__main__":
    main()
