"""Rows of a user's data source — a local file, a saved folder or a Hugging Face hub dataset —
read through Hugging Face ``datasets``.

A source is written as a file path or as ``hf:ID[:CONFIG][@SPLIT]`` (:func:`parse_source`):

* text tables (:data:`TABLE_FORMATS`): ``.csv`` (comma-separated, quoted as usual), ``.tsv``
  (split on tabs only, no quoting: a quote is an ordinary character), ``.jsonl`` and
  ``.jsonl.gz`` (one JSON object per line), ``.parquet``; and ``.txt``, one text per line
  without labels;
* images (:data:`IMAGE_FORMATS`): an ``.npz`` file with the array ``x``, (N, H, W) or
  (N, C, H, W), and the labels ``y`` (N,);
* ``hf:ID``: a dataset of the Hugging Face hub, or — when ID is a local folder — a folder written
  by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``.

:func:`read_texts` and :func:`read_images` return :class:`Rows`: the texts or images, their raw
labels (integers or strings, as the source holds them; the labels of a CSV or TSV column are
integers when every one is written as an integer), the class names of a ``ClassLabel`` feature,
and ``where``, which names a row in messages (``FILE:LINE`` for text files, the line the row
starts on). Every row is checked; a problem raises :class:`~probtrans.errors.ProbtransError` in
one line listing the first :data:`MAX_REPORTED` malformed rows as ``WHERE: problem``. A text file
that ``datasets`` cannot parse (a bad JSON line, a CSV row with extra fields, bytes that are not
UTF-8, a truncated gzip file) is read again line by line to name the first bad lines.
:func:`read_inputs` reads the inputs of ``probtrans predict``.

Local files are read into memory through a temporary ``datasets`` cache folder that is removed
afterwards; ``datasets``' progress bars and log messages are silenced while a local source is read
and restored afterwards. Hub datasets are downloaded into the ``datasets`` cache
(``HF_DATASETS_CACHE``), as ``datasets.load_dataset`` does, so they are fetched once.
"""

from __future__ import annotations

import csv
import gzip
import json
import logging
import math
import re
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
from datasets.utils import logging as datasets_logging

from probtrans.errors import ProbtransError
from probtrans.io import read_npz

#: the text tables :func:`read_texts` reads
TABLE_FORMATS = (".csv", ".tsv", ".jsonl", ".jsonl.gz", ".parquet")
#: the image files :func:`read_images` reads
IMAGE_FORMATS = (".npz",)
#: how a source names a Hugging Face dataset (or a folder written by ``save_to_disk``)
HF_PREFIX = "hf:"
IMAGE_ARRAY = "x"  # the images of an .npz file
LABEL_ARRAY = "y"  # the labels of an .npz file
STDIN = "-"  # read_inputs: texts from standard input
TEXT_LINES = ".txt"  # one text per line, without labels (predict inputs, out-of-domain sets)
MAX_REPORTED = 5  # malformed rows listed in one error message
_CSV_FORMATS = (".csv", ".tsv")
_INTEGER = re.compile(r"\s*[+-]?\d+\s*")


# ----------------------------------------------------------------------------- sources
@dataclass(frozen=True)
class Source:
    """A data source as written in a spec or on the command line, resolved."""

    text: str  # as written
    path: Path | None  # a local file, or a local folder written by datasets' save_to_disk
    hub_id: str | None  # a Hugging Face hub dataset id (None for local sources)
    config: str | None
    split: str | None  # from the text, else None (the caller's default applies)

    def __str__(self) -> str:
        """How messages name the source: the path (with ``@SPLIT`` for a saved folder whose
        split is written), or ``hf:ID[:CONFIG][@SPLIT]``."""
        at = f"@{self.split}" if self.split else ""
        if self.hub_id is None:
            return f"{self.path}{at}"
        config = f":{self.config}" if self.config else ""
        return f"{HF_PREFIX}{self.hub_id}{config}{at}"


def _is_folder(source: Source) -> bool:
    """Whether ``source`` is a folder written by ``save_to_disk`` (written as ``hf:FOLDER``)."""
    return source.hub_id is None and source.text.strip().startswith(HF_PREFIX)


def _resolved(text: str, base: Path | None) -> Path:
    path = Path(text)
    return Path(base) / path if base is not None and not path.is_absolute() else path


def parse_source(text: str, base: Path | None = None) -> Source:
    """The source written as ``text``: ``hf:ID[:CONFIG][@SPLIT]`` (e.g.
    ``hf:nyu-mll/glue:cola@validation``), or a file path.

    Relative paths — and an ID naming a folder — are resolved against ``base`` (the spec file's
    folder) when given, else against the working directory; absolute paths are kept. An ID that
    is an existing local folder is a folder written by ``save_to_disk`` (``path`` set, no
    ``hub_id``); any other ID is a hub dataset. Raises ProbtransError for an empty text, an empty
    ID or split, or a configuration given for a local folder.
    """
    written = text.strip()
    if not written:
        raise ProbtransError(
            f"data source {text!r}: empty; give a file path or {HF_PREFIX}ID[:CONFIG][@SPLIT]"
        )
    if not written.startswith(HF_PREFIX):
        return Source(text, _resolved(written, base), None, None, None)
    body, split = written[len(HF_PREFIX) :], None
    if "@" in body:
        body, split = body.rsplit("@", 1)
        if not split.strip():
            raise ProbtransError(f"{written}: no split after '@' (write {HF_PREFIX}ID@SPLIT)")
    name, _, config = body.partition(":")
    if not name.strip():
        raise ProbtransError(f"{written}: no dataset id after {HF_PREFIX!r}")
    folder = _resolved(name, base)
    if folder.is_dir():
        if config:
            raise ProbtransError(
                f"{written}: configuration {config!r} given for the local folder {folder}; "
                f"configurations are for hub datasets"
            )
        return Source(text, folder, None, None, split)
    return Source(text, None, name, config or None, split)


# ----------------------------------------------------------------------------- rows
@dataclass
class Rows:
    """The rows read from one source."""

    values: list[str] | np.ndarray  # texts, or images (N, C, H, W) in the source's dtype
    labels: list[int | str] | None  # raw label values, None when the source has no label column
    label_names: list[str] | None  # class names a datasets ClassLabel feature gives, else None
    where: Callable[[int], str]  # row number (0-based) → "FILE:LINE", "FILE: row K", ...

    def __len__(self) -> int:
        return len(self.values)


def _row_index(name: str) -> Callable[[int], str]:
    """``where`` for a source without lines: row K (0-based, as the source indexes it)."""
    return lambda row: f"{name}: row {row}"


def _raise_problems(problems: list[tuple[int, str]], where: Callable[[int], str]) -> None:
    """One error line listing the first malformed rows (``WHERE: problem``), if any."""
    if problems:
        shown = "; ".join(f"{where(row)}: {problem}" for row, problem in problems[:MAX_REPORTED])
        more = len(problems) - MAX_REPORTED
        raise ProbtransError(shown + (f" (and {more} more malformed rows)" if more > 0 else ""))


def _text_problem(value: object, column: str) -> str | None:
    """Why ``value`` is not a text, or None if it is one."""
    if value is None:
        return f"{column!r} is missing"
    if not isinstance(value, str):
        return f"{column!r} is a {type(value).__name__}, not a string"
    if not value.strip():
        return f"{column!r} is empty"
    return None


def _checked_label(value: object, column: str) -> tuple[int | str | None, str | None]:
    """(the label, None), or (None, why ``value`` is not a label): labels are integers or
    strings; an integral float becomes an integer; None, "" and NaN are missing."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None, f"{column!r} is missing"
    if isinstance(value, bool | np.bool_):
        return None, f"{column!r} is {value!r}, a bool, not an integer or a string"
    if isinstance(value, int | np.integer):
        return int(value), None
    if isinstance(value, float | np.floating):
        if math.isnan(value):
            return None, f"{column!r} is missing"
        if float(value).is_integer():
            return int(value), None
        return None, f"{column!r} is {float(value)!r}, not an integer or a string"
    if isinstance(value, str):
        return value, None
    return None, f"{column!r} is a {type(value).__name__}, not an integer or a string"


def _checked_labels(values: list, column: str) -> tuple[list[int | str], list[tuple[int, str]]]:
    """The labels of ``values`` and the problems of the rows that hold none."""
    labels: list[int | str] = []
    problems: list[tuple[int, str]] = []
    for row, value in enumerate(values):
        label, problem = _checked_label(value, column)
        if problem:
            problems.append((row, problem))
        labels.append(label)  # None only in a row with a problem
    return labels, problems


def _integer_strings(values: list) -> list:
    """The labels of a CSV or TSV column: integers when every label written is an integer."""
    written = [v for v in values if isinstance(v, str) and v.strip()]
    if written and all(_INTEGER.fullmatch(v) for v in written):
        return [int(v) if isinstance(v, str) and v.strip() else v for v in values]
    return values


def _label_column(
    name: str, columns: list[str], label_column: str | None, labels: bool | None
) -> str | None:
    """The label column to read: None when labels are not read, or ``labels`` is None and the
    column is absent; a column required (``labels`` true) but absent raises ProbtransError."""
    if labels is False or not label_column:
        return None
    if label_column in columns:
        return label_column
    if labels is None:
        return None
    raise ProbtransError(f"{name}: no label column {label_column!r} (columns: {_listed(columns)})")


def _require_column(name: str, columns: list[str], column: str, what: str) -> None:
    if column not in columns:
        raise ProbtransError(f"{name}: no {what} column {column!r} (columns: {_listed(columns)})")


def _listed(names: Iterable[str]) -> str:
    return ", ".join(map(repr, names)) or "none"


def _class_names(dataset: datasets.Dataset, column: str | None) -> list[str] | None:
    """The class names of ``column`` if it is a ClassLabel feature."""
    feature = dataset.features.get(column) if column else None
    return list(feature.names) if isinstance(feature, datasets.ClassLabel) else None


def _reason(err: BaseException) -> str:
    """``Type: first line`` of ``err`` (of its cause when datasets wrapped it)."""
    cause = err.__cause__ or err
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0]}" if lines else type(cause).__name__


# ----------------------------------------------------------------------------- local files
def _suffix(path: Path) -> str:
    return ".jsonl.gz" if path.name.lower().endswith(".jsonl.gz") else path.suffix.lower()


def _checked_file(path: Path, formats: tuple[str, ...], what: str) -> str:
    """The suffix of ``path``, an existing file of one of ``formats``."""
    if path.is_dir():
        raise ProbtransError(
            f"{path}: a folder; a folder written by save_to_disk is read as {HF_PREFIX}{path}"
        )
    if not path.is_file():
        raise ProbtransError(f"{path}: no such file")
    suffix = _suffix(path)
    if suffix not in formats:
        raise ProbtransError(
            f"{path}: unknown extension {suffix or '(none)'!r}; {what} are read from "
            f"{', '.join(formats)} files or a Hugging Face dataset ({HF_PREFIX}ID)"
        )
    return suffix


@contextmanager
def _quiet_datasets() -> Iterator[None]:
    """Silence ``datasets``' progress bars and log messages inside the block (a failed read is
    reported by probtrans), then restore both settings."""
    bars_disabled = datasets.are_progress_bars_disabled()
    verbosity = datasets_logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets_logging.set_verbosity(logging.CRITICAL)
    try:
        yield
    finally:
        datasets_logging.set_verbosity(verbosity)
        if not bars_disabled:
            datasets.enable_progress_bars()


@contextmanager
def _long_csv_fields() -> Iterator[None]:
    """Let the csv module read fields of any length (as pandas does) inside the block."""
    limit = csv.field_size_limit()
    csv.field_size_limit(2**31 - 1)
    try:
        yield
    finally:
        csv.field_size_limit(limit)


def _csv_dialect(suffix: str) -> dict[str, Any]:
    """csv module options of a ``.csv`` (quoted as usual) or ``.tsv`` file (tabs, no quoting)."""
    return {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if suffix == ".tsv" else {}


def _blank(fields: list[str]) -> bool:
    """Whether a CSV/TSV record is a blank line or a line of spaces (pandas skips both)."""
    return not fields or (len(fields) == 1 and not fields[0].strip())


def _csv_records(lines: Iterable[str], suffix: str) -> Iterator[tuple[int, list[str]]]:
    """(the line it starts on, its fields) of each record of a CSV/TSV file, skipping the
    records that pandas skips (:func:`_blank`)."""
    reader = csv.reader(lines, **_csv_dialect(suffix))
    start = 1
    for fields in reader:
        if not _blank(fields):
            yield start, fields
        start = reader.line_num + 1


def _csv_header(path: Path, suffix: str) -> list[str] | None:
    """The column names of a CSV/TSV file (its first record), None for an empty file."""
    with _long_csv_fields(), open(path, newline="", encoding="utf-8-sig") as fh:
        return next((fields for _, fields in _csv_records(fh, suffix)), None)


def _load_file(path: Path, suffix: str, columns: list[str] | None) -> datasets.Dataset:
    """The rows of a text table through ``datasets``, in memory. For CSV/TSV only ``columns``
    are read, as strings as written (no type guessing; an empty or absent field is "")."""
    builder = {".csv": "csv", ".tsv": "csv", ".parquet": "parquet"}.get(suffix, "json")
    options: dict[str, Any] = {}
    if suffix in _CSV_FORMATS:
        features = {column: datasets.Value("string") for column in columns or []}
        options = {
            "features": datasets.Features(features),
            "na_filter": False,  # "NA", "null"... are texts; an empty field is ""
            **_csv_dialect(suffix),
        }
    with tempfile.TemporaryDirectory(prefix="probtrans-datasets-") as cache, _quiet_datasets():
        return datasets.load_dataset(
            builder,
            data_files=str(path.resolve()),
            split="train",
            cache_dir=cache,
            keep_in_memory=True,
            **options,
        )


def _raw_lines(path: Path) -> tuple[list[bytes], str | None]:
    """The lines of ``path`` (gunzipped for ``.gz``) and why reading stopped early, if it did."""
    lines: list[bytes] = []
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    try:
        with opener(path, "rb") as fh:
            lines.extend(fh)
    except gzip.BadGzipFile:
        return lines, "not a gzip file"
    except EOFError:
        return lines, "truncated (the gzip stream ends early)"
    except zlib.error as err:
        return lines, f"corrupt gzip data ({err})"
    except OSError as err:
        raise ProbtransError(f"{path}: cannot be read ({err.strerror or err})") from None
    return lines, None


def _row_problems(
    row: dict[str, Any], text_column: str, label_column: str | None, required: bool
) -> list[str]:
    """The problems of one row of a file read by hand: its text, and its label when
    ``label_column`` is read and ``required`` or the row has it."""
    problems = [_text_problem(row.get(text_column), text_column)]
    if label_column and (required or label_column in row):
        problems.append(_checked_label(row.get(label_column), label_column)[1])
    return [problem for problem in problems if problem]


def _file_problems(
    path: Path, suffix: str, text_column: str, label_column: str | None, required: bool
) -> tuple[list[str], int]:
    """The problems of a CSV, TSV or JSON Lines file read line by line — bytes that are not
    UTF-8, a truncated gzip stream, bad records, bad rows — as ``FILE:LINE: problem`` in line
    order, and the number of rows found: what ``datasets`` could not read."""
    raw, stopped = _raw_lines(path)
    problems: list[tuple[int, str]] = []
    lines: list[str] = []
    for number, line in enumerate(raw, start=1):
        try:
            lines.append(line.decode("utf-8"))
        except UnicodeDecodeError as err:
            problems.append((number, f"not valid UTF-8 ({err.reason} at byte {err.start})"))
            lines.append(line.decode("utf-8", "replace"))
    if lines:
        lines[0] = lines[0].removeprefix("\ufeff")
    rows = 0
    if suffix in _CSV_FORMATS:
        header: list[str] | None = None
        reader = csv.reader(lines, strict=True, **_csv_dialect(suffix))
        start = 1
        with _long_csv_fields():
            try:
                for fields in reader:
                    if _blank(fields):
                        pass
                    elif header is None:
                        header = fields
                    elif len(fields) > len(header):
                        rows += 1
                        problems.append(
                            (start, f"{len(fields)} fields where the header has {len(header)}")
                        )
                    else:
                        rows += 1
                        row = dict.fromkeys(header, "")  # a short row: empty fields, as pandas
                        row.update(zip(header, fields, strict=False))
                        found = _row_problems(row, text_column, label_column, required)
                        problems.extend((start, problem) for problem in found)
                    start = reader.line_num + 1
            except csv.Error as err:
                problems.append((start, f"not a valid {suffix[1:].upper()} row ({err})"))
    else:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            rows += 1
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                problems.append((number, f"not a JSON object ({err.msg})"))
                continue
            if not isinstance(row, dict):
                problems.append((number, f"not a JSON object (a {type(row).__name__})"))
                continue
            found = _row_problems(row, text_column, label_column, required)
            problems.extend((number, problem) for problem in found)
    if stopped:
        problems.append((len(raw) + 1, stopped))
    problems.sort(key=lambda problem: problem[0])
    return [f"{path}:{number}: {problem}" for number, problem in problems], rows


def _unreadable(
    path: Path,
    suffix: str,
    err: BaseException,
    text_column: str,
    label_column: str | None,
    required: bool,
) -> ProbtransError:
    """The error for a text file ``datasets`` failed on: its first bad lines, else "no rows",
    else the ``datasets`` error."""
    if suffix == ".parquet":
        return ProbtransError(f"{path}: not a readable Parquet file ({_reason(err)})")
    problems, rows = _file_problems(path, suffix, text_column, label_column, required)
    if problems:
        more = len(problems) - MAX_REPORTED
        tail = f" (and {more} more malformed rows)" if more > 0 else ""
        return ProbtransError("; ".join(problems[:MAX_REPORTED]) + tail)
    if rows == 0:
        return ProbtransError(f"{path}: no rows")
    return ProbtransError(f"{path}: cannot be read ({_reason(err)})")


class _FileLines:
    """``where`` for a text file: row → ``FILE:LINE``, the line the row starts on. The lines
    are found by reading the file again on first use, i.e. only when a row is reported; if
    they do not match the rows ``datasets`` read, rows are named ``FILE: row K``."""

    def __init__(self, path: Path, suffix: str, n_rows: int) -> None:
        self.path, self.suffix, self.n_rows = path, suffix, n_rows
        self._starts: list[int] | None = None

    def __call__(self, row: int) -> str:
        if self._starts is None:
            starts = self._row_starts()
            self._starts = starts if len(starts) == self.n_rows else []
        if 0 <= row < len(self._starts):
            return f"{self.path}:{self._starts[row]}"
        return f"{self.path}: row {row}"

    def _row_starts(self) -> list[int]:
        raw, _ = _raw_lines(self.path)
        lines = [line.decode("utf-8", "replace") for line in raw]
        if self.suffix not in _CSV_FORMATS:
            return [number for number, line in enumerate(lines, start=1) if line.strip()]
        if lines:
            lines[0] = lines[0].removeprefix("\ufeff")
        with _long_csv_fields():
            try:
                return [start for start, _ in _csv_records(lines, self.suffix)][1:]
            except csv.Error:
                return []


def _read_table(
    path: Path, suffix: str, text_column: str, label_column: str | None, labels: bool | None
) -> tuple[dict[str, list], str | None, list[str] | None]:
    """The columns read from a text table (texts, and labels when read), the label column read
    (see :func:`_label_column`) and its class names."""
    columns: list[str] | None = None
    label: str | None = None
    try:
        if suffix in _CSV_FORMATS:
            header = _csv_header(path, suffix)
            if header is None:
                raise ProbtransError(f"{path}: empty file (no header naming the columns)")
            _require_column(str(path), header, text_column, "text")
            label = _label_column(str(path), header, label_column, labels)
            columns = [text_column] + ([label] if label else [])
        dataset = _load_file(path, suffix, columns)
        if columns is None:
            _require_column(str(path), dataset.column_names, text_column, "text")
            label = _label_column(str(path), dataset.column_names, label_column, labels)
        if len(dataset) == 0:
            raise ProbtransError(f"{path}: no rows")
        data = dataset.select_columns([text_column] + ([label] if label else []))[:]
    except ProbtransError:
        raise
    except Exception as err:  # a file datasets cannot parse (or decode): find the bad lines
        read_label = label_column if labels is not False else None
        raise _unreadable(path, suffix, err, text_column, read_label, labels is True) from None
    return data, label, _class_names(dataset, label)


# ----------------------------------------------------------------------------- Hugging Face
def _hf_dataset(source: Source, split: str) -> tuple[datasets.Dataset, str]:
    """The split of a saved folder or hub dataset, and how messages name it."""
    split = source.split or split
    if source.path is not None:
        try:
            with _quiet_datasets():
                loaded = datasets.load_from_disk(str(source.path))
        except Exception as err:
            raise ProbtransError(
                f"{source.path}: not a folder written by save_to_disk ({_reason(err)})"
            ) from None
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise ProbtransError(
                    f"{source.path}: no split {split!r} (splits: {_listed(loaded)})"
                )
            return loaded[split], f"{source.path}@{split}"
        if source.split is not None:
            raise ProbtransError(
                f"{source}: the folder holds one Dataset, not splits; drop '@{source.split}'"
            )
        return loaded, str(source.path)
    name = str(Source(source.text, None, source.hub_id, source.config, split))
    try:
        dataset = datasets.load_dataset(source.hub_id, source.config, split=split)
    except Exception as err:  # offline, unknown id, unknown split...
        raise ProbtransError(
            f"{name}: the Hugging Face dataset cannot be loaded ({_reason(err)}); give a local "
            f"file or a folder written by save_to_disk instead"
        ) from None
    return dataset, name


# ----------------------------------------------------------------------------- texts
def read_texts(
    source: Source,
    *,
    text_column: str = "text",
    label_column: str | None = "label",
    split: str = "train",
    labels: bool | None = True,
) -> Rows:
    """The texts of ``source`` (a text table, a saved folder or a hub dataset) and their labels.

    ``split`` is the split read from a folder or hub dataset when ``source`` names none.
    ``labels``: True, the ``label_column`` is required; None, read when present; False (or no
    ``label_column``), not read. Raises ProbtransError naming the source for a missing file,
    an unknown extension, a missing column, a file without rows, a file that cannot be parsed
    (``FILE:LINE: problem``) and rows with a missing, non-string or empty text or a missing or
    invalid label (the first :data:`MAX_REPORTED` rows, ``WHERE: problem``).
    """
    where: Callable[[int], str]
    if source.path is not None and not _is_folder(source):
        path = source.path
        if _suffix(path) == TEXT_LINES and labels is not True:  # one text per line, no labels
            return _read_lines(path)
        suffix = _checked_file(path, TABLE_FORMATS, "texts")
        data, label, names = _read_table(path, suffix, text_column, label_column, labels)
        n_rows = len(data[text_column])
        where = _row_index(str(path)) if suffix == ".parquet" else _FileLines(path, suffix, n_rows)
        if label and suffix in _CSV_FORMATS:
            data[label] = _integer_strings(data[label])
    else:
        dataset, name = _hf_dataset(source, split)
        _require_column(name, dataset.column_names, text_column, "text")
        label = _label_column(name, dataset.column_names, label_column, labels)
        if len(dataset) == 0:
            raise ProbtransError(f"{name}: no rows")
        data = dataset.select_columns([text_column] + ([label] if label else []))[:]
        where, names = _row_index(name), _class_names(dataset, label)
    texts = data[text_column]
    problems = [
        (row, problem)
        for row, text in enumerate(texts)
        if (problem := _text_problem(text, text_column))
    ]
    values = None
    if label:
        values, label_problems = _checked_labels(data[label], label)
        problems = sorted(problems + label_problems, key=lambda problem: problem[0])
    _raise_problems(problems, where)
    return Rows(texts, values, names, where)


# ----------------------------------------------------------------------------- images
def _read_npz(path: Path, read_labels: bool, labels: bool | None) -> Rows:
    """Images (N, C, H, W) from the array ``x`` of an .npz file, labels from ``y``."""
    arrays = read_npz(path)
    if IMAGE_ARRAY not in arrays:
        raise ProbtransError(
            f"{path}: no array {IMAGE_ARRAY!r} with the images (arrays: {_listed(arrays)})"
        )
    x = arrays[IMAGE_ARRAY]
    if x.ndim not in (3, 4):
        raise ProbtransError(
            f"{path}: array {IMAGE_ARRAY!r} has shape {x.shape}; images are (N, H, W) or "
            f"(N, C, H, W)"
        )
    if x.dtype.kind not in "biuf":
        raise ProbtransError(f"{path}: array {IMAGE_ARRAY!r} has dtype {x.dtype}, not numbers")
    if len(x) == 0:
        raise ProbtransError(f"{path}: array {IMAGE_ARRAY!r} holds no images (shape {x.shape})")
    images = x[:, None] if x.ndim == 3 else x
    _check_finite(images, f"{path}: array {IMAGE_ARRAY!r}", "image")
    where = _row_index(str(path))
    if not read_labels or (labels is None and LABEL_ARRAY not in arrays):
        return Rows(images, None, None, where)
    if LABEL_ARRAY not in arrays:
        raise ProbtransError(
            f"{path}: no array {LABEL_ARRAY!r} with the labels (arrays: {_listed(arrays)})"
        )
    y = arrays[LABEL_ARRAY]
    if y.shape != (len(images),):
        raise ProbtransError(
            f"{path}: array {LABEL_ARRAY!r} has shape {y.shape}, not ({len(images)},) as the "
            f"{len(images)} images of {IMAGE_ARRAY!r}"
        )
    if y.dtype.kind not in "iufU":
        raise ProbtransError(
            f"{path}: array {LABEL_ARRAY!r} has dtype {y.dtype}, not integers or strings"
        )
    values, problems = _checked_labels(y.tolist(), LABEL_ARRAY)
    _raise_problems(problems, where)
    return Rows(images, values, None, where)


def _check_finite(images: np.ndarray, name: str, row: str) -> None:
    """Refuse float images holding NaN or infinite values, naming the first such row."""
    if images.dtype.kind == "f":
        bad = ~np.isfinite(images.reshape(len(images), -1)).all(axis=1)
        if bad.any():
            raise ProbtransError(
                f"{name} holds NaN or infinite values ({row} {int(np.argmax(bad))} first)"
            )


def _image_array(value: object) -> np.ndarray:
    """A PIL image or array-like as a numpy array (a palette image as RGB)."""
    if hasattr(value, "convert") and getattr(value, "mode", None) == "P":
        value = value.convert("RGB")  # type: ignore[attr-defined]
    return np.asarray(value)


def _hf_images(dataset: datasets.Dataset, column: str, where: Callable[[int], str]) -> np.ndarray:
    """The images of ``column`` (H, W) or (H, W, C) as one array (N, C, H, W)."""
    images: list[np.ndarray] = []
    problems: list[tuple[int, str]] = []
    for row, value in enumerate(dataset[column]):
        if value is None:
            problems.append((row, f"{column!r} is missing"))
            continue
        array = _image_array(value)
        if array.ndim not in (2, 3) or array.dtype.kind not in "biuf":
            problems.append(
                (
                    row,
                    f"{column!r} is not an image (H, W) or (H, W, C) of numbers: "
                    f"{array.dtype} of shape {array.shape}",
                )
            )
            continue
        chw = array[None] if array.ndim == 2 else array.transpose(2, 0, 1)
        if images and chw.shape != images[0].shape:
            problems.append(
                (row, f"image of shape (C, H, W) = {chw.shape}, the first is {images[0].shape}")
            )
            continue
        images.append(chw)
    _raise_problems(problems, where)
    return np.stack(images)


def read_images(
    source: Source,
    *,
    image_column: str = "image",
    label_column: str | None = "label",
    split: str = "train",
    labels: bool | None = True,
) -> Rows:
    """The images of ``source`` (N, C, H, W), in the source's dtype, and their labels.

    An ``.npz`` file holds the images in the array ``x`` ((N, H, W) is one channel) and the
    labels in ``y``; a saved folder or hub dataset holds them in ``image_column`` (PIL images
    or arrays (H, W) or (H, W, C), all of one shape) and ``label_column``. ``split`` and
    ``labels`` as for :func:`read_texts`. Raises ProbtransError naming the source (and the
    array or row) for a missing file, an unknown extension, a missing array or column, arrays of
    the wrong shape or dtype, NaN values, images of different shapes and missing labels.
    """
    read_labels = labels is not False and bool(label_column)
    if source.path is not None and not _is_folder(source):
        _checked_file(source.path, IMAGE_FORMATS, "images")
        return _read_npz(source.path, read_labels, labels)
    dataset, name = _hf_dataset(source, split)
    _require_column(name, dataset.column_names, image_column, "image")
    label = _label_column(name, dataset.column_names, label_column, labels)
    if len(dataset) == 0:
        raise ProbtransError(f"{name}: no rows")
    where = _row_index(name)
    images = _hf_images(dataset, image_column, where)
    _check_finite(images, f"{name}: column {image_column!r}", "row")
    values = None
    if label:
        values, problems = _checked_labels(list(dataset[label]), label)
        _raise_problems(problems, where)
    return Rows(images, values, _class_names(dataset, label), where)


# ----------------------------------------------------------------------------- predict inputs
def _read_lines(path: Path | None) -> Rows:
    """One text per line of ``path`` (a ``.txt`` file), or of standard input when ``path`` is
    None; an empty line (but at the end) is an error, so that rows stay the input's lines."""
    name = "standard input" if path is None else str(path)
    problems: list[tuple[int, str]] = []
    if path is None:
        try:
            lines = sys.stdin.read().split("\n")
        except UnicodeDecodeError as err:
            raise ProbtransError(f"standard input: not UTF-8 text ({err.reason})") from None
    else:
        _checked_file(path, (TEXT_LINES,), "texts")
        lines = []
        for number, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
            try:
                lines.append(raw.decode("utf-8"))
            except UnicodeDecodeError as err:
                problems.append((number, f"not valid UTF-8 ({err.reason} at byte {err.start})"))
                lines.append("")
    while lines and not lines[-1].strip():  # blank lines at the end
        lines.pop()
    problems += [
        (n, "an empty line (one text per line, every line a text)")
        for n, line in enumerate(lines, start=1)
        if not line.strip() and n not in dict(problems)
    ]
    _raise_problems(sorted(problems), lambda number: f"{name}:{number}")
    if not lines:
        raise ProbtransError(f"{name}: no texts")
    return Rows([line.rstrip("\r") for line in lines], None, None, lambda row: f"{name}:{row + 1}")


def read_inputs(
    text: str,
    kind: str,
    *,
    text_column: str = "text",
    image_column: str = "image",
    label_column: str | None = "label",
) -> Rows:
    """The inputs of ``probtrans predict``, of ``kind`` "text" or "image", with their labels
    when the source has a label column.

    ``text``: ``-`` (texts only) reads standard input, one text per line; a ``.txt`` file
    holds one text per line (blank lines only at the end); anything else is a source
    (:func:`parse_source`, relative to the working directory) read by :func:`read_texts` or
    :func:`read_images` with the split "test" unless the source names one. Raises
    ProbtransError naming the source (and the line) for a problem; ValueError for an unknown
    ``kind``.
    """
    if kind not in ("text", "image"):
        raise ValueError(f"kind must be 'text' or 'image', got {kind!r}")
    if kind == "image":
        if text.strip() == STDIN:
            raise ProbtransError(
                f"standard input: images are read from an {IMAGE_FORMATS[0]} file (array "
                f"{IMAGE_ARRAY!r}) or a Hugging Face dataset ({HF_PREFIX}ID)"
            )
        return read_images(
            parse_source(text),
            image_column=image_column,
            label_column=label_column,
            split="test",
            labels=None,
        )
    if text.strip() == STDIN:
        return _read_lines(None)
    source = parse_source(text)
    return read_texts(
        source, text_column=text_column, label_column=label_column, split="test", labels=None
    )
