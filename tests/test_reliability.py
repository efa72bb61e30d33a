"""Nothing the user wrote is lost: run folders replaced only when they are runs, one fit per
folder at a time, divergence stopped, unreadable caches and resume files set aside and rebuilt,
same seed → same bytes, and a fit killed at any moment resumes to the same files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import probtrans.inference.train
import probtrans.runs.evaluation
from probtrans.cli import main
from probtrans.data import load_data
from probtrans.runs import fit
from probtrans.specs import DataSpec
from probtrans.storage.checkpoint import load_checkpoint, save_checkpoint
from probtrans.storage.lock import folder_lock, lock_path
from tests.conftest import ROOT, TINY_MODEL, tiny_inference
from tests.test_corrections import TINY as TINY_SEGMENTATION

DATA = os.environ.get("PROBTRANS_DATA_DIR")


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder`` → its bytes (None for folders)."""
    return {
        str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes()
        for p in sorted(folder.rglob("*"))
    }


def run_files(folder: Path) -> dict[str, bytes]:
    """The files of a run folder, the timing record aside."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name != "timing.json"}


@pytest.fixture
def specs(tmp_path, tiny_model_file):
    return tiny_model_file, tiny_inference(tmp_path, "mfvi")


def fit_args(specs, out: Path, *extra: str) -> list[str]:
    model, inference = specs
    return ["fit", str(model), "--inference", str(inference), "--out", str(out), "--quiet", *extra]


# ------------------------------------------------------------------------- folders and locks
def test_fit_refuses_a_folder_that_is_not_a_run_and_leaves_it_untouched(tmp_path, specs, capsys):
    out = tmp_path / "d"
    out.mkdir()
    (out / "precious.txt").write_text("notes")
    before = snapshot(tmp_path)
    assert main(fit_args(specs, out)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "precious.txt" in err[0] and "--force" in err[0]
    assert snapshot(tmp_path) == before

    assert main(fit_args(specs, out, "--force")) == 0
    assert not (out / "precious.txt").exists() and (out / "metrics.json").is_file()


def test_a_run_folder_holding_a_users_file_is_not_replaced(tmp_path, specs, capsys):
    out = tmp_path / "run"
    assert main(fit_args(specs, out)) == 0
    (out / "my-notes.md").write_text("keep me")
    before = snapshot(tmp_path)
    assert main(fit_args(specs, out, "--seed", "1")) == 2
    assert "my-notes.md" in capsys.readouterr().err
    assert snapshot(tmp_path) == before


def test_a_second_fit_into_the_same_folder_is_refused_while_the_first_runs(tmp_path, specs, capsys):
    model, inference = specs
    inference.write_text(inference.read_text().replace("epochs = 2", "epochs = 4"))
    out = tmp_path / "run"
    first = subprocess.Popen(
        [sys.executable, "-m", "probtrans", *fit_args(specs, out)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not lock_path(out).exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert main(fit_args(specs, out)) == 2
    assert first.poll() is None  # still running: the refusal was not a race won by luck
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {out}: in use by pid {first.pid} on host")
    stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    assert (out / "metrics.json").is_file() and not lock_path(out).exists()
    assert not list(out.glob(".*")) and not out.with_name("run.partial").exists()


def test_the_lock_of_a_running_command_refuses_and_a_stale_one_is_taken_over(
    tmp_path, specs, capsys
):
    out = tmp_path / "run"
    with folder_lock(out, "probtrans evaluate"):
        assert main(fit_args(specs, out)) == 2
        assert f"in use by pid {os.getpid()}" in capsys.readouterr().err
    assert not lock_path(out).exists()

    lock_path(out).write_text("pid 4242 on host elsewhere (probtrans fit, started yesterday)\n")
    assert main(fit_args(specs, out)) == 0
    assert "took over the stale lock of pid 4242 on host elsewhere" in capsys.readouterr().err
    assert not lock_path(out).exists()


# ------------------------------------------------------------------------- divergence
def test_a_huge_learning_rate_stops_with_a_message_and_keeps_the_earlier_run(
    tmp_path, tiny_model_file, capsys
):
    text = tiny_inference(tmp_path, "map").read_text().replace("lr = 5e-3", "lr = 1e4")
    inference = tmp_path / "huge-lr.toml"
    inference.write_text(text)
    out = tmp_path / "run"
    assert main(fit_args((tiny_model_file, tiny_inference(tmp_path, "map")), out)) == 0
    before = snapshot(out)
    capsys.readouterr()
    assert main(fit_args((tiny_model_file, inference), out)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: training diverged at epoch 1, step ")
    assert "optim.lr = 10000" in err[0]
    assert snapshot(out) == before  # the last good run
    assert not out.with_name("run.partial").exists() and not lock_path(out).exists()


def test_divergence_in_a_later_epoch_keeps_the_last_good_checkpoint(
    tmp_path, specs, monkeypatch, capsys
):
    """From epoch 2 on the learning rate is 1e4: the loss explodes, training stops, and the
    checkpoint and resume state of epoch 1 stay in the staging folder."""
    epoch = probtrans.inference.train.SVITraining.epoch

    def huge_lr_from_epoch_2(self, number, *args):
        if number == 2:
            self.schedule.base_lrs = [1e4] * len(self.schedule.base_lrs)
            for group in self.optimizer.param_groups:
                group["lr"] = 1e4
        return epoch(self, number, *args)

    monkeypatch.setattr(probtrans.inference.train.SVITraining, "epoch", huge_lr_from_epoch_2)
    out = tmp_path / "run"
    assert main(fit_args(specs, out)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "training diverged at epoch 2" in err[0]
    assert "state after epoch 1 is kept in" in err[0]
    staging = tmp_path / "run.partial"
    assert load_checkpoint(staging / "checkpoint.pt")["epoch"] == 1
    assert load_checkpoint(staging / "resume.pt")["epoch"] == 1
    assert not out.exists() and not lock_path(out).exists()


# ------------------------------------------------------------------------- reproducibility
def test_two_fits_with_one_seed_write_the_same_bytes(tmp_path, specs):
    model, inference = specs
    fit(model, inference, out=tmp_path / "a", progress=False)
    fit(model, inference, out=tmp_path / "b", progress=False)
    a, b = run_files(tmp_path / "a"), run_files(tmp_path / "b")
    assert {"metrics.json", "checkpoint.pt", "predictive.nc", "probs.npz"} <= set(a)
    for name in a:
        assert a[name] == b[name], name
    assert "train_seconds" not in (tmp_path / "a" / "metrics.json").read_text()
    assert (tmp_path / "a" / "timing.json").read_text() != ""


# ------------------------------------------------------------------------- unreadable files
@pytest.mark.parametrize("damage", ["truncated", "random", "incomplete"])
def test_an_unreadable_resume_file_is_set_aside_and_the_fit_starts_over(
    tmp_path, specs, damage, capsys
):
    out = tmp_path / "run"
    resume = tmp_path / "run.partial" / "resume.pt"
    resume.parent.mkdir()
    if damage == "incomplete":
        save_checkpoint(resume, {"epoch": 1})
    else:
        save_checkpoint(resume, {"epoch": 1, "identity": {}, "model_state": torch.ones(100)})
        content = resume.read_bytes()
        resume.write_bytes(
            content[: len(content) // 2] if damage == "truncated" else os.urandom(300)
        )
    damaged = resume.read_bytes()
    assert main(fit_args(specs, out, "--seed", "3")) == 0
    err = capsys.readouterr().err
    assert f"{resume}: not a readable probtrans checkpoint" in err and "starts over" in err
    assert (tmp_path / "run.unreadable-resume.pt").read_bytes() == damaged
    assert (out / "metrics.json").is_file() and not resume.parent.exists()


@pytest.mark.skipif(
    not DATA or not Path(DATA, "cola").is_dir(), reason="PROBTRANS_DATA_DIR has no cola/"
)
@pytest.mark.parametrize("damage", ["truncated", "random", "incomplete", "empty"])
def test_an_unreadable_cache_file_is_set_aside_and_rebuilt(tmp_path, monkeypatch, damage, capsys):
    monkeypatch.setenv("PROBTRANS_CACHE_DIR", str(tmp_path))
    spec = DataSpec(name="cola", max_len=64)
    first = load_data(spec)
    (path,) = tmp_path.glob("cola-*.pt")
    content = path.read_bytes()
    if damage == "incomplete":
        save_checkpoint(path, {"tokenizer": "{}"})
    else:
        path.write_bytes(
            {"truncated": content[: len(content) // 3], "random": os.urandom(999), "empty": b""}[
                damage
            ]
        )
    damaged = path.read_bytes()
    again = load_data(spec)
    err = capsys.readouterr().err
    assert f"note: cache {path}: not a readable probtrans checkpoint" in err and "rebuilt" in err
    assert path.with_name(path.name + ".unreadable").read_bytes() == damaged
    assert not again.description["from_cache"]
    assert torch.equal(again.train.inputs, first.train.inputs)
    assert load_data(spec).description["from_cache"]  # the rebuilt cache is read next time


class Exploit:
    """Unpickling this would write ``marker``: a cache must never run it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "code from a cache ran"))


@pytest.mark.parametrize("damage", ["random", "pickled code"])
def test_an_unreadable_corrections_model_is_set_aside_and_retrained(tmp_path, damage, capsys):
    spec = tmp_path / "segmentation.toml"
    spec.write_text(TINY_SEGMENTATION)
    path = tmp_path / "corr" / "model.pt"
    path.parent.mkdir()
    if damage == "random":
        path.write_bytes(os.urandom(500))
    else:
        torch.save({"format": 1, "state": Exploit(tmp_path / "pwned")}, path)
    damaged = path.read_bytes()
    assert main(["corrections", str(spec), "--out", str(path.parent)]) == 0
    err = capsys.readouterr().err
    assert f"note: cache {path}: not a readable probtrans checkpoint" in err
    assert path.with_name("model.pt.unreadable").read_bytes() == damaged
    assert set(load_checkpoint(path)) >= {"fingerprint", "state"}
    assert not (tmp_path / "pwned").exists()


# ------------------------------------------------------------------------- run folders
def test_evaluate_uses_the_specs_kept_in_the_checkpoint(tiny_run, capsys):
    before = (tiny_run / "metrics.json").read_text()
    (tiny_run / "model.toml").write_text("[model]\nd_model = 1048576\n")
    (tiny_run / "inference.toml").write_bytes(os.urandom(64))
    assert main(["evaluate", str(tiny_run), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert f"note: {tiny_run / 'model.toml'} is not the spec this run was trained with" in err
    assert (tiny_run / "metrics.json").read_text() == before


def test_evaluate_moves_the_training_time_of_an_older_run_into_timing_json(tiny_run):
    metrics = json.loads((tiny_run / "metrics.json").read_text())
    (tiny_run / "metrics.json").write_text(json.dumps({**metrics, "train_seconds": 12.5}))
    (tiny_run / "timing.json").unlink()
    assert main(["evaluate", str(tiny_run), "--quiet"]) == 0
    assert json.loads((tiny_run / "metrics.json").read_text()) == metrics
    assert json.loads((tiny_run / "timing.json").read_text())["train_seconds"] == 12.5


def test_evaluate_says_where_its_seconds_went(tiny_run, capsys):
    """timing.json keeps the seconds of each part of the evaluation (within its total), and the
    command's last line names the longest ones."""
    assert main(["evaluate", str(tiny_run), "--quiet"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    timing = json.loads((tiny_run / "timing.json").read_text())
    parts = timing["evaluate_parts"]
    assert {"posterior_draws", "predictive", "feature_scores", "metrics", "files"} <= set(parts)
    assert 0 < sum(parts.values()) <= timing["evaluate_seconds"]
    longest = max(parts, key=parts.__getitem__)
    assert f"in {timing['evaluate_seconds']:.1f} s: {longest} {parts[longest]:.0f} s" in last


def test_a_network_too_large_for_memory_is_refused_before_anything_is_allocated(tmp_path, capsys):
    spec = tmp_path / "huge.toml"
    spec.write_text(TINY_MODEL.replace("d_model = 16", "d_model = 1048576"))
    assert main(["fit", str(spec), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {spec}: model: at least 3.3e+12 param")
    assert "model.d_model = 1048576" in err[0] and list(tmp_path.iterdir()) == [spec]


def test_evaluate_refuses_a_seed_out_of_range(tiny_run, capsys):
    before = snapshot(tiny_run)
    assert main(["evaluate", str(tiny_run), "--seed", "-1"]) == 2
    assert "--seed -1: must be an integer in 0" in capsys.readouterr().err
    assert snapshot(tiny_run) == before


def test_an_unexpected_fault_is_one_line_with_a_hint_and_debug_shows_the_traceback(
    tiny_run, monkeypatch, capsys
):
    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(probtrans.runs.evaluation, "evaluate", broken)
    assert main(["evaluate", str(tiny_run)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: probtrans evaluate failed unexpectedly (ZeroDivisionError: a bug); run again "
        "with --debug for the traceback, and please report it if the input looks right"
    ]
    assert main(["--debug", "evaluate", str(tiny_run)]) == 1
    assert "Traceback (most recent call last)" in capsys.readouterr().err
    assert not lock_path(tiny_run).exists()


# ------------------------------------------------------------------------- killed fits
#: a fit in a child process that SIGKILLs itself at a moment of the first epoch it trains:
#: argv[1] is ``mid_epoch``, ``after_epoch`` or the name of a file whose write it interrupts
KILLED_FIT = textwrap.dedent(
    """
    import os, signal, sys
    import probtrans.storage.io, probtrans.inference.train as train
    from probtrans.cli import main

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    where = sys.argv[1]
    if where == "mid_epoch":  # after two training steps (and the loss-scale evaluation)
        loss, calls = train.SVITraining.loss, []
        def dying_loss(self, *batch, **options):
            calls.append(1)
            if len(calls) == 4:
                die()
            return loss(self, *batch, **options)
        train.SVITraining.loss = dying_loss
    elif where == "after_epoch":  # right after the epoch's resume state was saved
        save = train.Resumable.save
        def dying_save(self, state):
            save(self, state)
            die()
        train.Resumable.save = dying_save
    else:  # the temporary copy of file ``where`` is complete, not yet renamed
        replace = probtrans.storage.io.os.replace
        def dying_replace(src, dst):
            if os.path.basename(dst) == where:
                die()
            replace(src, dst)
        probtrans.storage.io.os.replace = dying_replace
    sys.exit(main(sys.argv[2:]))
    """
)


def test_a_fit_killed_at_several_moments_resumes_to_the_same_files(tmp_path, specs):
    """One fit of 3 epochs, SIGKILLed five times in a row, each run continuing what the last
    left: while writing the first checkpoint, right after epoch 1, in the middle of epoch 2,
    while writing epoch 2's resume file, then run to the end."""
    model, inference = specs
    inference.write_text(inference.read_text().replace("epochs = 2", "epochs = 3"))
    fit(model, inference, out=tmp_path / "straight", progress=False)

    out = tmp_path / "killed"
    args = fit_args(specs, out)
    for where in ("checkpoint.pt", "after_epoch", "mid_epoch", "resume.pt"):
        child = subprocess.run(
            [sys.executable, "-c", KILLED_FIT, where, *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert child.returncode == -9, (where, child.stderr)
        assert not out.exists() and lock_path(out).exists()
    staging = out.with_name("killed.partial")
    assert list(staging.glob(".resume.pt.*.partial"))  # the write the last kill interrupted
    again = subprocess.run(
        [sys.executable, "-m", "probtrans", *args], cwd=ROOT, capture_output=True, text=True
    )
    assert again.returncode == 0, again.stderr
    assert "took over the stale lock" in again.stderr
    assert run_files(out) == run_files(tmp_path / "straight")
    assert {p.name for p in tmp_path.iterdir()} == {"killed", "straight", "tiny.toml", "mfvi.toml"}
    assert not list(out.glob(".*")) and not lock_path(out).exists() and not staging.exists()
