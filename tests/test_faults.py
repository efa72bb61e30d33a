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
import tempfile
import time
import weakref
from pathlib import Path

import numpy as np
import pytest

import probtrans.inference.train
import probtrans.storage.io
from probtrans.cli import Stopped, main, stop_signals_as_interrupts
from probtrans.runs import fit
from probtrans.storage.lock import lock_path
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
    """``probtrans.storage.io.atomic_write`` whose ``fail_at``-th call (from 1) writes its file
    whole, then fails as a full disk does; counts the calls."""

    def __init__(self, fail_at: int = 0) -> None:
        self.fail_at = fail_at
        self.calls: list[str] = []
        self.real = probtrans.storage.io.atomic_write

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
    monkeypatch.setattr(probtrans.storage.io, "atomic_write", counting)
    assert main([*argv[:-1], str(tmp_path / "counted"), "--epochs", "1", "--quiet"]) == 0
    writes = counting.calls
    assert {"checkpoint.pt", "probs.npz", "predictive.nc", "metrics.json"} <= set(writes)
    capsys.readouterr()
    for fail_at in range(1, len(writes) + 1):
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(out.with_name("run.partial"), ignore_errors=True)
        shutil.copytree(old_run, out)
        before = snapshot(out)
        monkeypatch.setattr(probtrans.storage.io, "atomic_write", DiskFull(fail_at))
        assert main([*argv, "--epochs", "1", "--quiet"]) == 2, writes[fail_at - 1]
        name = writes[fail_at - 1]
        one_error_line(capsys.readouterr().err, f"cannot write {name}: no space left on device")
        assert snapshot(out) == before, name
        assert not lock_path(out).exists() and not list(tmp_path.glob(".run.*"))
    monkeypatch.setattr(probtrans.storage.io, "atomic_write", DiskFull())
    assert main([*argv, "--epochs", "1", "--quiet"]) == 0
    assert consistent(out) == 6


def test_a_full_disk_at_any_write_of_evaluate_keeps_the_old_run(
    tmp_path, old_run, monkeypatch, capsys
):
    counting = DiskFull()
    monkeypatch.setattr(probtrans.storage.io, "atomic_write", counting)
    scratch = Path(shutil.copytree(old_run, tmp_path / "scratch"))
    assert main(["evaluate", str(scratch), "--samples", "6", "--quiet"]) == 0
    writes = counting.calls
    assert {"probs.npz", "predictive.nc", "report.png", "metrics.json"} <= set(writes)
    capsys.readouterr()
    before = snapshot(old_run)
    for fail_at in range(1, len(writes) + 1):
        monkeypatch.setattr(probtrans.storage.io, "atomic_write", DiskFull(fail_at))
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
    monkeypatch.setattr(probtrans.storage.io, "atomic_write", DiskFull())
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


def test_a_sigterm_inside_a_weak_reference_callback_still_stops_the_command():
    """A signal that lands in a weak-reference callback (``weakref.finalize``, a
    ``WeakValueDictionary`` entry removed), where Python also drops exceptions, is sent again
    and stops the block."""

    class Collected:
        pass

    with pytest.raises(Stopped) as stop:
        with stop_signals_as_interrupts():
            collected = Collected()
            weakref.finalize(collected, os.kill, os.getpid(), signal.SIGTERM)
            del collected  # the callback runs here, and the signal arrives inside it
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                time.sleep(0.001)
    assert stop.value.signum == signal.SIGTERM


def test_a_stop_signal_after_the_run_is_written_exits_0_and_says_so(
    tmp_path, tiny_model_file, monkeypatch, capsys
):
    """SIGTERM the moment ``fit`` has written its run (while it prints the metrics): the run is
    complete, so the exit is 0 with a note, not a false failure."""
    import probtrans.cli

    printed = probtrans.cli.print_metrics

    def terminated_while_printing(metrics):
        os.kill(os.getpid(), signal.SIGTERM)
        printed(metrics)

    monkeypatch.setattr(probtrans.cli, "print_metrics", terminated_while_printing)
    out = tmp_path / "run"
    inference = tiny_inference(tmp_path, "map")
    argv = ["fit", str(tiny_model_file), "--inference", str(inference), "--out", str(out)]
    assert main([*argv, "--quiet"]) == 0
    err = capsys.readouterr().err
    assert f"note: probtrans fit: stopped by SIGTERM after the run was written to {out}/" in err
    assert consistent(out) == 4 and not lock_path(out).exists()


# ------------------------------------------------------------------------- compare's output folder
#: what compare publishes as one set
COMPARE_OUTPUTS = ("comparison.json", "table.md", "table.csv", "figure.png")


def compare_argv(model: Path, inferences: list[Path], out: Path) -> list[str]:
    argv = ["compare", str(model), "--inference", *map(str, inferences), "--out", str(out)]
    return [*argv, "--quiet"]


def compare_outputs(out: Path) -> dict[str, bytes | None]:
    return {
        name: (out / name).read_bytes() if (out / name).exists() else None
        for name in COMPARE_OUTPUTS
    }


def test_a_second_compare_into_one_folder_is_refused_while_the_first_runs(
    tmp_path, tiny_model_file, capsys
):
    """Two ``compare`` into one ``--out`` at once: the second says which process holds the
    folder, exits 2 and writes nothing; the first ends with its whole table."""
    out = tmp_path / "compared"
    inference = tiny_inference(tmp_path, "map")  # training long enough for the second to come
    inference.write_text(inference.read_text().replace("epochs = 2", "epochs = 12"))
    argv = [sys.executable, "-m", "probtrans", *compare_argv(tiny_model_file, [inference], out)]
    first = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while not lock_path(out).exists() and first.poll() is None:
        assert time.monotonic() < deadline, "the first compare took no lock in 120 s"
        time.sleep(0.02)
    second = tiny_inference(tmp_path, "mfvi")
    assert main(compare_argv(tiny_model_file, [second], out)) == 2
    line = one_error_line(capsys.readouterr().err, f"{out}: in use by pid {first.pid}")
    assert "probtrans compare" in line
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert all(compare_outputs(out).values())
    assert "map" in (out / "table.md").read_text() and "mfvi" not in (out / "table.md").read_text()
    assert sorted(p.name for p in (out / "runs").iterdir()) == [
        next((out / "runs").iterdir()).name
    ]  # the second trained nothing


@pytest.mark.parametrize("earlier", ["a table", "none"])
def test_a_signal_at_any_write_of_compares_outputs_leaves_the_old_set_or_the_new(
    tmp_path, tiny_model_file, monkeypatch, capsys, earlier
):
    """SIGHUP at each step of publishing compare's outputs (each of the four files staged,
    each moved into place): the folder then holds the earlier table, CSV, figure and
    comparison.json (or, into a folder without them, none), or all four new ones, never a
    mix; exit 129 either way."""
    import probtrans.runs.compare

    out = tmp_path / "compared"
    one, two = tiny_inference(tmp_path, "map"), tiny_inference(tmp_path, "mfvi")
    assert main(compare_argv(tiny_model_file, [one, two], out)) == 0  # trains both runs
    new = compare_outputs(out)
    assert main(compare_argv(tiny_model_file, [one], out)) == 0
    old = compare_outputs(out)
    if earlier == "none":
        old = dict.fromkeys(COMPARE_OUTPUTS)
    assert old != new
    publish = probtrans.runs.compare.write_together
    calls = {"mkstemp": 0, "replace": 0}
    seen = []
    for moment in [("mkstemp", k) for k in range(4)] + [("replace", k) for k in range(4)]:
        for name, content in old.items():  # the folder as it was
            (out / name).unlink(missing_ok=True)
            if content is not None:
                (out / name).write_bytes(content)

        def counted(name, function, moment=moment):
            def call(*args, **kwargs):
                if (name, calls[name]) == moment:
                    os.kill(os.getpid(), signal.SIGHUP)
                calls[name] += 1
                return function(*args, **kwargs)

            return call

        def signalled(writes):
            calls.update(mkstemp=0, replace=0)
            with monkeypatch.context() as patched:
                patched.setattr(tempfile, "mkstemp", counted("mkstemp", tempfile.mkstemp))
                patched.setattr(os, "replace", counted("replace", os.replace))
                return publish(writes)

        monkeypatch.setattr(probtrans.runs.compare, "write_together", signalled)
        assert main(compare_argv(tiny_model_file, [one, two], out)) == 129, moment
        after = compare_outputs(out)
        assert after in (old, new), moment
        seen.append("old" if after == old else "new")
        assert not [p.name for p in out.iterdir() if p.name.endswith(".partial")]
    assert seen == ["old"] * 4 + ["new"] * 4
    capsys.readouterr()
