"""Execute the notebooks in place, so that the committed notebooks carry the outputs of a real run.

Usage, from the project root::

    python notebooks/execute.py                              # both notebooks; or name some:
    python notebooks/execute.py posterior_predictive.ipynb

posterior_predictive.ipynb reads runs/digits-h_sto-map (``PROBTRANS_RUN_DIR`` overrides it),
compare_guides.ipynb the MAP, mean-field and low-rank digits runs (``PROBTRANS_RUN_DIRS``,
comma-separated, overrides them). A digits run missing from runs/ is trained there by the
notebook, its progress bar in the cell's output: 25–35 s a run on a 2-core CPU
(``notebooks/notebook_runs.py``). The kernel starts in ``notebooks/``, as Jupyter starts it.
A notebook that fails is left as it was (exit status 1); one that ran is written back with its
outputs, and any output on stderr (a warning) is listed and gives exit status 1 too. The tests
(tests/test_notebooks.py) run the notebooks with their outputs stripped, on a fresh copy of the
checkout with one epoch per run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NOTEBOOKS = Path(__file__).resolve().parent
DEFAULT = ("posterior_predictive.ipynb", "compare_guides.ipynb")


def execute(path: Path, timeout: int = 600) -> list[str]:
    """Run the notebook at ``path`` top to bottom in a fresh kernel started in ``notebooks/``
    and write it back with its outputs → the text of its stderr outputs (none expected)."""
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        record_timing=False,  # no time stamps in the committed notebooks
        coalesce_streams=True,  # a progress bar's last state, not each of its updates
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    client.execute()
    nbformat.write(notebook, path)
    return [
        output.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type == "stream" and output.get("name") == "stderr"
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", default=DEFAULT, help="default: both")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = parser.parse_args(argv)
    status = 0
    for name in args.notebooks:
        path = NOTEBOOKS / Path(name).name
        try:
            stderr = execute(path, args.timeout)
        except CellExecutionError as err:
            print(f"{path.name}: failed, left unchanged\n{err}", file=sys.stderr)
            status = 1
            continue
        size = path.stat().st_size / 1e6
        print(f"{path.name}: executed, written with its outputs ({size:.2f} MB)")
        if stderr:
            print(f"{path.name}: output on stderr:\n" + "".join(stderr), file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
