"""ARCHITECTURE.md kept true: every module and package of probtrans is on its map, no two
modules share a name, and every "where to add" row names a plugin test that exists (and every
plugin test backs a row)."""

from __future__ import annotations

import re
from collections import Counter

from tests.conftest import ROOT

PACKAGE = ROOT / "probtrans"
ARCHITECTURE = (ROOT / "ARCHITECTURE.md").read_text()
WHERE_TO_ADD = ARCHITECTURE[ARCHITECTURE.index("## Where to add") :]


def modules() -> list[str]:
    """Every module of probtrans, as a path below the package (``runs/compare.py``)."""
    return sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py" and "__pycache__" not in path.parts
    )


def test_every_module_and_package_is_on_the_map():
    packages = {path.name for path in PACKAGE.rglob("*") if (path / "__init__.py").is_file()}
    missing = [m for m in modules() if f"`{m.rsplit('/', 1)[-1]}`" not in ARCHITECTURE]
    missing += [f"{p}/" for p in sorted(packages) if f"`{p}/`" not in ARCHITECTURE]
    assert not missing, f"not in ARCHITECTURE.md: {missing}"


def test_no_two_modules_share_a_name():
    """Except that specs/ holds one schema module per thing a spec configures."""
    names = Counter(m.rsplit("/", 1)[-1] for m in modules() if not m.startswith("specs/"))
    assert [name for name, count in names.items() if count > 1] == []


def test_every_where_to_add_row_names_a_plugin_test_that_exists():
    rows = re.findall(r"^- \*\*(.+?)\*\*", WHERE_TO_ADD.split("## Changing the core")[0], re.M)
    named = re.findall(r"Plugin test: `(tests/test_plugin_\w+\.py)`", WHERE_TO_ADD)
    assert len(named) == len(rows) == 10
    assert all((ROOT / test).is_file() for test in named)
    existing = {f"tests/{p.name}" for p in (ROOT / "tests").glob("test_plugin_*.py")}
    assert existing == set(named)
