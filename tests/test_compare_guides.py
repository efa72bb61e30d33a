"""Guides given in Python: ``probtrans.fit`` with a guide and no inference spec (the
InferenceSpec defaults and the elbo/optim/train/predictive keywords), their short labels, and
``probtrans.compare_guides`` (table, figure and ``arviz.compare`` keyed by the caller's names)."""

from __future__ import annotations

import csv
import functools
import json

import pytest
from pyro.infer.autoguide import AutoDelta, AutoLowRankMultivariateNormal, AutoNormal
from pyro.infer.autoguide.initialization import init_to_median
from torch import nn

import probtrans
from probtrans.errors import ProbtransError
from probtrans.inference.guide_builder import guide_in_words
from probtrans.runs import Run
from probtrans.runs.fitting import guide_label, inference_source
from probtrans.specs import InferenceSpec, OptimSpec, read_inference_spec, read_model_spec
from tests.conftest import TINY_MODEL, tiny_inference

TINY = {"epochs": 1, "batch_size": 128, "val_samples": 2}
FEW_DRAWS = {"samples": 4, "replicas": 2}


@pytest.fixture
def model():
    return read_model_spec("tiny.toml", TINY_MODEL)


def test_fit_with_a_guide_and_no_inference_spec_trains_with_the_defaults_and_keywords(
    model, tmp_path, capsys
):
    out = tmp_path / "run"
    run = probtrans.fit(
        model,
        guide=AutoNormal,
        elbo={"kl_anneal_epochs": 4},
        optim=OptimSpec(lr=5e-3),
        train=TINY,
        predictive=FEW_DRAWS,
        out=out,
        progress=False,
    )
    kept = read_inference_spec(out / "inference.toml")
    assert kept.elbo.kl_anneal_epochs == 4 and kept.optim.lr == 5e-3 and kept.train.epochs == 1
    defaults = InferenceSpec()  # what no keyword names stays the defaults'
    assert kept.elbo.name == defaults.elbo.name and kept.guide == defaults.guide
    assert kept.train.patience == defaults.train.patience
    assert kept.model_dump() == run.inference_spec.model_dump()
    (epoch,) = json.loads((out / "history.json").read_text())
    assert 0 < epoch["kl_annealing"] < 1 / 4  # annealed over 4 epochs: still in the first
    assert epoch["lr"] == 5e-3
    capsys.readouterr()
    reread = Run.load(out)  # the checkpoint keeps the same effective text: no note
    assert (
        reread.inference_spec.model_dump() == kept.model_dump()
        and "not the spec" not in capsys.readouterr().err
    )
    assert reread.guide_name == run.guide_name == "AutoNormal"
    assert reread.guide_words() == "AutoNormal on the last layer"  # the report's title


def test_keywords_override_the_fields_they_name_in_an_inference_spec_file(tmp_path):
    path = tiny_inference(tmp_path, "map")  # lr 5e-3, cosine schedule, 2 epochs
    text, spec = inference_source(path, None, {"optim": {"lr": 0.02}, "elbo": None})
    assert spec.optim.lr == 0.02 and spec.optim.schedule == "cosine"
    assert spec.train.epochs == 2 and spec.guide.name == "delta"
    assert read_inference_spec("kept.toml", text).model_dump() == spec.model_dump()
    unchanged, _ = inference_source(path, None, {"optim": None})
    assert unchanged == path.read_text()  # no keyword: the file's own text


def test_fit_without_an_inference_spec_or_a_guide_is_refused(model, tmp_path):
    with pytest.raises(ProbtransError, match=r"give an inference spec .* or a guide"):
        probtrans.fit(model, train=TINY, out=tmp_path / "run")


@pytest.mark.parametrize(
    ("keyword", "value", "message"),
    [
        ("elbo", {"kl_anneal": 3}, "elbo = {'kl_anneal': 3}: unknown key 'elbo.kl_anneal'"),
        ("optim", {"lr": -1.0}, "optim = {'lr': -1.0}: optim.lr = -1.0: must be > 0"),
        ("train", 3, r"train = 3: give a dict of \[train\] fields or a TrainSpec"),
    ],
)
def test_a_bad_keyword_is_refused_naming_its_field(model, tmp_path, keyword, value, message):
    with pytest.raises(ProbtransError, match=message):
        probtrans.fit(model, guide=AutoNormal, out=tmp_path / "run", **{keyword: value})
    assert not (tmp_path / "run").exists()


def test_a_python_guide_is_labelled_by_its_short_name():
    class Handwritten(nn.Module):
        def forward(self, inputs, mask, labels, index=None, n_data=None):
            return None

    def normal(model):  # a registered guide's name: still the label, not its words
        return AutoNormal(model)

    assert guide_label(AutoNormal) == "AutoNormal"
    lowrank = functools.partial(AutoLowRankMultivariateNormal, rank=2)
    assert guide_label(lowrank) == "AutoLowRankMultivariateNormal(rank=2)"
    assert guide_label(functools.partial(AutoNormal, init_loc_fn=init_to_median)) == "AutoNormal"
    assert guide_label(lambda model: AutoNormal(model)) == "<lambda>"
    assert guide_label(Handwritten()) == "Handwritten"
    assert guide_in_words(guide_label(normal), given=True) == "normal"
    assert guide_in_words("normal") != "normal"  # the registered guide's words


GUIDES = {
    "MAP": AutoDelta,
    "mean-field": AutoNormal,
    "low rank": functools.partial(AutoLowRankMultivariateNormal, rank=2),
}


def test_compare_guides_labels_the_table_figure_and_az_compare_by_name(model):
    result = probtrans.compare_guides(
        model, GUIDES, [0], train={**TINY, "epochs": 2}, predictive=FEW_DRAWS, progress=False
    )
    names = list(GUIDES)
    path = result.path
    assert [row["method"] for row in result.rows] == names
    assert [row["method"] for row in csv.DictReader((path / "table.csv").open())] == names
    assert result.table == (path / "table.md").read_text()
    assert all(f"| {name} | 1 |" in result.table for name in names)
    assert {"figure.png", "comparison.json"} <= {p.name for p in path.iterdir()}
    curves, metrics = result.figure.subfigs
    assert [text.get_text() for text in curves.legends[0].get_texts()] == names
    assert [label.get_text() for label in metrics.axes[0].get_yticklabels()] == names
    assert set(result.az_compare.index) == set(names)
    for name in names:
        (folder,) = result.runs[name]
        assert folder == path / "runs" / f"{name}-seed0" and folder.is_dir()
        assert read_inference_spec(folder / "inference.toml").train.epochs == 2
        loo = json.loads((folder / "metrics.json").read_text())["loo"]  # the run's own PSIS-LOO
        assert result.az_compare.loc[name, "elpd_loo"] == pytest.approx(loo, rel=1e-6)
    result.close()
    assert not path.exists()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"guides": {}}, "give at least one guide"),
        ({"guides": {"a/b": AutoNormal}}, "the name 'a/b' must be a text usable as a folder"),
        ({"seeds": [0, 0]}, r"seeds = \[0, 0\]: a seed given twice"),
        ({"seeds": [-1]}, "seeds: -1: must be an integer"),
        ({"ood_score": "nope"}, "ood_score = 'nope': unknown"),
        ({"id_metric": "f1"}, "compare_guides: id_metric = 'f1': unknown metric"),
        ({"id_metric": "entropy"}, "id_metric = 'entropy': describes the predictive, neither"),
        ({"elbo": {"kl_anneal": 3}}, "unknown key 'elbo.kl_anneal'"),
    ],
)
def test_compare_guides_checks_before_anything_trains(model, tmp_path, arguments, message):
    asked = {"guides": {"normal": AutoNormal}, "out": tmp_path / "cmp", **arguments}
    with pytest.raises(ProbtransError, match=message):
        probtrans.compare_guides(model, **asked)
    assert not (tmp_path / "cmp").exists()


def test_compare_guides_refuses_a_folder_of_the_users(model, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ProbtransError, match="not a folder probtrans compare wrote"):
        probtrans.compare_guides(model, {"normal": AutoNormal}, out=tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
