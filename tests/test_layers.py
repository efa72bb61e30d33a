"""The package's layers (ARCHITECTURE.md): no import cycle, no upward import, and specs that load
without torch.

The floors are the import-linter contract in ``pyproject.toml``; imports inside functions count
(grimp reads every import statement of a module).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import grimp
import pytest

from tests.conftest import ROOT

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")  # import-linter's command


def import_cycles(package: str) -> list[list[str]]:
    """Every direct import a → b of ``package`` for which b also reaches a, as the cycle
    [a, b, …, a]."""
    graph = grimp.build_graph(package, cache_dir=None)
    cycles = []
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back:
                cycles.append([importer, *back])
    return cycles


def lint_imports(config: Path, where: Path) -> subprocess.CompletedProcess:
    """import-linter on the contracts of ``config``, run from the folder ``where``."""
    command = [str(LINT_IMPORTS), "--config", str(config), "--no-cache"]
    return subprocess.run(command, cwd=where, capture_output=True, text=True)


def write_package(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_no_import_cycle_in_probtrans():
    cycles = import_cycles("probtrans")
    assert not cycles, "import cycles:\n" + "\n".join(" → ".join(c) for c in cycles)


def test_no_upward_import_between_floors():
    result = lint_imports(ROOT / "pyproject.toml", ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_checks_catch_a_lazy_cycle_and_an_upward_import(tmp_path, monkeypatch):
    """The two checks above on a package that breaks both rules, one import inside a function."""
    write_package(
        tmp_path,
        {
            "toy/__init__.py": "",
            "toy/low.py": "def f():\n    from toy import high\n",
            "toy/high.py": "import toy.low\n",
            "pyproject.toml": """
                [tool.importlinter]
                root_package = "toy"
                [[tool.importlinter.contracts]]
                name = "floors"
                type = "layers"
                containers = ["toy"]
                layers = ["high", "low"]
            """,
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cycles = import_cycles("toy")
    assert cycles == [["toy.high", "toy.low", "toy.high"], ["toy.low", "toy.high", "toy.low"]]
    result = lint_imports(tmp_path / "pyproject.toml", tmp_path)
    assert result.returncode != 0 and "toy.low -> toy.high" in result.stdout


@pytest.mark.parametrize(
    "statement",
    [
        "import probtrans.specs",
        "from probtrans.specs import read_model_spec, read_inference_spec;"
        f" read_model_spec({str(ROOT / 'models/digits/sgpa.toml')!r});"
        f" read_inference_spec({str(ROOT / 'inference/sgpa.toml')!r})",
    ],
)
def test_specs_load_without_torch_pyro_or_gpytorch(statement):
    heavy = ("torch", "pyro", "gpytorch")
    script = f"import sys; {statement}; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
