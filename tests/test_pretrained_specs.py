"""The pretrained comparison's second task is the first one's code untouched: each model spec
of ``models/cr/`` equals the CoLA spec of the same name outside its ``[data]`` table, and the
two presets name the same methods with the same settings (their seeds aside)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CR_SPECS = sorted((ROOT / "models" / "cr").glob("minilm*.toml"))


def read(path: Path) -> dict:
    return tomllib.loads(path.read_text())


def test_every_pretrained_cola_spec_has_its_cr_twin():
    cola = sorted(p.name for p in (ROOT / "models" / "cola").glob("minilm*.toml"))
    assert [p.name for p in CR_SPECS] == cola


@pytest.mark.parametrize("path", CR_SPECS, ids=lambda p: p.stem)
def test_a_cr_spec_differs_from_its_cola_spec_in_data_only(path):
    cr, cola = read(path), read(ROOT / "models" / "cola" / path.name)
    assert (cr.pop("data")["name"], cola.pop("data")["name"]) == ("cr", "cola")
    assert cr == cola


def test_the_cr_preset_is_the_cola_preset_on_the_cr_specs():
    cr, cola = (read(ROOT / "results" / "presets" / f"minilm_{t}.toml") for t in ("cr", "cola"))
    for method in cola["method"]:
        method["model"] = method["model"].replace("models/cola/", "models/cr/")
    for method in cola["method"] + cr["method"]:
        method.pop("seeds", None)  # how many seeds a row got is CPU time, not a setting
    assert cr["method"] == cola["method"]
    assert {k: v for k, v in cr.items() if k not in ("title", "method")} == {
        k: v for k, v in cola.items() if k not in ("title", "method")
    }
