"""``benchmarks/speed_commits.py``: each side's case runs with that side's own ``probtrans``, the
sides alternate between rounds, and the printed ratios are the rounds' ratios."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from benchmarks import speed_commits
from benchmarks.speed_commits import ROOT, case_seconds, extract, main

IN_GIT = (ROOT / ".git").exists()


def fake_tree(folder: Path, mark: float, exit_code: int = 0) -> Path:
    """A tree whose ``speed.py --case`` reports the ``MARK`` of the ``probtrans`` it imports."""
    (folder / "probtrans").mkdir(parents=True)
    (folder / "probtrans" / "__init__.py").write_text(f"MARK = {mark}\n")
    (folder / "benchmarks").mkdir()
    (folder / "benchmarks" / "speed.py").write_text(
        "import json, sys\nimport probtrans\n"
        f"if {exit_code}:\n    sys.exit('no such case')\n"
        "print(json.dumps({'seconds': probtrans.MARK, 'peak_mib': 0.0}))\n"
    )
    return folder


def test_a_case_runs_with_its_own_trees_probtrans_before_the_installed_one(tmp_path):
    assert case_seconds(fake_tree(tmp_path / "a", 7.5), "any", 1, "cpu") == 7.5
    assert case_seconds(fake_tree(tmp_path / "b", 2.0), "any", 1, "cpu") == 2.0


def test_a_failing_case_stops_with_the_script_and_its_error(tmp_path):
    tree = fake_tree(tmp_path, 1.0, exit_code=2)
    with pytest.raises(SystemExit) as stop:
        case_seconds(tree, "step_x", 1, "cpu")
    message = str(stop.value.code)
    assert str(tree / "benchmarks" / "speed.py") in message and "--case step_x" in message
    assert "no such case" in message


def test_rounds_alternate_the_sides_and_ratios_are_per_round(monkeypatch, capsys):
    calls = []
    times = {
        ("before", "svi"): [1.0, 2.0, 1.0],
        ("after", "svi"): [0.9, 2.2, 1.1],
        ("before", "plain"): [1.0, 2.0, 1.0],
        ("after", "plain"): [1.0, 2.0, 1.0],
    }

    def fake_seconds(tree: Path, case: str, repeats: int, device: str) -> float:
        side = "after" if tree == ROOT else "before"
        calls.append((side, case))
        return times[side, case][sum(1 for c in calls if c == (side, case)) - 1]

    monkeypatch.setattr(speed_commits, "extract", lambda commit, into: None)
    monkeypatch.setattr(speed_commits, "short_hash", lambda commit: commit)
    monkeypatch.setattr(speed_commits, "case_seconds", fake_seconds)
    main(["abc123", "--cases", "svi", "plain", "--rounds", "3", "--repeats", "1"])
    first_of_pairs = [side for side, _ in calls[::2]]
    assert first_of_pairs == ["before", "before", "after", "after", "before", "before"]
    printed = capsys.readouterr().out
    # after / before of svi per round: 0.90, 1.10, 1.10; of plain: 1.00 every round
    assert re.search(r"svi\s+1\.000 s\s+1\.100 s\s+1\.10× \(0\.90–1\.10\)", printed), printed
    assert re.search(r"plain\s+1\.000 s\s+1\.000 s\s+1\.00× \(1\.00–1\.00\)", printed), printed
    # svi / plain per side: before 1, 1, 1; after 0.9, 1.1, 1.1
    assert re.search(r"before\s+1\.00× \(1\.00–1\.00\)", printed), printed
    assert re.search(r"after\s+1\.10× \(0\.90–1\.10\)", printed), printed


@pytest.mark.skipif(not IN_GIT, reason="needs the project's git history")
def test_extract_writes_the_commits_tree(tmp_path):
    extract("HEAD", tmp_path)
    committed = subprocess.run(
        ["git", "-C", str(ROOT), "show", "HEAD:benchmarks/speed.py"],
        capture_output=True,
        check=True,
    ).stdout
    assert (tmp_path / "benchmarks" / "speed.py").read_bytes() == committed


@pytest.mark.skipif(not IN_GIT, reason="needs the project's git history")
def test_an_unknown_commit_is_refused(tmp_path):
    with pytest.raises(SystemExit) as stop:
        main(["no-such-commit-42", "--cases", "step_plain_digits"])
    assert "git archive no-such-commit-42" in str(stop.value.code)
