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
