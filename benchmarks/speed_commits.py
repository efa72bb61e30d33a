"""Time ``speed.py``'s cases at an earlier commit and in this working tree, alternately.

Saying that a change left a step no slower needs both sides timed in one run. This shared
machine's speed drifts by up to 1.5× over minutes (``speed.py``'s docstring), more than most
changes move a step. The script extracts the earlier commit's tree with ``git archive`` into a
temporary folder; the checkout is not touched. Each round runs every case once on each side, in
a fresh process, with that side's own ``benchmarks/speed.py --case`` and its own ``probtrans``
first on ``PYTHONPATH``. Which side goes first alternates between rounds. The script prints, per
case, each side's median time and the median and range of the rounds' after / before ratios,
each taken between two runs back to back. With several cases it also prints, per side, the
rounds' ratios of the first case to each other one (e.g. the SVI step over the plain step).

    python benchmarks/speed_commits.py 77d4a5e --cases step_svi_h_sto step_plain_h_sto --rounds 8
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
SIDES = ("before", "after")


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, check=False)


def extract(commit: str, into: Path) -> None:
    """Write the tree of ``commit`` into folder ``into`` (``git archive``)."""
    archive = git("archive", "--format=tar", commit)
    if archive.returncode != 0:
        sys.exit(f"speed_commits.py: git archive {commit}: {archive.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tree:
        tree.extractall(into, filter="data")


def short_hash(commit: str) -> str:
    return git("rev-parse", "--short", commit).stdout.decode().strip()


def describe_working_tree() -> str:
    """The working tree as its HEAD, marked where it has uncommitted changes."""
    head = short_hash("HEAD")
    changed = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    return f"working tree at {head}" + (" with uncommitted changes" if changed else "")


def case_seconds(tree: Path, case: str, repeats: int, device: str) -> float:
    """The median time of ``case`` by ``tree``'s own ``speed.py``, in a process of its own."""
    script = tree / "benchmarks" / "speed.py"
    command = [sys.executable, str(script), "--case", case, "--repeats", str(repeats)]
    command += ["--device", device]
    path = [str(tree), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tree)
    if done.returncode != 0:
        sys.exit(f"speed_commits.py: {script} --case {case} failed:\n{done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["seconds"]


def spread(values: list[float]) -> str:
    """Median of ``values``, with their range where there are several."""
    middle = f"{statistics.median(values):.2f}×"
    return middle if len(values) == 1 else f"{middle} ({min(values):.2f}–{max(values):.2f})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", help="the earlier commit (any git revision)")
    parser.add_argument(
        "--cases", nargs="+", required=True, metavar="CASE", help="speed.py case names"
    )
    parser.add_argument("--rounds", type=int, default=6, help="runs of each case on each side")
    parser.add_argument("--repeats", type=int, default=3, help="speed.py --repeats")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.repeats < 1:
        parser.error("--rounds and --repeats must be at least 1")
    seconds: dict[tuple[str, str], list[float]] = {
        (side, case): [] for side in SIDES for case in args.cases
    }
    with tempfile.TemporaryDirectory(prefix="speed_commits_") as folder:
        extract(args.before, Path(folder))
        trees = {"before": Path(folder), "after": ROOT}
        runs = tqdm(total=args.rounds * len(args.cases) * len(SIDES), desc="speed.py cases")
        for round_ in range(args.rounds):
            order = SIDES if round_ % 2 == 0 else SIDES[::-1]
            for case in args.cases:
                for side in order:
                    seconds[side, case].append(
                        case_seconds(trees[side], case, args.repeats, args.device)
                    )
                    runs.update()
        runs.close()

    print(f"before: {short_hash(args.before)}; after: {describe_working_tree()}")
    print(f"{args.rounds} rounds, speed.py --repeats {args.repeats} --device {args.device}\n")
    print(f"  {'case':<24} {'before':>9} {'after':>9}   after / before, per round")
    for case in args.cases:
        before, after = seconds["before", case], seconds["after", case]
        ratios = [a / b for a, b in zip(after, before, strict=True)]
        print(
            f"  {case:<24} {statistics.median(before):7.3f} s {statistics.median(after):7.3f} s"
            f"   {spread(ratios)}"
        )
    first, others = args.cases[0], args.cases[1:]
    for other in others:
        print(f"\n{first} / {other}, per round:")
        for side in SIDES:
            ratios = [
                a / b for a, b in zip(seconds[side, first], seconds[side, other], strict=True)
            ]
            print(f"  {side:<7} {spread(ratios)}")


if __name__ == "__main__":
    main()
