"""The default run, byte for byte: ``probtrans fit`` of the default specs (3 epochs) and a second
``probtrans evaluate`` write exactly the ``metrics.json``, ``history.json`` and ``probs.npz``
committed in ``tests/golden/`` (``probs.npz`` by its SHA-256). Refactorings must leave them
unchanged; a change that means to alter the numbers rewrites them with

    python tests/test_golden_run.py

and says why in its commit. The files depend on the processor's floating-point kernels: they are
those of this project's CPU machine (where CI runs), with torch on one thread (the order of its
parallel reductions changes the last digits)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import torch

from probtrans.cli import main

GOLDEN = Path(__file__).resolve().parent / "golden"
EPOCHS = "3"
COMPARED = ("metrics.json", "history.json")


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
    GOLDEN.mkdir(exist_ok=True)
    for name, value in steps["fit"].items():
        path = GOLDEN / name
        path.write_bytes(value) if isinstance(value, bytes) else path.write_text(value + "\n")
    print(f"rewrote {', '.join(sorted(steps['fit']))} in {GOLDEN}")
