"""End to end: fit → run folder → evaluate; ArviZ on the predictive; CLI errors."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
import torch

import probtrans.inference.train
import probtrans.runs.run
from probtrans.analysis import metrics
from probtrans.classifier import build_classifier
from probtrans.cli import main
from probtrans.data import DataBundle
from probtrans.errors import ConfigError, ProbtransError
from probtrans.inference.predictive import sample_predictive
from probtrans.inference.train import (
    STATEFUL_KEYS,
    Resumable,
    TrainingState,
    kl_annealing_at,
    train_classifier,
)
from probtrans.resolve import load_inference_spec, load_model_spec
from probtrans.runs import Run, evaluate_run, fit, load_run
from probtrans.segmentation import load_segmentation_spec
from probtrans.specs.inference import AUTOMATIC_LOO_SAMPLES
from probtrans.storage.checkpoint import load_checkpoint
from tests.conftest import ROOT, TINY_MODEL, inference_file, tiny_inference, tiny_spec

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)
    import arviz as az


@pytest.mark.parametrize("guide", ["map", "mfvi", "lowrank"])
def test_fit_writes_a_complete_run_that_evaluate_reproduces(
    tmp_path, tiny_model_file, guide, device
):
    """Trained, evaluated and evaluated again on the ``--device`` of the test run."""
    out = tmp_path / "run"
    inference = tiny_inference(tmp_path, guide)
    scores = fit(tiny_model_file, inference, out=out, device=device, progress=False).metrics
    for name in (
        "metrics.json",
        "predictive.nc",
        "report.png",
        "checkpoint.pt",
        "history.json",
        "model.toml",
        "inference.toml",
        "data.json",
        "data.pt",
    ):
        assert (out / name).is_file(), name
    assert not (tmp_path / "run.partial").exists()
    written = json.loads((out / "metrics.json").read_text())
    for key in ("accuracy", "nll", "ece", "brier"):
        assert np.isfinite(written[key])
    for report in written["ood"]["digits_8_9"].values():
        assert not isinstance(report, dict) or np.isfinite(list(report.values())).all()
    assert len(json.loads((out / "history.json").read_text())) == 2

    idata = az.from_netcdf(out / "predictive.nc")
    n_test, n_ood = written_sizes(out)
    n_train = len(load_run(out).data.train)
    shared = AUTOMATIC_LOO_SAMPLES  # the draws the posterior, likelihood and predictive share
    assert idata.posterior_predictive["y_test"].shape == (1, shared, n_test)
    assert idata.posterior_predictive["log_lik_test"].shape == (1, shared, n_test)
    assert idata.log_likelihood["y_train"].shape == (1, shared, n_train)  # training
    assert idata.predictions["probs_digits_8_9"].shape == (1, 4, n_ood, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # k̂: a point mass's is ∞ (metrics say so)
        loo = az.loo(idata, pointwise=True)
        table = az.compare({"a": loo, "b": az.loo(idata, pointwise=True)})
    assert np.isfinite(loo.elpd_loo) and loo.n_data_points == n_train
    assert list(table["elpd_loo"]) == pytest.approx([loo.elpd_loo] * 2)
    assert written["loo"] == pytest.approx(loo.elpd_loo)

    again = evaluate_run(out, device=device)  # same seed → same posterior draws → same metrics
    for key in ("accuracy", "nll", "ece"):
        assert again[key] == pytest.approx(scores[key], rel=1e-5)
    ood, ood_again = scores["ood"]["digits_8_9"], again["ood"]["digits_8_9"]
    assert set(ood) == {"n", *metrics.UNCERTAINTY_SCORES}
    for score in metrics.UNCERTAINTY_SCORES:
        assert ood_again[score] == pytest.approx(ood[score], rel=1e-5)


def test_evaluate_draws_the_posterior_once_and_its_first_draws_are_the_predictives(
    tmp_path, tiny_model_file, monkeypatch
):
    """``evaluate`` takes max(samples, LOO draws) draws in one call and slices them: the first
    ``samples`` for the predictive, as many as LOO asks for the training log-likelihood. The
    draws come one after the other, so the first S of more draws are those S draws alone."""
    out = tmp_path / "run"
    inference = tiny_inference(tmp_path, "mfvi")
    inference.write_text(inference.read_text() + "loo_samples = 12\n")
    fit(tiny_model_file, inference, out=out, progress=False)
    run = load_run(out)
    many, few = run.posterior_samples(12), run.posterior_samples(4)
    assert not torch.equal(many["head.weight"][0], many["head.weight"][1])  # not a point mass
    for name, value in few.items():
        assert torch.equal(value, many[name][:4]), name

    calls = []
    drawn = probtrans.runs.run.posterior_draws

    def counted(guide, samples, *args, **kwargs):
        calls.append(samples)
        return drawn(guide, samples, *args, **kwargs)

    monkeypatch.setattr(probtrans.runs.run, "posterior_draws", counted)
    before = json.loads((out / "metrics.json").read_text())
    again = evaluate_run(out)
    assert calls == [12]  # one draw: max(samples = 4, loo_samples = 12)
    assert again["posterior_samples"] == 4 and again["loo"] == pytest.approx(before["loo"])
    idata = az.from_netcdf(out / "predictive.nc")
    assert idata.log_likelihood["y_train"].shape[1] == 12 and idata.posterior.sizes["draw"] == 12


def written_sizes(out):
    run = load_run(out)
    return len(run.data.test), len(run.data.ood["digits_8_9"])


def test_checkpoint_reload_gives_the_same_guide(tmp_path, tiny_model_file):
    out = tmp_path / "run"
    fit(tiny_model_file, tiny_inference(tmp_path, "mfvi"), out=out, progress=False)
    state = load_checkpoint(out / "checkpoint.pt")
    run = load_run(out)
    for name, value in run.guide.state_dict().items():
        torch.testing.assert_close(value, state["guide_state"][name])
    assert state["model_spec"] == (out / "model.toml").read_text()
    assert state["probtrans_version"]


def test_an_interrupted_fit_resumes_where_it_stopped_and_ends_as_an_uninterrupted_one(
    tmp_path, tiny_model_file, monkeypatch, capsys
):
    inference = tiny_inference(tmp_path, "mfvi")
    straight = tmp_path / "straight"
    fit(tiny_model_file, inference, out=straight, progress=False)

    validation = probtrans.inference.train.validation_metric
    calls = []

    def interrupted_in_epoch_2(*args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return validation(*args)

    resumed = tmp_path / "resumed"
    monkeypatch.setattr(probtrans.inference.train, "validation_metric", interrupted_in_epoch_2)
    with pytest.raises(KeyboardInterrupt):
        fit(tiny_model_file, inference, out=resumed, progress=False)
    assert not resumed.exists()
    assert load_checkpoint(tmp_path / "resumed.partial" / "resume.pt")["epoch"] == 1

    monkeypatch.setattr(probtrans.inference.train, "validation_metric", validation)
    scores = fit(tiny_model_file, inference, out=resumed).metrics
    assert "resuming" in capsys.readouterr().out
    assert not (resumed / "resume.pt").exists()
    assert (resumed / "history.json").read_text() == (straight / "history.json").read_text()
    expected = load_checkpoint(straight / "checkpoint.pt")
    got = load_checkpoint(resumed / "checkpoint.pt")
    for part in ("model_state", "guide_state"):
        for name, value in expected[part].items():
            torch.testing.assert_close(got[part][name], value, rtol=0, atol=0)
    written = json.loads((straight / "metrics.json").read_text())
    assert scores["nll"] == written["nll"] and scores["epochs"] == written["epochs"] == 2
    assert json.loads((resumed / "timing.json").read_text())["train_seconds"] > 0


def test_a_saved_state_of_another_fit_is_not_resumed(tmp_path, tiny_model_file, capsys):
    inference = tiny_inference(tmp_path, "map")
    staging = tmp_path / "run.partial"
    other = {**TrainingState(epoch=1).as_dict(), **dict.fromkeys(STATEFUL_KEYS, {})}
    Resumable(staging / "resume.pt", {"seed": 1}).save(other)
    fit(tiny_model_file, inference, out=tmp_path / "run", seed=0, epochs=1)
    out, err = capsys.readouterr()
    assert "resuming" not in out and "not a readable" not in err
    assert len(json.loads((tmp_path / "run" / "history.json").read_text())) == 1


def test_checkpoint_with_pickled_objects_is_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"format": 1, "payload": ProbtransError("not plain data")}, path)
    with pytest.raises(ProbtransError, match="not a readable probtrans checkpoint"):
        load_checkpoint(path)


SHIPPED_SPECS = [
    (load_segmentation_spec if path.parent.name == "digits_segmentation" else load_model_spec, path)
    for path in sorted(ROOT.glob("models/**/*.toml"))
] + [(load_inference_spec, path) for path in sorted(ROOT.glob("inference/**/*.toml"))]


@pytest.mark.parametrize(
    "loader, path", SHIPPED_SPECS, ids=[str(path.relative_to(ROOT)) for _, path in SHIPPED_SPECS]
)
def test_every_shipped_spec_loads(loader, path):
    """Spec files that no preset names are checked too: unknown keys and bad values raise."""
    loader(path)


def test_early_stopping_and_kl_annealing(digits):
    spec = load_inference_spec(ROOT / "inference" / "mfvi.toml")
    spec.train.epochs, spec.train.patience, spec.train.batch_size = 8, 2, 256
    spec.optim.lr = 0.0  # a deterministic net that does not learn: no epoch beats the first
    spec.train.monitor = "nll"
    classifier = build_classifier(tiny_spec("softmax"), digits)
    result = train_classifier(classifier, digits, spec, progress=False)
    assert [h["epoch"] for h in result.history] == [1, 2, 3]
    assert result.best.epoch == 1
    assert kl_annealing_at(spec, 0.0) == 0.0
    assert kl_annealing_at(spec, 2.5) == pytest.approx(0.5)
    assert kl_annealing_at(spec, 50.0) == 1.0


def test_early_stopping_monitors_any_ranked_metric_in_its_direction(digits):
    """``train.monitor`` is any registered metric that is better higher or lower: the epoch
    kept has the lowest validation ECE (lower is better) of the history, the highest accuracy
    when accuracy is monitored; a metric that ranks nothing, or an unknown one, is refused
    naming the field."""
    spec = load_inference_spec(ROOT / "inference" / "map.toml")
    spec.train.epochs, spec.train.batch_size = 4, 256
    for monitor, best in (("ece", np.argmin), ("accuracy", np.argmax)):
        spec.train.monitor = monitor
        classifier = build_classifier(tiny_spec("softmax"), digits)
        result = train_classifier(classifier, digits, spec, progress=False)
        values = [record[f"val_{monitor}"] for record in result.history]
        assert len(set(values)) > 1 and result.best.epoch == 1 + int(best(values)), values
    for name, message in (
        ("entropy", "train.monitor = 'entropy': describes the predictive, neither better higher"),
        ("auroc", "train.monitor = 'auroc': unknown metric"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_inference_spec("bad.toml", f'[train]\nmonitor = "{name}"\n')


def learning_rates(optim: dict, total: int) -> list[float]:
    from probtrans.inference.train import make_optimizer
    from probtrans.specs import OptimSpec

    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer, schedule = make_optimizer(OptimSpec(**optim), [parameter], total)
    rates = []
    for _ in range(total):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    return rates


def test_a_warm_up_then_linear_decay_is_transformers_schedule():
    """10 % linear warm-up then linear decay to 0: the factors of transformers'
    get_linear_schedule_with_warmup, step by step."""
    from transformers import get_linear_schedule_with_warmup

    total = 50
    given = learning_rates({"name": "adamw", "lr": 1.0, "schedule": "linear", "warmup": 0.1}, total)
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([parameter], lr=1.0)
    schedule = get_linear_schedule_with_warmup(optimizer, 5, total)
    expected = []
    for _ in range(total):
        expected.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    np.testing.assert_allclose(given, expected, rtol=0, atol=1e-12)
    assert given[:6] == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])


def test_cosine_without_warm_up_is_the_half_cosine():
    total = 20
    given = learning_rates({"lr": 2.0, "schedule": "cosine"}, total)
    expected = [2.0 * 0.5 * (1 + math.cos(math.pi * step / total)) for step in range(total)]
    assert given == pytest.approx(expected)


@pytest.mark.parametrize("kind", ["h_sto", "sgpa"])
def test_bf16_training_runs_the_network_in_bfloat16_and_follows_float32(digits, kind):
    """``[train] precision = "bf16"`` (CPU autocast here): the head's matrix product runs in
    bfloat16 during training while parameters (and so the optimiser) stay float32, and two
    epochs of MFVI from the same initial weights give the float32 ELBO and validation NLL to
    within bfloat16 rounding accumulated over the steps (measured: at most 0.5 % for the
    ELBO, 0.01 % for the NLL; the bounds are 2 % and 1 %)."""
    spec = load_inference_spec(ROOT / "inference" / "mfvi.toml")
    spec.train.epochs, spec.train.patience, spec.train.batch_size = 2, 5, 128
    results, dtypes = {}, {}
    for precision in ("fp32", "bf16"):
        spec.train.precision = precision
        torch.manual_seed(0)  # the same initial weights
        classifier = build_classifier(tiny_spec(kind), digits)
        seen = dtypes.setdefault(precision, set())
        classifier.head.register_forward_hook(
            lambda module, args, out, seen=seen: seen.add(out.dtype)
        )
        results[precision] = train_classifier(classifier, digits, spec, progress=False)
        assert {p.dtype for p in classifier.parameters()} == {torch.float32}
    assert dtypes == {"fp32": {torch.float32}, "bf16": {torch.bfloat16, torch.float32}}
    for a, b in zip(results["fp32"].history, results["bf16"].history, strict=True):
        assert math.isfinite(b["elbo"])
        assert b["elbo"] == pytest.approx(a["elbo"], rel=0.02)
        assert b["val_nll"] == pytest.approx(a["val_nll"], rel=0.01)


def test_attention_sites_only_on_request(digits):
    classifier = build_classifier(tiny_spec("h_sto"), digits)
    split = digits.test
    plain = sample_predictive(classifier, lambda *a, **k: {}, split, samples=3, batch_size=100)
    assert set(plain) == {"probs", "obs", "energy"}
    assert plain["probs"].shape == (3, len(split), digits.n_classes)
    full = sample_predictive(
        classifier, lambda *a, **k: {}, split, samples=3, batch_size=100, attention=True
    )
    assert full["encoder.layers.0.attn.a_v"].shape == (3, len(split), 2, 16, 16)
    assert full["encoder.layers.0.attn.a_c"].shape == (3, len(split), 2, 16, 2)


def test_describe_lists_both_attention_levels(capsys):
    assert main(["describe", str(ROOT / "models" / "digits" / "h_sto.toml")]) == 0
    out = capsys.readouterr().out
    for site in (
        "encoder.layers.0.attn.a_c",
        "encoder.layers.0.attn.a_v",
        "encoder.layers.1.attn.a_c",
        "encoder.layers.1.attn.a_v",
    ):
        line = next(row for row in out.splitlines() if row.startswith(site))
        assert "RelaxedOneHotCategorical" in line
    assert any(row.startswith("head.weight") and "Normal" in row for row in out.splitlines())


BAD_MODELS = {
    "unknown key": ("[model]\nwidth = 3\n", "unknown key 'model.width'"),
    "tau": ('[model.attention]\nkind = "h_sto"\ntau2 = 0.0\n', "model.attention.tau2 = 0.0"),
    "heads": ("[model]\nd_model = 30\nn_heads = 4\n", "model.n_heads = 4: must divide"),
    "kind": ('[model.attention]\nkind = "magic"\n', "model.attention.kind = 'magic'"),
    "type": ('[model]\nn_layers = "two"\n', "model.n_layers"),
}


@pytest.mark.parametrize("case", sorted(BAD_MODELS))
def test_bad_model_specs_fail_with_one_clear_line(tmp_path, capsys, case):
    text, message = BAD_MODELS[case]
    spec = tmp_path / "bad.toml"
    spec.write_text(text)
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.json").write_text("{}")  # an earlier run that must survive
    assert main(["fit", str(spec), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and str(spec) in err[0]
    assert message in err[0]
    assert (out / "metrics.json").read_text() == "{}"


def test_bad_inference_spec_and_missing_files(tmp_path, capsys, tiny_model_file):
    bad = inference_file(tmp_path, "bad.toml", '[guide]\nname = "magic"\n')
    assert main(["fit", str(tiny_model_file), "--inference", str(bad)]) == 2
    assert "guide.name = 'magic': unknown guide" in capsys.readouterr().err
    assert main(["fit", str(tmp_path / "nope.toml")]) == 2
    assert "nope.toml: no such file" in capsys.readouterr().err
    assert main(["evaluate", str(tmp_path / "no-run")]) == 2
    assert "no such run folder" in capsys.readouterr().err


def test_run_names_come_from_the_spec_files_stems(tmp_path, tiny_model_file, monkeypatch, capsys):
    """The default run folder of ``fit``: the model's folder, the model's and the inference
    spec's stems; a spec in the working folder brings no folder name (not ``runs/-tiny-map``)."""
    from probtrans.runs.folder import run_name

    monkeypatch.chdir(tmp_path)
    assert run_name("tiny.toml", "map.toml") == "tiny-map"
    assert run_name(tmp_path / "tiny.toml", tmp_path / "map.toml", "__") == "tiny__map"
    digits = ROOT / "models" / "digits" / "h_sto.toml"
    assert run_name(digits, "inference/map.toml") == "digits-h_sto-map"
    inference = tiny_inference(tmp_path, "map")
    assert (
        main(["fit", "tiny.toml", "--inference", inference.name, "--epochs", "1", "--quiet"]) == 0
    )
    assert "run written to runs/tiny-map/" in capsys.readouterr().out
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["tiny-map"]


def test_a_probs_npz_of_another_run_is_not_read_as_this_runs(tmp_path, tiny_model_file, capsys):
    """``probs.npz`` keeps the SHA-256 of the checkpoint it was computed from: ``predict`` reads
    its validation predictive (the reference of ``entropy_percentile``) only from this run's.
    One copied from another run is ignored with a note and the validation predictive computed
    again; one written before the fingerprint was kept is read as it is, with a note."""
    from probtrans.runs.kept import FINGERPRINT, checkpoint_fingerprint

    inference = tiny_inference(tmp_path, "map")
    run = fit(tiny_model_file, inference, out=tmp_path / "a", epochs=1, progress=False)
    fit(tiny_model_file, inference, out=tmp_path / "b", epochs=1, seed=1, progress=False)
    probs = tmp_path / "a" / "probs.npz"
    with np.load(probs) as kept:
        assert str(kept[FINGERPRINT]) == checkpoint_fingerprint(tmp_path / "a")
        own = {k: kept[k] for k in kept.files}
    split = run.data.test
    capsys.readouterr()
    from_own = load_run(tmp_path / "a").predict(split)["entropy_percentile"]
    assert capsys.readouterr().err == ""

    probs.write_bytes((tmp_path / "b" / "probs.npz").read_bytes())  # another run's
    from_copy = load_run(tmp_path / "a").predict(split)["entropy_percentile"]
    err = capsys.readouterr().err
    assert f"note: {probs} was not computed from this run's checkpoint.pt" in err
    assert "validation predictive is computed again" in err
    probs.unlink()
    recomputed = load_run(tmp_path / "a").predict(split)["entropy_percentile"]
    np.testing.assert_array_equal(from_copy, recomputed)

    np.savez(probs, **{k: v for k, v in own.items() if k != FINGERPRINT})  # an older run's
    from_old = load_run(tmp_path / "a").predict(split)["entropy_percentile"]
    assert "keeps no fingerprint of the checkpoint" in capsys.readouterr().err
    np.testing.assert_array_equal(from_old, from_own)


def test_saved_data_of_another_run_are_not_read_as_this_runs(tmp_path, tiny_model_file, capsys):
    """``data.json`` and ``data.pt`` keep the SHA-256 of the checkpoint they were saved with.
    Copied from another run (here one on another split of the digits), they are ignored with a
    note and the data read from the model spec, and ``evaluate`` saves this run's again; for a
    run fitted on in-memory data, which nothing else holds, loading is refused, naming the
    file."""
    from probtrans.data.saved import saved_with
    from probtrans.runs.kept import checkpoint_fingerprint

    inference = tiny_inference(tmp_path, "map")
    fit(tiny_model_file, inference, out=tmp_path / "a", epochs=1, progress=False)
    other = tmp_path / "other.toml"
    other.write_text(TINY_MODEL.replace("patch_size = 2", "patch_size = 2\nsplit_seed = 7"))
    fit(other, inference, out=tmp_path / "b", epochs=1, progress=False)
    own = load_run(tmp_path / "a").data.test.labels
    assert saved_with(tmp_path / "a") == checkpoint_fingerprint(tmp_path / "a")
    for name in ("data.json", "data.pt"):
        (tmp_path / "a" / name).write_bytes((tmp_path / "b" / name).read_bytes())
    foreign = load_run(tmp_path / "b").data.test.labels
    assert not torch.equal(own, foreign)
    capsys.readouterr()
    run = load_run(tmp_path / "a")
    err = capsys.readouterr().err
    assert f"note: {tmp_path / 'a' / 'data.json'} was not saved with this run's checkpoint" in err
    assert "the data are read from the model spec's [data]" in err
    assert torch.equal(run.data.test.labels, own)
    evaluate_run(tmp_path / "a")
    assert saved_with(tmp_path / "a") == checkpoint_fingerprint(tmp_path / "a")
    capsys.readouterr()
    load_run(tmp_path / "a")
    assert "not saved with" not in capsys.readouterr().err

    labels = torch.arange(60) % 3
    for name, seed in (("c", 0), ("d", 1)):
        images = torch.rand(60, 8, 8, generator=torch.Generator().manual_seed(seed))
        bundle = DataBundle.from_tensors(train=(images, labels))
        fit(tiny_model_file, inference, out=tmp_path / name, epochs=1, data=bundle, progress=False)
    (tmp_path / "c" / "data.pt").write_bytes((tmp_path / "d" / "data.pt").read_bytes())
    with pytest.raises(ProbtransError, match=r"data.pt was not saved with this run's checkpoint"):
        load_run(tmp_path / "c")


def test_predict_out_replaces_an_existing_file_only_with_force(tiny_run, tmp_path, capsys):
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, x=np.zeros((2, 8, 8), dtype=np.float32))
    out = tmp_path / "keep.csv"
    out.write_text("the user's own notes\n")
    argv = ["predict", str(tiny_run), str(inputs), "--out", str(out), "--quiet"]
    assert main(argv) == 2
    assert f"--out {out}: exists" in capsys.readouterr().err
    assert out.read_text() == "the user's own notes\n"
    assert main([*argv, "--force"]) == 0
    assert out.read_text().startswith("row,predicted,")  # the input's position first


def test_digits_as_scikit_learn_gives_them_are_refused_by_a_digits_run(tiny_run):
    """``load_digits().images`` are 0–16; the default digits run was trained on 0–1: refused,
    with both ranges, by ``predict`` and by ``module()``; divided by 16 they are taken, and
    ``module()`` prepares (N, 8, 8) and (N, 1, 8, 8) images as ``predict`` does."""
    from sklearn.datasets import load_digits

    run = Run.load(tiny_run)
    images = load_digits().images[:6]
    with pytest.raises(ProbtransError, match=r"pixels in \[0, 16\], but the training images'"):
        run.predict(images)
    columns = run.predict(images / 16.0, samples=2)
    assert len(columns["predicted"]) == 6
    network = run.module()
    with pytest.raises(ProbtransError, match=r"pixels in \[0, 16\], but the training images'"):
        network(images)
    inputs, mask = run.data.encode(images / 16.0)  # what predict gives the classifier
    with torch.no_grad():  # the same attention noise for each call
        torch.manual_seed(0)
        prepared = network.classifier(inputs, mask)
        torch.manual_seed(0)
        three = network(images / 16.0)  # (N, 8, 8): one channel added
        torch.manual_seed(0)
        four = network(torch.as_tensor(images[:, None] / 16.0))  # (N, 1, 8, 8), float64
    torch.testing.assert_close(three, prepared)
    torch.testing.assert_close(four, prepared)
