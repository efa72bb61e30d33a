"""probtrans compare: trains what is missing, resumes, writes the table and the figure."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from probtrans.cli import main
from probtrans.runs.compare import check_methods, load_preset, method_probs, run_dir
from tests.conftest import ROOT, TINY_TRAIN, inference_file, tiny_inference

PRESET = """
title = "tiny"
seeds = [0, 1]
id_metric = "accuracy"
epochs = 1

[[method]]
name = "MAP"
model = "{model}"
inference = "{inference}"
paper = "90.0"

[[method]]
name = "MAP + TS"
model = "{model}"
inference = "{inference}"
temperature = true

[[method]]
name = "ensemble"
model = "{model}"
inference = "{inference}"
ensemble = true

[[method]]
name = "MC dropout"
model = "{model}"
inference = "{inference}"
variant = "mc_dropout"
"""


@pytest.fixture
def preset(tmp_path, tiny_model_file):
    text = '[guide]\nname = "delta"\n' + TINY_TRAIN + 'posthoc = ["mc_dropout"]\n'
    inference = inference_file(tmp_path, "map.toml", text)
    path = tmp_path / "preset.toml"
    path.write_text(PRESET.format(model=tiny_model_file, inference=inference))
    return path


def test_compare_writes_table_csv_and_figure_and_resumes(tmp_path, preset, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", "--preset", str(preset), "--out", str(out), "--quiet"]) == 0
    comparison = load_preset(preset)
    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert len(runs) == 2  # one MAP run per seed, shared by the four methods
    table = (out / "table.md").read_text()
    for name in ("MAP", "MAP + TS", "ensemble", "MC dropout", "90.0"):
        assert name in table
    rows = list(csv.DictReader((out / "table.csv").open()))
    assert [r["method"] for r in rows] == ["MAP", "MAP + TS", "ensemble", "MC dropout"]
    assert "±" in rows[0]["ID accuracy (%)"] and "±" not in rows[2]["ID accuracy (%)"]
    assert (out / "figure.png").stat().st_size > 10_000

    stamps = {p: (p / "checkpoint.pt").stat().st_mtime_ns for p in (out / "runs").iterdir()}
    capsys.readouterr()
    by_nll = tmp_path / "by_nll.toml"  # any ranked metric heads the table; the runs are reused
    by_nll.write_text(preset.read_text().replace('id_metric = "accuracy"', 'id_metric = "nll"'))
    assert main(["compare", "--preset", str(by_nll), "--out", str(out), "--quiet"]) == 0
    assert "fit " not in capsys.readouterr().out  # nothing retrained
    assert stamps == {p: (p / "checkpoint.pt").stat().st_mtime_ns for p in stamps}
    rows = list(csv.DictReader((out / "table.csv").open()))
    assert [r["ID nll (nats)"] for r in rows] == [r["nll"] for r in rows]
    assert "ID accuracy (%)" not in rows[0]

    ensemble = comparison.method[2]
    folders = [run_dir(out, ensemble, s) for s in comparison.seeds]
    (pooled,) = method_probs(ensemble, folders)
    probs = pooled.probs
    single = method_probs(comparison.method[0], folders[:1])[0].probs
    assert probs["test"].shape[0] == 2 * single["test"].shape[0]  # members' draws pooled
    assert np.allclose(probs["test"][: single["test"].shape[0]], single["test"])


def test_evaluate_keeps_what_fit_wrote_and_compare_reuses_the_run(tmp_path, preset, capsys):
    """``probtrans evaluate`` rewrites the metrics but keeps the run information (``epochs``
    among it), so ``compare`` still knows the run is finished and does not train it again."""
    text = preset.read_text().replace("seeds = [0, 1]", "seeds = [0]")
    one_seed = tmp_path / "one_seed.toml"
    one_seed.write_text(text)
    out = tmp_path / "cmp"
    assert main(["compare", "--preset", str(one_seed), "--out", str(out), "--quiet"]) == 0
    (run,) = (out / "runs").iterdir()
    fitted = json.loads((run / "metrics.json").read_text())
    assert {"epochs", "seed", "best_epoch"} <= set(fitted)
    trained = json.loads((run / "timing.json").read_text())["train_seconds"]

    assert main(["evaluate", str(run), "--samples", "3", "--quiet"]) == 0
    evaluated = json.loads((run / "metrics.json").read_text())
    assert set(evaluated) == set(fitted) and evaluated["posterior_samples"] == 3
    for key in ("epochs", "seed", "best_epoch"):
        assert evaluated[key] == fitted[key]
    assert json.loads((run / "timing.json").read_text())["train_seconds"] == trained

    stamp = (run / "checkpoint.pt").stat().st_mtime_ns
    capsys.readouterr()
    assert main(["compare", "--preset", str(one_seed), "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "fit " not in printed and "refitting" not in printed
    assert (run / "checkpoint.pt").stat().st_mtime_ns == stamp


def test_compare_rejects_a_variant_the_inference_spec_does_not_compute(tmp_path, preset, capsys):
    text = preset.read_text().replace('variant = "mc_dropout"', 'variant = "laplace"')
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace("seeds = [0, 1]", "seeds = [0]"))
    assert main(["compare", "--preset", str(bad), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert "posthoc does not list 'laplace'" in capsys.readouterr().err
    assert not (tmp_path / "o" / "runs").exists()  # checked before any training


def test_a_method_can_have_its_own_seeds(tmp_path, preset):
    text = preset.read_text().replace("seeds = [0, 1]", "seeds = [0]")
    text = text.replace("ensemble = true", "ensemble = true\nseeds = [0, 1]")
    path = tmp_path / "own_seeds.toml"
    path.write_text(text)
    out = tmp_path / "cmp"
    assert main(["compare", "--preset", str(path), "--out", str(out), "--quiet"]) == 0
    assert len(list((out / "runs").iterdir())) == 2  # seed 1 trained for the ensemble only
    rows = {r["method"]: r for r in csv.DictReader((out / "table.csv").open())}
    assert (rows["MAP"]["seeds"], rows["ensemble"]["seeds"]) == ("1", "2")


def test_a_method_can_have_its_own_epochs_if_its_run_agrees(tmp_path, preset, capsys):
    text = preset.read_text().replace("seeds = [0, 1]", "seeds = [0]")
    mixed = tmp_path / "mixed.toml"
    mixed.write_text(text.replace('paper = "90.0"', 'paper = "90.0"\nepochs = 2'))
    assert main(["compare", "--preset", str(mixed), "--out", str(tmp_path / "m"), "--quiet"]) == 2
    assert "'MAP' and 'MAP + TS' share the runs" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()

    agreed = tmp_path / "agreed.toml"
    agreed.write_text(text.replace('inference = "', 'epochs = 2\ninference = "'))
    out = tmp_path / "a"
    assert main(["compare", "--preset", str(agreed), "--out", str(out), "--quiet"]) == 0
    (folder,) = (out / "runs").iterdir()
    history = json.loads((folder / "history.json").read_text())
    assert [row["epoch"] for row in history] == [1, 2]  # the methods' 2, not the preset's 1
    capsys.readouterr()

    longer = tmp_path / "longer.toml"
    longer.write_text(text.replace('inference = "', 'epochs = 3\ninference = "'))
    assert main(["compare", "--preset", str(longer), "--out", str(out), "--quiet"]) == 0
    assert "(trained for 2 epochs, 3 asked: trained again)" in capsys.readouterr().out
    assert len(json.loads((folder / "history.json").read_text())) == 3
    assert main(["compare", "--preset", str(longer), "--out", str(out), "--quiet"]) == 0
    assert "fit " not in capsys.readouterr().out  # now finished with 3 epochs: reused


def one_method(preset: Path, seeds: str = "[0]") -> Path:
    """The preset's first method alone (MAP), for seeds ``seeds``."""
    text = preset.read_text().replace("seeds = [0, 1]", f"seeds = {seeds}")
    path = preset.with_name("one.toml")
    path.write_text(text.split('[[method]]\nname = "MAP + TS"')[0])
    return path


def test_compare_retrains_a_run_of_an_edited_spec_and_says_why(
    tmp_path, preset, tiny_model_file, capsys
):
    """A run is reused only if its checkpoint's spec texts, seed and epochs are those asked:
    after the model spec is edited (H-STO → softmax attention) it is trained again, and the
    table reads the new run."""
    from probtrans.storage.checkpoint import load_checkpoint

    one, out = one_method(preset), tmp_path / "cmp"
    argv = ["compare", "--preset", str(one), "--out", str(out), "--quiet"]
    assert main(argv) == 0
    capsys.readouterr()
    (folder,) = (out / "runs").iterdir()
    edited = tiny_model_file.read_text().replace('kind = "h_sto"', 'kind = "softmax"')
    tiny_model_file.write_text(edited.replace("tau1 = 1.0\ntau2 = 2.0\nn_centroids = 3\n", ""))
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert f"fit {folder.name} (trained from another {tiny_model_file} (edited since)" in printed
    assert load_checkpoint(folder / "checkpoint.pt")["model_spec"] == tiny_model_file.read_text()
    assert main(argv) == 0
    assert "fit " not in capsys.readouterr().out  # the retrained run is reused

    metrics = json.loads((folder / "metrics.json").read_text())
    (folder / "metrics.json").write_text(json.dumps({**metrics, "seed": 5}))
    assert main(argv) == 0
    assert "(trained with seed 5, 0 asked: trained again)" in capsys.readouterr().out


def test_compare_refuses_a_method_given_twice(tmp_path, tiny_model_file, capsys):
    inference = tiny_inference(tmp_path, "map")
    out = tmp_path / "cmp"
    twice = [str(tiny_model_file)] * 2
    assert main(["compare", *twice, "--inference", str(inference), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "/tiny + map': the same method twice; each row of the table" in err, err
    assert not out.exists()


def test_compare_refuses_specs_whose_data_cannot_share_a_table(tmp_path, tiny_model_file, capsys):
    """Texts against images, or other out-of-domain sets: refused before anything trains."""
    inference = tiny_inference(tmp_path, "map")
    text = tmp_path / "text.toml"
    text.write_text('[data]\nname = "cola"\nmax_len = 16\n\n[model]\nmax_positions = 16\n')
    other_ood = tmp_path / "other.toml"
    other_ood.write_text(tiny_model_file.read_text().replace("patch_size = 2", "ood_classes = [9]"))
    for second, words in (
        (text, "texts, out-of-domain sets ['cola_ood']"),
        (other_ood, "['digits_9']"),
    ):
        out = tmp_path / f"cmp-{second.stem}"
        argv = [str(tiny_model_file), str(second), "--inference", str(inference), "--out", str(out)]
        assert main(["compare", *argv]) == 2
        err = capsys.readouterr().err
        assert "images, out-of-domain sets ['digits_8_9']" in err and words in err, err
        assert "cannot share one table" in err and not out.exists()


def test_compare_names_a_missing_spec(tmp_path, capsys):
    path = tmp_path / "p.toml"
    path.write_text(
        '[[method]]\nname = "a"\nmodel = "nope.toml"\ninference = "inference/map.toml"\n'
    )
    assert main(["compare", "--preset", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "method 'a': model" in err and "nope.toml" in err


@pytest.mark.parametrize("preset", sorted((ROOT / "results" / "presets").glob("*.toml")))
def test_shipped_presets_name_valid_specs_and_variants(preset):
    comparison = load_preset(preset)
    check_methods(comparison)  # raises on a bad spec or a variant the inference spec lacks
    assert comparison.method and all(Path(m.model).is_file() for m in comparison.method)


def test_the_table_warns_of_a_method_that_predicts_one_class(tmp_path):
    from probtrans.runs.compare import markdown

    comparison = load_preset(ROOT / "results" / "presets" / "minilm_cola.toml")
    rows = [{"method": "SGPA (top 2 blocks)", "seeds": "1"}]
    text = markdown(rows, comparison, {"SGPA (top 2 blocks)": "every one of the 908 … 'x'"})
    assert "**Warning**: SGPA (top 2 blocks): every one of the 908 … 'x'." in text
    assert "**Warning**" not in markdown(rows, comparison)


def test_a_network_without_random_sites_keeps_the_draws_its_metrics_name(tmp_path):
    """No prior and softmax attention: every draw is the same predictive; probs.npz keeps the
    S draws metrics.json names, so that compare reads the run (it refused it as two
    evaluations when one draw was kept)."""
    from probtrans.runs import fit
    from probtrans.runs.kept import check_samples, read_probs
    from tests.conftest import TINY_MODEL

    model = tmp_path / "model.toml"
    model.write_text(TINY_MODEL[: TINY_MODEL.index("[model.attention]")])  # softmax, no prior
    assert "prior" not in model.read_text() and "attention" not in model.read_text()
    run = fit(model, tiny_inference(tmp_path, "map"), out=tmp_path / "run", progress=False)
    metrics = json.loads((run.path / "metrics.json").read_text())
    kept = read_probs(run.path / "probs.npz").probs
    check_samples(run.path, metrics, kept)
    assert kept["plain"]["test"].shape[0] == metrics["posterior_samples"] == 4
    np.testing.assert_array_equal(kept["plain"]["test"], kept["plain"]["test"][:1].repeat(4, 0))


def test_compare_over_a_run_without_feature_scores_says_why_its_columns_are_empty(
    tmp_path, preset, capsys
):
    """A run folder written before feature scores were fitted (no ``feature.*`` entries in its
    probs.npz): compare names it and the command that fills its OOD columns; after that command
    the note is gone and the columns hold numbers."""
    one_seed = tmp_path / "one_seed.toml"
    one_seed.write_text(preset.read_text().replace("seeds = [0, 1]", "seeds = [0]"))
    out = tmp_path / "cmp"
    argv = ["compare", "--preset", str(one_seed), "--out", str(out), "--quiet"]
    assert main(argv) == 0
    (run,) = (out / "runs").iterdir()
    filled = (out / "table.md").read_text()
    with np.load(run / "probs.npz") as kept:
        older = {name: kept[name] for name in kept.files if not name.startswith("feature.")}
    np.savez_compressed(run / "probs.npz", **older)
    (run / "feature_scores.npz").unlink()
    capsys.readouterr()
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert f"note: {run} keeps no feature scores" in err
    assert f"probtrans evaluate {run} fits them" in err
    assert (out / "table.md").read_text().count("–") > filled.count("–")  # empty OOD columns
    assert main(["evaluate", str(run), "--quiet"]) == 0
    capsys.readouterr()
    assert main(argv) == 0
    assert "keeps no feature scores" not in capsys.readouterr().err
    assert (out / "table.md").read_text().count("–") == filled.count("–")
