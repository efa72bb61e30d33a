"""The default run, byte for byte: ``probtrans fit`` of the default specs (3 epochs) and a second
``probtrans evaluate`` write exactly the ``metrics.json``, ``history.json`` and ``probs.npz``
committed in ``tests/golden/PROCESSOR/`` (``probs.npz`` by its SHA-256). Refactorings must
leave them unchanged; a change that means to alter the numbers rewrites them with

    python tests/test_golden_run.py

and says why in its commit. The files depend on the processor: its vendor's and its vector
width's floating-point kernels give other last digits (the README's default run reaches another
accuracy on an Intel Xeon than on an AMD EPYC), so each processor kind (:func:`processor`) has
its own folder, and on a kind without one the test is skipped with the command that writes it.
Torch runs on one thread (the order of its parallel reductions changes the last digits too)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import torch

from probtrans.cli import main

GOLDENS = Path(__file__).resolve().parent / "golden"
EPOCHS = "3"
COMPARED = ("metrics.json", "history.json")


def processor() -> str:
    """The processor kind: its model name (``/proc/cpuinfo``) and the vector instructions torch
    uses on it, e.g. ``amd-epyc-avx512``."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    model = next((line.split(":", 1)[1] for line in lines if line.startswith("model name")), "")
    name = f"{model.strip() or 'unknown'} {torch.backends.cpu.get_cpu_capability()}"
    return "-".join("".join(c if c.isalnum() else " " for c in name.lower()).split())


GOLDEN = GOLDENS / processor()


def default_run(out: Path) -> dict[str, dict[str, bytes | str]]:
    """Fit the default specs into ``out``, then evaluate the folder again, on one thread: the
    compared files after each step."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _steps(out)
    finally:
        torch.set_num_threads(threads)


def _steps(out: Path) -> dict[str, dict[str, bytes | str]]:
    steps = {}
    for step, argv in (
        ("fit", ["fit", "--epochs", EPOCHS, "--out", str(out), "--quiet"]),
        ("evaluate", ["evaluate", str(out), "--quiet"]),
    ):
        assert main(argv) == 0
        files: dict[str, bytes | str] = {name: (out / name).read_bytes() for name in COMPARED}
        files["probs.npz.sha256"] = hashlib.sha256((out / "probs.npz").read_bytes()).hexdigest()
        steps[step] = files
    return steps


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, dict[str, bytes | str]]:
    if not GOLDEN.is_dir():
        pytest.skip(
            f"no committed files for this processor ({GOLDEN.name}; there are "
            f"{', '.join(p.name for p in sorted(GOLDENS.iterdir())) or 'none'}): on a commit whose "
            f"numbers are right, `python tests/test_golden_run.py` writes them"
        )
    return default_run(tmp_path_factory.mktemp("golden") / "run")


@pytest.mark.parametrize("step", ["fit", "evaluate"])
def test_the_default_fit_and_evaluate_write_the_committed_files(written, step):
    written = written[step]
    for name in COMPARED:
        expected = (GOLDEN / name).read_bytes()
        if written[name] != expected:  # show the first differing values, not bytes
            assert json.loads(written[name]) == json.loads(expected), name
        assert written[name] == expected, name
    assert written["probs.npz.sha256"] == (GOLDEN / "probs.npz.sha256").read_text().strip()


if __name__ == "__main__":  # rewrite the committed files from the fit
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        steps = default_run(Path(folder) / "run")
    if steps["fit"] != steps["evaluate"]:
        sys.exit("fit and evaluate wrote different files: nothing rewritten")
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name, value in steps["fit"].items():
        path = GOLDEN / name
        path.write_bytes(value) if isinstance(value, bytes) else path.write_text(value + "\n")
    print(f"rewrote {', '.join(sorted(steps['fit']))} in {GOLDEN}")
