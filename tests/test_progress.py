"""Progress bars: redrawn in place on a terminal, plain lines at an interval elsewhere, so a
log of a run (a scheduler's output, a file) reads line by line."""

from __future__ import annotations

import io

from probtrans.cli import main
from probtrans.runtime.progress import LOG_INTERVAL, progress_bar
from tests.conftest import tiny_inference


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_a_bar_writes_plain_lines_at_its_start_and_end():
    log = io.StringIO()
    assert sum(progress_bar(range(5000), desc="work", file=log)) == sum(range(5000))
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and "\x1b" not in log.getvalue()
    assert LOG_INTERVAL >= 10 and len(lines) == 2  # a fast loop: start and end alone
    assert lines[0].startswith("work:   0%") and "5000/5000" in lines[-1]
    erased = io.StringIO()
    list(progress_bar(range(10), desc="gone", file=erased, leave=False))
    assert "\r" not in erased.getvalue() and len(erased.getvalue().splitlines()) <= 2


def test_on_a_terminal_the_bar_redraws_itself():
    terminal = Terminal()
    list(progress_bar(range(10), desc="work", file=terminal))
    assert "\r" in terminal.getvalue()


def test_a_fit_logged_to_a_file_has_no_redraw_codes_and_few_lines(
    tmp_path, tiny_model_file, capsys
):
    inference = tiny_inference(tmp_path, "map")
    assert (
        main(
            [
                "fit",
                str(tiny_model_file),
                "--inference",
                str(inference),
                "--out",
                str(tmp_path / "run"),
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "\r" not in err and "\x1b" not in err
    assert "SVI" in err and len(err.splitlines()) < 30
