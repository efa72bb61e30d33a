"""The README's Python blocks run as pasted, in order, from the project's root on a fresh
clone (here: a folder with its ``models/`` and ``inference/``, so that the runs they write stay
out of the checkout). A block whose first line says it needs a network is left out."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.conftest import ROOT

#: the first line of a block that cannot run without the Hugging Face hub
NEEDS_NETWORK = "# needs a network"


def python_blocks() -> list[str]:
    """The ```python blocks of README.md, in order."""
    text = (ROOT / "README.md").read_text()
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_the_readme_has_python_blocks_and_says_which_need_a_network():
    blocks = python_blocks()
    assert len(blocks) >= 6
    offline = [b for b in blocks if not b.startswith(NEEDS_NETWORK)]
    assert len(blocks) == len(offline)  # the pretrained model is all-MiniLM-L6-v2, from PyPI


def test_every_readme_python_block_runs_in_order(tmp_path):
    for name in ("models", "inference"):
        (tmp_path / name).symlink_to(ROOT / name)
    script = "\n\n".join(b for b in python_blocks() if not b.startswith(NEEDS_NETWORK))
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env={**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "held-out accuracy" in done.stdout and "held-out ELPD" in done.stdout
    assert (tmp_path / "runs" / "api" / "metrics.json").is_file()
