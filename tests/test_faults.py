"""Run folders stay true under faults (issue 38): a disk that fills up at any write of ``fit``
or ``evaluate``, and SIGTERM or SIGHUP during a fit. After each, the run folder is the old
complete run or the new complete run, never a mix, and the command says so in one line."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import probtrans.inference.train
import probtrans.io
from probtrans.cli import Stopped, main, stop_signals_as_interrupts
from probtrans.lock import lock_path
from probtrans.runs import fit
from tests.conftest import ROOT, tiny_inference
from tests.test_reliability import run_files, snapshot


def consistent(folder: Path) -> int:
    """The posterior sample count of a complete run folder: ``metrics.json``'s, which must be
    that of ``probs.npz`` and of ``predictive.nc``'s out-of-domain predictions (its posterior
    predictive holds the draws it shares with the LOO's likelihood)."""
    import arviz as az

    said = json.loads((folder / "metrics.json").read_text())["posterior_samples"]
    with np.load(folder / "probs.npz") as probs:
        assert probs["plain/test"].shape[0] == said
    assert az.from_netcdf(folder / "predictive.nc").predictions.sizes["draw"] == said
    return said


class DiskFull:
    """``probtrans.io.atomic_write`` whose ``fail_at``-th call (from 1) writes its file whole,
    then fails as a full disk does; counts the calls."""

    def __init__(self, fail_at: int = 0) -> None:
        self.fail_at = fail_at
        self.calls: list[str] = []
        self.real = probtrans.io.atomic_write

    def __call__(self, path, write):
        self.calls.append(Path(path).name)
        if len(self.calls) != self.fail_at:
            return self.real(path, write)

        def full(tmp: Path) -> None:
            write(tmp)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        return self.real(path, full)


@pytest.fixture
def old_run(tmp_path, tiny_model_file) -> Path:
    """A complete run of 4 posterior samples (1 epoch), kept aside for each case to copy."""
    inference = tiny_inference(tmp_path, "map")
    fit(tiny_model_file, inference, out=tmp_path / "old", epochs=1, progress=False)
    assert consistent(tmp_path / "old") == 4
    return tmp_path / "old"


def one_error_line(err: str, *names: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert all(name in lines[0] for name in names), err
    return lines[0]


def test_a_full_disk_at_any_write_of_fit_keeps_the_old_run(
    tmp_path, old_run, tiny_model_file, monkeypatch, capsys
):
    """A fit of 6 posterior samples into the folder of the 4-sample run, the disk full at its
    1st, 2nd, ... write: exit 2, one line naming the folder and the cause, the old run byte for
    byte; the last case has no fault and writes the new complete run."""
    inference = tiny_inference(tmp_path, "map")
    inference.write_text(inference.read_text().replace("samples = 4", "samples = 6"))
    out = tmp_path / "run"
    argv = ["fit", str(tiny_model_file), "--inference", str(inference), "--out", str(out)]
    counting = DiskFull()
    monkeypatch.setattr(probtrans.io, "atomic_write", counting)
    assert main([*argv[:-1], str(tmp_path / "counted"), "--epochs", "1", "--quiet"]) == 0
    writes = counting.calls
    assert {"checkpoint.pt", "probs.npz", "predictive.nc", "metrics.json"} <= set(writes)
    capsys.readouterr()
    for fail_at in range(1, len(writes) + 1):
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(out.with_name("run.partial"), ignore_errors=True)
        shutil.copytree(old_run, out)
        before = snapshot(out)
        monkeypatch.setattr(probtrans.io, "atomic_write", DiskFull(fail_at))
        assert main([*argv, "--epochs", "1", "--quiet"]) == 2, writes[fail_at - 1]
        name = writes[fail_at - 1]
        one_error_line(capsys.readouterr().err, f"cannot write {name}: no space left on device")
        assert snapshot(out) == before, name
        assert not lock_path(out).exists() and not list(tmp_path.glob(".run.*"))
    monkeypatch.setattr(probtrans.io, "atomic_write", DiskFull())
    assert main([*argv, "--epochs", "1", "--quiet"]) == 0
    assert consistent(out) == 6


def test_a_full_disk_at_any_write_of_evaluate_keeps_the_old_run(
    tmp_path, old_run, monkeypatch, capsys
):
    counting = DiskFull()
    monkeypatch.setattr(probtrans.io, "atomic_write", counting)
    scratch = Path(shutil.copytree(old_run, tmp_path / "scratch"))
    assert main(["evaluate", str(scratch), "--samples", "6", "--quiet"]) == 0
    writes = counting.calls
    assert {"probs.npz", "predictive.nc", "report.png", "metrics.json"} <= set(writes)
    capsys.readouterr()
    before = snapshot(old_run)
    for fail_at in range(1, len(writes) + 1):
        monkeypatch.setattr(probtrans.io, "atomic_write", DiskFull(fail_at))
        assert main(["evaluate", str(old_run), "--samples", "6", "--quiet"]) == 2
        name = writes[fail_at - 1]
        line = one_error_line(
            capsys.readouterr().err,
            f"error: {old_run}: cannot write {name}: no space left on device",
        )
        assert line.endswith(f"{old_run} is as it was"), line
        assert snapshot(old_run) == before, name
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            "map.toml",
            "old",
            "scratch",
            "tiny.toml",
        ]
    monkeypatch.setattr(probtrans.io, "atomic_write", DiskFull())
    assert main(["evaluate", str(old_run), "--samples", "6", "--quiet"]) == 0
    assert consistent(old_run) == 6


def test_sigterm_stops_a_fit_like_ctrl_c_and_the_same_command_ends_as_an_uninterrupted_fit(
    tmp_path, tiny_model_file
):
    """SIGTERM to a real ``probtrans fit`` after its first epoch: exit 143, one line, the lock
    released, the last finished epoch kept; the same command then ends byte for byte as a fit
    that was never stopped (timing aside)."""
    inference = tiny_inference(tmp_path, "mfvi")
    inference.write_text(inference.read_text().replace("epochs = 2", "epochs = 40"))
    straight = tmp_path / "straight"
    fit(tiny_model_file, inference, out=straight, progress=False)

    out = tmp_path / "stopped"
    staging = out.with_name("stopped.partial")
    argv = [sys.executable, "-m", "probtrans", "fit", str(tiny_model_file)]
    argv += ["--inference", str(inference), "--out", str(out), "--quiet"]
    child = subprocess.Popen(argv, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (staging / "resume.pt").exists() and child.poll() is None:
        assert time.monotonic() < deadline, "no epoch finished in 120 s"
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 143, err
    line = one_error_line(err, "error: probtrans fit: stopped by SIGTERM; the state after epoch")
    assert f"is kept in {staging}/" in line
    assert not out.exists() and not lock_path(out).exists() and (staging / "resume.pt").exists()

    again = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert run_files(out) == run_files(straight)
    assert not staging.exists() and not lock_path(out).exists()


def test_sighup_stops_a_fit_with_status_129(tmp_path, tiny_model_file, monkeypatch, capsys):
    inference = tiny_inference(tmp_path, "map")
    validation = probtrans.inference.train.validation_metric
    calls = []

    def hung_up_in_epoch_2(*args):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGHUP)
        return validation(*args)

    monkeypatch.setattr(probtrans.inference.train, "validation_metric", hung_up_in_epoch_2)
    out = tmp_path / "run"
    argv = ["fit", str(tiny_model_file), "--inference", str(inference), "--out", str(out)]
    previous = signal.getsignal(signal.SIGHUP)
    assert main([*argv, "--quiet"]) == 129
    one_error_line(capsys.readouterr().err, "stopped by SIGHUP; the state after epoch 1 is kept")
    assert signal.getsignal(signal.SIGHUP) is previous  # the caller's handler is back
    assert not lock_path(out).exists() and not out.exists()


def test_a_sigterm_that_arrives_inside_a_finaliser_still_stops_the_command():
    """Python drops an exception raised in ``__del__`` (a progress bar's, in CI): the signal is
    sent again once the finaliser is done, and the block stops all the same."""

    class SignalledWhileCollected:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before __del__ returns
            sum(range(1000))

    with pytest.raises(Stopped) as stop:
        with stop_signals_as_interrupts():
            SignalledWhileCollected()  # collected at once: __del__ runs here
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                time.sleep(0.001)
    assert stop.value.signum == signal.SIGTERM
