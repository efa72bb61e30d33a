"""The notebooks run top to bottom on a tiny run folder."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient

from probtrans.run import load_run
from tests.conftest import ROOT
from tests.test_text_data import needs_data


def run_posterior_predictive_notebook(run_dir: Path, monkeypatch) -> str:
    """Execute the notebook on ``run_dir``; → its printed text."""
    monkeypatch.setenv("PROBTRANS_RUN_DIR", str(run_dir))
    monkeypatch.setenv("PROBTRANS_SAMPLES", "3")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(ROOT / "notebooks" / "posterior_predictive.ipynb", as_version=4)
    NotebookClient(notebook, timeout=300, resources={"metadata": {"path": str(ROOT)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    return "".join(o.get("text", "") for o in outputs if o.output_type == "stream")


def test_posterior_predictive_notebook_executes(tiny_run, monkeypatch):
    text = run_posterior_predictive_notebook(tiny_run, monkeypatch)
    assert "p(true) ± std" in text and "digits_8_9  auroc" in text
    assert "out of domain" not in text  # digits 8 and 9 are no in-domain class


@needs_data
def test_posterior_predictive_notebook_shows_sentences_of_a_text_run(tmp_path, monkeypatch):
    from probtrans.run import fit_run
    from tests.conftest import TINY_MODEL, tiny_inference

    model = tmp_path / "cola.toml"
    text = TINY_MODEL.replace('name = "digits"\npatch_size = 2', 'name = "cola"\nmax_len = 64')
    model.write_text(text.replace("dropout = 0.0", "dropout = 0.0\nmax_positions = 64"))
    out = tmp_path / "cola-run"
    fit_run(model, tiny_inference(tmp_path, "map"), out, epochs=1, progress=False)
    printed = run_posterior_predictive_notebook(out, monkeypatch)
    data = load_run(out).data
    in_domain, out_of_domain = printed.split("out of domain")
    for split, part in ((data.test, in_domain), (data.ood["cola_ood"], out_of_domain)):
        sentences = [data.decode(ids.tolist()) for ids in split.inputs]
        rows = [line for line in part.splitlines() if " ± " in line][1:]  # under the header
        assert len(rows) == 9
        for row in rows:
            assert any(sentence.startswith(row[:40].rstrip()) for sentence in sentences), row


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
