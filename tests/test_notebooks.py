"""The notebooks run top to bottom on tiny run folders, as Jupyter runs them: their kernel
starts in ``notebooks/``, their committed outputs stripped. They must print nothing on stderr
(no warnings) and label the axes of every figure they draw."""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from probtrans.runs import load_run
from tests.conftest import ROOT, TINY_MODEL, tiny_inference
from tests.test_text_data import needs_data

NOTEBOOKS = ROOT / "notebooks"

#: first cell: keep every figure made (pyplot's and those built on Figure objects)
RECORD_FIGURES = """
import matplotlib.figure

_recorded_figures = []
_figure_init = matplotlib.figure.Figure.__init__


def _recording_init(self, *args, **kwargs):
    _figure_init(self, *args, **kwargs)
    _recorded_figures.append(self)


matplotlib.figure.Figure.__init__ = _recording_init
"""

#: last cell: every axes that shows data has x and y labels (on it or on an axes it shares that
#: axis with), colour bars excepted; every image has a colour bar with a label
CHECK_AXES = """
import json as _json

_problems = []
for _figure in _recorded_figures:
    _name = _figure._suptitle.get_text() if _figure._suptitle else "a figure"
    for _ax in _figure.axes:
        if hasattr(_ax, "_colorbar") or not (_ax.axison and _ax.get_visible() and _ax.has_data()):
            continue
        _where = f"{_name} / {_ax.get_title() or 'untitled axes'}"
        for _axis, _shared in (("x", _ax.get_shared_x_axes()), ("y", _ax.get_shared_y_axes())):
            if not any(getattr(a, f"get_{_axis}label")() for a in _shared.get_siblings(_ax)):
                _problems.append(f"{_where}: no {_axis} label")
        for _image in _ax.images:
            if _image.colorbar is None or not _image.colorbar.ax.get_ylabel():
                _problems.append(f"{_where}: an image without a labelled colour bar")
print("FIGURES", len(_recorded_figures), "AXES CHECK", _json.dumps(_problems))
"""


def tiny_runs(folder: Path, guides: tuple[str, ...]) -> dict[str, Path]:
    """Tiny digits runs (2 epochs) of ``guides``: guide → run folder ``folder/run-GUIDE``."""
    from probtrans.runs import fit

    model = folder / "tiny.toml"
    model.write_text(TINY_MODEL)
    runs = {}
    for guide in guides:
        runs[guide] = folder / f"run-{guide}"
        fit(model, tiny_inference(folder, guide), out=runs[guide], progress=False)
    return runs


@pytest.fixture(scope="module")
def guide_runs(tmp_path_factory) -> dict[str, Path]:
    """Tiny runs of the MAP, mean-field and low-rank guides, shared by the tests below."""
    return tiny_runs(tmp_path_factory.mktemp("guides"), ("map", "mfvi", "lowrank"))


def execute(name: str, monkeypatch, **env: str) -> tuple[str, list]:
    """Run notebook ``name``, outputs stripped, with the kernel in ``notebooks/`` and ``env`` set
    → (its printed text, its outputs). Asserts no error, nothing on stderr and labelled axes."""
    for key in ("PROBTRANS_RUN_DIR", "PROBTRANS_RUN_DIRS"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    notebook.cells.insert(0, nbformat.v4.new_code_cell(RECORD_FIGURES))
    notebook.cells.append(nbformat.v4.new_code_cell(CHECK_AXES))
    resources = {"metadata": {"path": str(NOTEBOOKS)}}
    NotebookClient(notebook, timeout=300, kernel_name="python3", resources=resources).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    stderr = [o.text for o in outputs if o.output_type == "stream" and o.name == "stderr"]
    assert not stderr, "".join(stderr)
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    check = text.rsplit("AXES CHECK ", 1)[1]
    assert json.loads(check) == []
    assert int(text.rsplit("FIGURES ", 1)[1].split()[0]) > 0
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, "no figure was shown"
    return text, outputs


def test_posterior_predictive_notebook_executes(guide_runs, monkeypatch):
    # relative to the project root, not to notebooks/: found from the root
    run = os.path.relpath(guide_runs["map"], ROOT)
    text, _ = execute("posterior_predictive.ipynb", monkeypatch, PROBTRANS_RUN_DIR=run)
    assert "p(true) ± std" in text and "digits_8_9  auroc" in text
    assert "out of domain" not in text  # digits 8 and 9 are no in-domain class
    assert "predictive.nc holds the test draws of probs.npz: True" in text
    assert "point-mass posterior (p_loo = 0)" in text and "Pareto k̂ does not apply" in text


def test_posterior_predictive_notebook_shows_loo_of_a_normal_guide(guide_runs, monkeypatch):
    env = {"PROBTRANS_RUN_DIR": str(guide_runs["mfvi"]), "PROBTRANS_ATTENTION_DRAWS": "2"}
    text, _ = execute("posterior_predictive.ipynb", monkeypatch, **env)
    assert "elpd_loo" in text and "Pareto k diagnostic values" in text
    assert "scalar parameters in head.weight, head.bias" in text  # az.summary of the posterior


def test_posterior_predictive_notebook_names_the_command_of_a_missing_run(monkeypatch):
    monkeypatch.setenv("PROBTRANS_RUN_DIR", "runs/no-such-run")
    notebook = nbformat.read(NOTEBOOKS / "posterior_predictive.ipynb", as_version=4)
    resources = {"metadata": {"path": str(NOTEBOOKS)}}
    with pytest.raises(CellExecutionError) as raised:
        NotebookClient(notebook, timeout=300, kernel_name="python3", resources=resources).execute()
    message = str(raised.value)
    assert str(ROOT / "runs" / "no-such-run") in message  # looked up from the project root
    assert "`probtrans fit`, run from the project root, writes runs/digits-h_sto-map" in message


@needs_data
def test_posterior_predictive_notebook_shows_sentences_of_a_text_run(tmp_path, monkeypatch):
    from probtrans.runs import fit

    model = tmp_path / "cola.toml"
    text = TINY_MODEL.replace('name = "digits"\npatch_size = 2', 'name = "cola"\nmax_len = 64')
    model.write_text(text.replace("dropout = 0.0", "dropout = 0.0\nmax_positions = 64"))
    out = tmp_path / "cola-run"
    fit(model, tiny_inference(tmp_path, "map"), out=out, epochs=1, progress=False)
    env = {"PROBTRANS_RUN_DIR": str(out), "PROBTRANS_ATTENTION_DRAWS": "2"}
    printed, _ = execute("posterior_predictive.ipynb", monkeypatch, **env)
    data = load_run(out).data
    lines = printed.splitlines()
    headers = [i for i, line in enumerate(lines) if "p(true) ± std" in line]
    assert len(headers) == 2 and "out of domain: cola_ood" in lines[headers[1] - 1]
    for split, header in ((data.test, headers[0]), (data.ood["cola_ood"], headers[1])):
        sentences = [data.decode(ids.tolist()) for ids in split.inputs]
        rows = lines[header + 1 : header + 10]
        assert all(" ± " in row for row in rows)
        for row in rows:
            assert any(sentence.startswith(row[:40].rstrip()) for sentence in sentences), row


def test_compare_guides_notebook_executes(guide_runs, monkeypatch):
    dirs = ",".join(str(path) for path in guide_runs.values())
    text, outputs = execute("compare_guides.ipynb", monkeypatch, PROBTRANS_RUN_DIRS=dirs)
    for name in ("run-map (delta)", "run-mfvi (normal)", "run-lowrank (lowrank)"):
        assert name in text
    assert "held-out ELPD over" in text and "SE of Δ" in text
    assert "point mass: in-sample lpd, k̂ n/a" in text  # the MAP run's LOO, not diagnosed
    assert "elpd_loo" in text and "Pareto k diagnostic values" in text
    html = "".join(str(o.get("data", {}).get("text/plain", "")) for o in outputs)
    assert "no az.compare" in text or "elpd_diff" in html
    assert "aece" in text and "augrc" in text and "digits_8_9  auroc" in text
