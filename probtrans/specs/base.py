"""What every spec shares: strict pydantic models, TOML reading, and one-line errors.

Specs are schema only: types, bounds and cross-field rules, checked by pydantic v2 (unknown keys
refused, numbers finite, no silent type conversion). A failed check becomes one
:class:`~probtrans.errors.ConfigError` line naming the file and the dotted field, e.g.
``models/x.toml: model.attention.tau2 = inf: must be a finite number``. Names that choose an
implementation (a guide, a data source) are checked against their registries one layer up, by
:mod:`probtrans.resolve`.
"""

from __future__ import annotations

import os
import tomllib
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Self, TypeVar

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError
from pydantic_core import PydanticCustomError

from probtrans.errors import ConfigError, ProbtransError

Positive = Annotated[float, Field(gt=0)]
PositiveInt = Annotated[int, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Rate = Annotated[float, Field(ge=0, lt=1)]  # dropout rates
#: seeds of numpy and scikit-learn (and so of a fit) are in 0 … 2**32 − 1
SEED_RANGE = range(2**32)
Seed = Annotated[int, Field(ge=SEED_RANGE.start, lt=SEED_RANGE.stop)]


def check_seed(seed: int, label: str) -> int:
    """``seed`` if it is in :data:`SEED_RANGE`; else an error that names it as ``label``
    (``"--seed -1"`` for the command, ``"seed = -1"`` in Python)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed not in SEED_RANGE:
        raise ProbtransError(f"{label}: must be an integer in 0 … 2**32 − 1")
    return seed


def check_count(value: int | None, label: str) -> int | None:
    """``value`` if it is None (the default) or a positive integer (posterior samples,
    epochs); else an error that names it as ``label`` (``"--samples 0"``, ``"samples = 2.5"``)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ProbtransError(f"{label}: must be a positive integer")
    return value


class Spec(BaseModel):
    """A table of a spec file: unknown keys refused, values neither converted nor infinite."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        allow_inf_nan=False,
        validate_by_name=True,
        validate_by_alias=True,
        use_attribute_docstrings=True,
    )


class SpecFile(Spec):
    """A whole spec file; :attr:`file` is where it was read from (for messages)."""

    _file: str = PrivateAttr(default="<defaults>")

    @property
    def file(self) -> str:
        return self._file

    def to_toml(self) -> str:
        """This spec as the text of a spec file (TOML names; unset options left out), which
        reads back as an equal spec."""
        return tomli_w.dumps(self.model_dump(mode="json", by_alias=True, exclude_none=True))

    def located(self, source: str) -> Self:
        """This spec, recorded as read from ``source`` (a file, or e.g. ``<command line>``)."""
        self._file = source
        return self


S = TypeVar("S", bound=Spec)
F = TypeVar("F", bound=SpecFile)


def rule(field: str, value: Any, message: str) -> PydanticCustomError:
    """A cross-field rule broken by ``field`` (dotted, relative to the validated table): raise
    it from a ``model_validator`` and the message names the field."""
    return PydanticCustomError(
        "spec_rule",
        "{field} = {value}: {message}",
        {"field": field, "value": value, "message": message},
    )


def check_heads(d_model: int, n_heads: int) -> None:
    """Attention heads split the width evenly: ``n_heads`` must divide ``d_model``."""
    if d_model % n_heads:
        raise rule("n_heads", n_heads, f"must divide model.d_model = {d_model}")


def read_toml(path: str | os.PathLike[str]) -> dict:
    """The table of a TOML file; a missing, binary or malformed file raises ConfigError."""
    return parse_toml(read_spec_text(path), str(path))


def read_spec_text(path: str | os.PathLike[str]) -> str:
    """The text of a spec file; a missing or binary file raises ConfigError."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: {'is a folder, not a' if path.is_dir() else 'no such'} file")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not a TOML file (not UTF-8 text: byte {err.start})") from None


def parse_toml(text: str, source: str) -> dict:
    """The table of TOML ``text``; malformed text raises ConfigError starting with ``source``."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{source}: not valid TOML ({err})") from None


def parse(cls: type[S], table: Any, source: str) -> S:
    """``table`` validated as ``cls``; ``source`` (a file, an option) starts the error line."""
    try:
        return cls.model_validate(table)
    except ValidationError as err:
        raise ConfigError(f"{source}: {explain(cls, err)}") from None


def read_spec(cls: type[F], path: str | os.PathLike[str], text: str | None = None) -> F:
    """Read the spec file ``path`` as ``cls``; with ``text``, that text stands for the file's
    content (e.g. the copy a checkpoint keeps) and ``path`` only names it in messages."""
    table = read_toml(path) if text is None else parse_toml(text, str(path))
    return parse(cls, table, str(path)).located(str(path))


def updated(spec: S, changes: dict[str, Any], source: str) -> S:
    """A validated copy of ``spec`` with dotted ``changes`` (e.g. ``{"train.epochs": 3}``);
    errors start with ``source`` (e.g. ``--epochs``). Fields the spec left unset stay unset,
    so that defaults chosen later from context (an attention kind's ``backbone_defaults``) still
    apply to them."""
    table = spec.model_dump(by_alias=True, exclude_unset=True)
    for dotted, value in changes.items():
        *parents, key = dotted.split(".")
        node = table
        for name in parents:
            node = node.setdefault(name, {})
        node[key] = value
    new = parse(type(spec), table, source)
    return new.located(spec.file) if isinstance(spec, SpecFile) else new


# ------------------------------------------------------------------------ error messages
def explain(cls: type[BaseModel], error: ValidationError) -> str:
    """Every problem of ``error`` as ``field = value: what is wrong``, on one line, joined by
    "; " (an unknown key first: a misspelt key also makes the key it stands for "missing")."""
    problems = error.errors(include_url=False)
    problems.sort(key=lambda problem: problem["type"] != "extra_forbidden")
    said: dict[str, list[str]] = {}  # "field = value" → what is wrong (a union's members: each)
    for problem in problems:
        where, _, what = _problem(cls, problem).partition(": ")
        said.setdefault(where, []).append(what)
    return "; ".join(
        ": ".join(filter(None, [where, " or ".join(dict.fromkeys(whats))]))
        for where, whats in said.items()
    )


def _problem(cls: type[BaseModel], problem: Any) -> str:
    """One problem of a ValidationError as ``field = value: what is wrong``."""
    kind, ctx = problem["type"], problem.get("ctx", {})
    path, table = _walk(cls, problem["loc"])
    field = _dotted(path)
    if kind == "spec_rule":
        field = ".".join(filter(None, [field, ctx["field"]]))
        return f"{field} = {ctx['value']!r}: {ctx['message']}"
    if kind == "extra_forbidden":
        known = ", ".join(sorted(info.alias or name for name, info in table.model_fields.items()))
        return f"unknown key {field!r} (known here: {known})"
    if kind == "union_tag_invalid":
        return f"{field}.kind = {ctx['tag']!r}: must be one of {ctx['expected_tags']}"
    if kind == "missing":
        return f"{field}: missing (required)"
    return f"{field or 'top level'} = {problem['input']!r}: {_phrase(problem)}"


_PHRASES = {
    "greater_than": "must be > {gt}",
    "greater_than_equal": "must be >= {ge}",
    "less_than": "must be < {lt}",
    "less_than_equal": "must be <= {le}",
    "finite_number": "must be a finite number",
    "literal_error": "must be {expected}",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "model_type": "must be a table",
    "dict_type": "must be a table",
    "too_short": "must have at least {min_length} item(s)",
    "union_tag_not_found": "must be a table",
}


def _phrase(problem: dict) -> str:
    if problem["type"] in _PHRASES:
        ctx = {key: _number(value) for key, value in problem.get("ctx", {}).items()}
        return _PHRASES[problem["type"]].format(**ctx)
    message = problem["msg"].removeprefix("Value error, ")
    return message[:1].lower() + message[1:]


def _number(value: Any) -> Any:
    """Bounds as written in specs: 0 rather than 0.0."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _walk(cls: type[BaseModel], loc: tuple) -> tuple[list[str | int], type[BaseModel]]:
    """The TOML path of ``loc`` (aliases, without the tags pydantic inserts after a
    discriminated union) and the table class that holds its last key."""
    path: list[str | int] = []
    node: Any = cls
    table = cls
    for part in loc:
        node = _unwrap(node)
        if isinstance(part, int):  # an item of a list
            path.append(part)
            node = typing.get_args(node)[0] if typing.get_args(node) else None
        elif isinstance(node, type) and issubclass(node, BaseModel):
            table = node
            info = node.model_fields.get(part) or next(
                (f for f in node.model_fields.values() if f.alias == part), None
            )
            path.append(info.alias or part if info else part)
            node = None if info is None else info.annotation
        else:  # a union of tables: ``part`` is the tag that chose the member
            node = next((m for m in _union_members(node) if _tag(m) == part), None)
    return path, table


def _unwrap(node: Any) -> Any:
    """``Annotated[X, ...]`` → X; ``X | None`` → X."""
    while True:
        if typing.get_origin(node) is Annotated:
            node = typing.get_args(node)[0]
            continue
        args = [a for a in typing.get_args(node) if a is not type(None)]
        if typing.get_origin(node) in (typing.Union, types.UnionType) and len(args) == 1:
            node = args[0]
            continue
        return node


def _union_members(node: Any) -> list[Any]:
    return [_unwrap(arg) for arg in typing.get_args(_unwrap(node))]


def _tag(member: Any) -> Any:
    kind = getattr(member, "model_fields", {}).get("kind")
    return None if kind is None else kind.default


def _dotted(path: list[str | int]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f"{'.' if text else ''}{part}"
    return text
