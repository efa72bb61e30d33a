"""The notebooks run top to bottom on a tiny run folder."""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import ROOT


@pytest.mark.parametrize("name", ["posterior_predictive"])
def test_notebook_executes(tiny_run, monkeypatch, name):
    monkeypatch.setenv("PROBTRANS_RUN_DIR", str(tiny_run))
    monkeypatch.setenv("PROBTRANS_SAMPLES", "3")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    NotebookClient(notebook, timeout=300, resources={"metadata": {"path": str(ROOT)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "p(true) ± std" in text and "ood_auroc" in text


def test_compare_guides_notebook_executes(tmp_path, tiny_model_file, monkeypatch):
    from probtrans.run import fit_run
    from tests.conftest import tiny_inference

    runs = []
    for guide in ("map", "mfvi"):
        out = tmp_path / f"run-{guide}"
        fit_run(tiny_model_file, tiny_inference(tmp_path, guide), out, progress=False)
        runs.append(str(out))
    monkeypatch.setenv("PROBTRANS_RUN_DIRS", ",".join(runs))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(ROOT / "notebooks" / "compare_guides.ipynb", as_version=4)
    NotebookClient(notebook, timeout=300, resources={"metadata": {"path": str(ROOT)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "run-map (delta)" in text and "run-mfvi (normal)" in text
    html = "".join(str(o.get("data", {}).get("text/plain", "")) for o in outputs)
    assert "elpd_loo" in html
