"""The notebooks run top to bottom as Jupyter runs them: their kernel starts in ``notebooks/``,
their committed outputs stripped. On a fresh checkout (no ``runs/``) they train the digits runs
they need, then read them; given run folders (``PROBTRANS_RUN_DIR(S)``) they read those. They
must print nothing on stderr (no warnings) and label the axes of every figure they draw."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

import probtrans
from tests.conftest import ROOT, TINY_MODEL, tiny_inference
from tests.test_text_data import needs_data

NOTEBOOKS = ROOT / "notebooks"
#: what a checkout needs to run the notebooks (runs/ excepted): the notebooks and their specs
CHECKOUT = ("notebooks", "models", "inference")
#: the environment variables the notebooks read
VARIABLES = (
    "PROBTRANS_RUN_DIR",
    "PROBTRANS_RUN_DIRS",
    "PROBTRANS_NOTEBOOK_EPOCHS",
    "PROBTRANS_ATTENTION_DRAWS",
)

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


def execute(name: str, monkeypatch, folder: Path = NOTEBOOKS, **env: str) -> tuple[str, list]:
    """Run notebook ``name`` of ``folder``, outputs stripped, with the kernel in ``folder`` and
    ``env`` set → (its printed text, its outputs). Asserts no error, nothing on stderr (and no
    warning among the printed text, where a training's progress bars go) and labelled axes."""
    for key in VARIABLES:
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    notebook = nbformat.read(folder / name, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    notebook.cells.insert(0, nbformat.v4.new_code_cell(RECORD_FIGURES))
    notebook.cells.append(nbformat.v4.new_code_cell(CHECK_AXES))
    resources = {"metadata": {"path": str(folder)}}
    NotebookClient(notebook, timeout=300, kernel_name="python3", resources=resources).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    stderr = [o.text for o in outputs if o.output_type == "stream" and o.name == "stderr"]
    assert not stderr, "".join(stderr)
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "Warning:" not in text
    check = text.rsplit("AXES CHECK ", 1)[1]
    assert json.loads(check) == []
    assert int(text.rsplit("FIGURES ", 1)[1].split()[0]) > 0
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, "no figure was shown"
    return text, outputs


@pytest.fixture(scope="module")
def fresh_checkout(tmp_path_factory) -> tuple[Path, dict[str, tuple[str, list]]]:
    """A copy of the checkout without ``runs/``, where the notebooks ran one after the other
    with one epoch per run they train: posterior_predictive.ipynb trains the MAP run,
    compare_guides.ipynb reads it and trains the two others → (the checkout, notebook → (its
    printed text, its outputs))."""
    checkout = tmp_path_factory.mktemp("checkout")
    junk = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints")
    for name in CHECKOUT:
        shutil.copytree(ROOT / name, checkout / name, ignore=junk)
    executed = {}
    with pytest.MonkeyPatch.context() as monkeypatch:
        for name in ("posterior_predictive.ipynb", "compare_guides.ipynb"):
            executed[name] = execute(
                name, monkeypatch, checkout / "notebooks", PROBTRANS_NOTEBOOK_EPOCHS="1"
            )
    return checkout, executed


def test_posterior_predictive_notebook_trains_its_run_on_a_fresh_checkout(fresh_checkout):
    checkout, executed = fresh_checkout
    text, _ = executed["posterior_predictive.ipynb"]
    assert "runs/digits-h_sto-map: not found, training it" in text
    assert "SVI: 100%" in text and "runs/digits-h_sto-map: trained and evaluated in" in text
    assert (checkout / "runs" / "digits-h_sto-map" / "probs.npz").is_file()
    assert "p(true) ± std" in text and "digits_8_9  auroc" in text
    assert "out of domain" not in text  # digits 8 and 9 are no in-domain class
    shared = "{'posterior': 400, 'log_likelihood': 400, 'posterior_predictive': 400}"
    assert f"predictive.nc: draws per group {shared}" in text  # ArviZ's convention
    assert "point-mass posterior (p_loo = 0)" in text and "Pareto k̂ does not apply" in text


def test_compare_guides_notebook_reads_the_run_it_finds_and_trains_the_others(fresh_checkout):
    _, executed = fresh_checkout
    text, outputs = executed["compare_guides.ipynb"]
    assert "runs/digits-h_sto-map: found, read as it is" in text
    for guide in ("mfvi", "lowrank"):
        assert f"runs/digits-h_sto-{guide}: not found, training it" in text
    for name in ("map (delta)", "mfvi (normal)", "lowrank (lowrank)"):
        assert f"digits-h_sto-{name}" in text
    assert "held-out ELPD over" in text and "SE of Δ" in text
    assert "point mass: in-sample lpd, k̂ n/a" in text  # the MAP run's LOO, not diagnosed
    assert "elpd_loo" in text and "Pareto k diagnostic values" in text
    html = "".join(str(o.get("data", {}).get("text/plain", "")) for o in outputs)
    assert "no az.compare" in text or "elpd_diff" in html
    assert "aece" in text and "augrc" in text and "digits_8_9  auroc" in text


def test_posterior_predictive_notebook_shows_loo_of_a_normal_guide(fresh_checkout, monkeypatch):
    run = fresh_checkout[0] / "runs" / "digits-h_sto-mfvi"
    env = {"PROBTRANS_RUN_DIR": str(run), "PROBTRANS_ATTENTION_DRAWS": "2"}
    text, _ = execute("posterior_predictive.ipynb", monkeypatch, **env)
    assert "elpd_loo" in text and "Pareto k diagnostic values" in text
    assert "scalar parameters in head.weight, head.bias" in text  # az.summary of the posterior


def test_posterior_predictive_notebook_names_a_missing_run_it_was_given(monkeypatch):
    monkeypatch.setenv("PROBTRANS_RUN_DIR", "runs/no-such-run")
    notebook = nbformat.read(NOTEBOOKS / "posterior_predictive.ipynb", as_version=4)
    resources = {"metadata": {"path": str(NOTEBOOKS)}}
    with pytest.raises(CellExecutionError) as raised:
        NotebookClient(notebook, timeout=300, kernel_name="python3", resources=resources).execute()
    message = str(raised.value)
    assert f"{ROOT / 'runs' / 'no-such-run'}: no finished run" in message  # from the root
    assert "unset PROBTRANS_RUN_DIR to read the digits runs under runs/" in message
    assert not (ROOT / "runs" / "no-such-run").exists()  # nothing trained into it


@needs_data
def test_posterior_predictive_notebook_shows_sentences_of_a_text_run(tmp_path, monkeypatch):
    model = tmp_path / "cola.toml"
    text = TINY_MODEL.replace('name = "digits"\npatch_size = 2', 'name = "cola"\nmax_len = 64')
    model.write_text(text.replace("dropout = 0.0", "dropout = 0.0\nmax_positions = 64"))
    out = tmp_path / "cola-run"
    probtrans.fit(model, tiny_inference(tmp_path, "map"), out=out, epochs=1, progress=False)
    env = {"PROBTRANS_RUN_DIR": str(out), "PROBTRANS_ATTENTION_DRAWS": "2"}
    printed, _ = execute("posterior_predictive.ipynb", monkeypatch, **env)
    data = probtrans.Run.load(out).data
    lines = printed.splitlines()
    headers = [i for i, line in enumerate(lines) if "p(true) ± std" in line]
    assert len(headers) == 2 and "out of domain: cola_ood" in lines[headers[1] - 1]
    for split, header in ((data.test, headers[0]), (data.ood["cola_ood"], headers[1])):
        sentences = [data.decode(ids.tolist()) for ids in split.inputs]
        rows = lines[header + 1 : header + 10]
        assert all(" ± " in row for row in rows)
        for row in rows:
            assert any(sentence.startswith(row[:40].rstrip()) for sentence in sentences), row
