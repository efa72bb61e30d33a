"""The run folders the notebooks read, found or trained, and what both notebooks say of a run.

A notebook reads the run folders named in its environment variable (``PROBTRANS_RUN_DIR`` or
``PROBTRANS_RUN_DIRS``) if it is set, and otherwise the digits runs that ``probtrans fit``
writes when run from the project root (:data:`DIGITS_RUNS`: ``probtrans fit --inference SPEC``
writes ``runs/digits-h_sto-STEM``).

A digits run that is missing (a fresh clone) is trained into its folder by :func:`probtrans.fit`
with the same specs and seed as the command, so the notebook runs top to bottom; later runs of
the notebook read it. Each took 25–35 s on the project's 2-core CPU box (one thread, early
stopping within the specs' 40 epochs); the three together about a minute and a half.
``PROBTRANS_NOTEBOOK_EPOCHS=N`` trains missing runs for N epochs instead: a quick check of the
notebook (the tests use 1), not a fitted model.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

import probtrans

#: the project root: this module lies in its ``notebooks/`` folder
ROOT = Path(__file__).resolve().parent.parent
#: the model spec of the digits runs (``probtrans fit``'s default)
DIGITS_MODEL = "models/digits/h_sto.toml"
#: guide → (inference spec, the run folder ``probtrans fit`` writes), from the project root
DIGITS_RUNS = {
    "map": ("inference/map.toml", "runs/digits-h_sto-map"),
    "mfvi": ("inference/mfvi.toml", "runs/digits-h_sto-mfvi"),
    "lowrank": ("inference/lowrank.toml", "runs/digits-h_sto-lowrank"),
}
#: the files of a run folder that the notebooks read
READ = ("metrics.json", "probs.npz", "predictive.nc")
#: environment variable: the epochs of the digits runs trained here (default: their specs')
EPOCHS = "PROBTRANS_NOTEBOOK_EPOCHS"


def project_path(path: str) -> Path:
    """``path`` as given if it is absolute or exists (from the working folder), else from the
    project root: Jupyter starts the kernel in ``notebooks/``."""
    given = Path(path)
    return given if given.is_absolute() or given.exists() else ROOT / given


def finished(folder: Path) -> bool:
    return all((folder / name).is_file() for name in READ)


def notebook_runs(variable: str, guides: tuple[str, ...]) -> list[Path]:
    """The run folders a notebook reads: those listed in the environment ``variable``
    (comma-separated; each must be a finished run folder), or else the digits runs of
    ``guides`` (keys of :data:`DIGITS_RUNS`), trained where missing."""
    given = os.environ.get(variable)
    if not given:
        return [digits_run(guide) for guide in guides]
    folders = [project_path(path) for path in given.split(",")]
    missing = [f"{folder}: no finished run" for folder in folders if not finished(folder)]
    if missing:
        raise FileNotFoundError(
            "\n".join(
                [
                    *missing,
                    f"(a run folder holds {', '.join(READ)}; unset {variable} to read the "
                    "digits runs under runs/, trained where missing)",
                ]
            )
        )
    return folders


def digits_run(guide: str) -> Path:
    """The digits run of ``guide`` under ``runs/``, trained first if it is not there."""
    inference, folder = DIGITS_RUNS[guide]
    out = ROOT / folder
    if finished(out):
        print(f"{folder}: found, read as it is")
        return out
    epochs = int(os.environ[EPOCHS]) if os.environ.get(EPOCHS) else None
    budget = f"{epochs} epoch(s), {EPOCHS}" if epochs else "about 30 s on a 2-core CPU"
    print(f"{folder}: not found, training it ({inference}; {budget})", flush=True)
    start = time.perf_counter()
    # the progress bars in the cell's output rather than in red, as stderr is shown
    with contextlib.redirect_stderr(sys.stdout):
        probtrans.fit(ROOT / DIGITS_MODEL, ROOT / inference, out=out, epochs=epochs, progress=True)
    print(f"{folder}: trained and evaluated in {time.perf_counter() - start:.0f} s")
    return out
