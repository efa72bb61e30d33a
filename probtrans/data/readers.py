"""The readers of the built-in formats but CSV and TSV (:mod:`probtrans.data.delimited`): text
lines (``.txt``), JSON Lines (plain and gzipped), Parquet and NPZ images (the array ``x``,
(N, H, W) or (N, C, H, W), the labels ``y``), and what the delimited readers share with them.

Tables are read through ``datasets`` (imported on first read, so the format table loads without
it). A text table that ``datasets`` cannot parse (a bad JSON line, bytes that are not UTF-8, a
truncated gzip file) is read again line by line (:func:`numbered_lines`) to name its first bad
lines (:func:`unreadable`); a row is named ``FILE:LINE``, the line it starts on
(:class:`LineStarts`), or ``FILE: row K`` where a file has no lines.
"""

from __future__ import annotations

import gzip
import json
import logging
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from probtrans.data.rows import (
    ReadOptions,
    Rows,
    TextColumn,
    checked_label,
    label_to_read,
    listed,
    paired,
    raise_problems,
    reason,
    require_column,
    row_index,
    text_problem,
)
from probtrans.errors import ProbtransError
from probtrans.storage.io import read_npz

IMAGE_ARRAY = "x"  # the images of an .npz file
LABEL_ARRAY = "y"  # the labels of an .npz file


# ----------------------------------------------------------------------------- lines
def numbered_lines(path: Path) -> tuple[list[bytes], str | None]:
    """The lines of ``path`` (gunzipped for ``.gz``) and why reading stopped early, if it did;
    a file that cannot be opened raises ProbtransError naming it."""
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


def decoded(raw: list[bytes]) -> tuple[list[str], list[tuple[int, str]]]:
    """The lines as text (a leading BOM dropped) and the lines that are not UTF-8."""
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
    return lines, problems


def read_lines(path: Path | None, options: ReadOptions | None = None) -> Rows:
    """One text per line of ``path`` (a ``.txt`` file), or of standard input when ``path`` is
    None; an empty line (but at the end) is an error, so that rows stay the input's lines."""
    name = "standard input" if path is None else str(path)
    check_one_text_a_line(name, options)
    problems: list[tuple[int, str]] = []
    if path is None:
        try:
            lines = sys.stdin.read().split("\n")
        except UnicodeDecodeError as err:
            raise ProbtransError(f"standard input: not UTF-8 text ({err.reason})") from None
    else:
        lines, problems = decoded(path.read_bytes().split(b"\n"))
    while lines and not lines[-1].strip():  # blank lines at the end
        lines.pop()
    problems += [
        (n, "an empty line (one text per line, every line a text)")
        for n, line in enumerate(lines, start=1)
        if not line.strip() and n not in dict(problems)
    ]
    raise_problems(sorted(problems), lambda number: f"{name}:{number}")
    if not lines:
        raise ProbtransError(f"{name}: no texts")
    return Rows([line.rstrip("\r") for line in lines], None, None, lambda row: f"{name}:{row + 1}")


def check_one_text_a_line(name: str, options: ReadOptions | None) -> None:
    """Refuse a pair column for lines of text: a line holds one text."""
    if options is not None and options.pair_column is not None:
        raise ProbtransError(
            f"{name}: one text per line, but this run reads pairs of texts (the columns "
            f"{options.text_column!r} and {options.pair_column!r}): give a table (CSV, TSV, "
            f"JSON Lines or Parquet) with both columns"
        )


def stream_lines(path: Path, options: ReadOptions, rows: int) -> Iterator[list[str]]:
    """The lines of a ``.txt`` file as :func:`read_lines` reads them, ``rows`` at a time (a
    line that is not UTF-8, or an empty line before a text, raises)."""
    check_one_text_a_line(str(path), options)
    chunk: list[str] = []
    blank = 0  # empty lines held back: an error before a text, dropped at the end
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh):
            line = raw.decode("utf-8").rstrip("\n").rstrip("\r")
            if number == 0:
                line = line.removeprefix("\ufeff")
            if not line.strip():
                blank += 1
                continue
            if blank:
                raise ValueError(f"{path}: an empty line before line {number + 1}")
            chunk.append(line)
            if len(chunk) == rows:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


# ----------------------------------------------------------------------------- datasets
@contextmanager
def quiet_datasets() -> Iterator[None]:
    """Silence ``datasets``' progress bars and log messages inside the block (a failed read is
    reported by probtrans), then restore both settings."""
    import datasets
    from datasets.utils import logging as datasets_logging

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


def class_names(dataset: Any, column: str | None) -> list[str] | None:
    """The class names of ``column`` of a ``datasets.Dataset`` if it is a ClassLabel feature."""
    import datasets

    feature = dataset.features.get(column) if column else None
    return list(feature.names) if isinstance(feature, datasets.ClassLabel) else None


def load_table(path: Path, builder: str, **options: Any) -> Any:
    """The rows of a file through ``datasets``' ``builder``, in memory, through a temporary
    cache folder that is removed afterwards."""
    import datasets

    with tempfile.TemporaryDirectory(prefix="probtrans-datasets-") as cache, quiet_datasets():
        return datasets.load_dataset(
            builder,
            data_files=str(path.resolve()),
            split="train",
            cache_dir=cache,
            keep_in_memory=True,
            **options,
        )


def streamed_texts(
    path: Path, builder: str, columns: tuple[str, ...], rows: int, **options: Any
) -> Iterator[list]:
    """The texts of ``columns`` of a file (one text column, or two read as pairs) through
    ``datasets``' ``builder`` in streaming mode (read as it is iterated), ``rows`` values at a
    time; a KeyError for a file without a column."""
    import datasets

    with quiet_datasets():
        dataset = datasets.load_dataset(
            builder, data_files=str(path.resolve()), split="train", streaming=True, **options
        )
    batches = dataset.iter(batch_size=rows)
    while True:
        with quiet_datasets():  # a streamed read fails here, not at load_dataset
            batch = next(batches, None)
        if batch is None:
            return
        yield list(paired([batch[column] for column in columns]))


def rows_of(dataset: Any, name: str, options: ReadOptions, label: str | None, where) -> Rows:
    """The text and label columns of a loaded table as :class:`Rows` (``name`` names it)."""
    if len(dataset) == 0:
        raise ProbtransError(f"{name}: no rows")
    labels = dataset[label] if label else None
    columns = [TextColumn(dataset.data.column(column)) for column in options.text_columns]
    for texts in columns:
        texts.array.validate(full=True)  # bytes that are not UTF-8 raise here, as a read would
    return Rows(paired(columns), labels, class_names(dataset, label), where)


def dataset_texts(dataset: Any, name: str, options: ReadOptions, where) -> Rows:
    """The texts and labels of a loaded ``datasets`` table (a file's, a saved folder's or a hub
    dataset's), its text column and, where required, its label column checked."""
    for column in options.text_columns:
        require_column(name, dataset.column_names, column, "text")
    label = label_to_read(name, dataset.column_names, options)
    return rows_of(dataset, name, options, label, where)


# ----------------------------------------------------------------------------- files read by hand
def row_problems(row: dict[str, Any], options: ReadOptions, label: str | None) -> list[str]:
    """The problems of one row of a file read by hand: its text, and its label when read
    (required, or the row has it)."""
    problems = [text_problem(row.get(column), column) for column in options.text_columns]
    if label and (options.labels is True or label in row):
        problems.append(checked_label(row.get(label), label, options.classes, options.declared)[1])
    return [problem for problem in problems if problem]


def unreadable(path: Path, problems: list[tuple[int, str]], rows: int, err: Exception) -> NoReturn:
    """The error for a file ``datasets`` failed on: its first bad lines (``FILE:LINE``), else
    "no rows", else the ``datasets`` error."""
    if problems:
        problems.sort(key=lambda problem: problem[0])
        raise_problems(problems, lambda number: f"{path}:{number}")
    if rows == 0:
        raise ProbtransError(f"{path}: no rows")
    raise ProbtransError(f"{path}: cannot be read ({reason(err)})")


class LineStarts:
    """``where`` for a line-based file: row → ``FILE:LINE``, the line the row starts on. The
    lines are found by reading the file again on first use, i.e. only when a row is reported;
    if they do not match the rows ``datasets`` read, rows are named ``FILE: row K``."""

    def __init__(self, path: Path, n_rows: int, starts: Callable[[list[str]], list[int]]):
        self.path, self.n_rows, self._find = path, n_rows, starts
        self._starts: list[int] | None = None

    def __call__(self, row: int) -> str:
        if self._starts is None:
            raw, _ = numbered_lines(self.path)
            starts = self._find(decoded(raw)[0])
            self._starts = starts if len(starts) == self.n_rows else []
        if 0 <= row < len(self._starts):
            return f"{self.path}:{self._starts[row]}"
        return f"{self.path}: row {row}"


# ----------------------------------------------------------------------------- JSON Lines
def _json_starts(lines: list[str]) -> list[int]:
    return [number for number, line in enumerate(lines, start=1) if line.strip()]


def _json_by_hand(path: Path, options: ReadOptions, label: str | None) -> tuple[list, int]:
    """The problems of a JSON Lines file read line by line, and the rows found."""
    raw, stopped = numbered_lines(path)
    lines, problems = decoded(raw)
    rows = 0
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
        problems.extend((number, problem) for problem in row_problems(row, options, label))
    if stopped:
        problems.append((len(raw) + 1, stopped))
    return problems, rows


def read_json_lines(path: Path, options: ReadOptions) -> Rows:
    """One JSON object per line (gunzipped for ``.gz``); blank lines are skipped."""
    read_label = options.label_column if options.read_labels else None
    try:
        dataset = load_table(path, "json")
        where = LineStarts(path, len(dataset), _json_starts)
        return dataset_texts(dataset, str(path), options, where)
    except ProbtransError:
        raise
    except Exception as err:  # a file datasets cannot parse (or decode): find the bad lines
        unreadable(path, *_json_by_hand(path, options, read_label), err)


def stream_json_lines(path: Path, options: ReadOptions, rows: int) -> Iterator[list]:
    """The texts of a JSON Lines file (gunzipped for ``.gz``), ``rows`` at a time."""
    return streamed_texts(path, "json", options.text_columns, rows)


# ----------------------------------------------------------------------------- Parquet
def read_parquet(path: Path, options: ReadOptions) -> Rows:
    """A Parquet table; rows are named by their index (``FILE: row K``)."""
    try:
        dataset = load_table(path, "parquet")
    except Exception as err:
        raise ProbtransError(f"{path}: not a readable Parquet file ({reason(err)})") from None
    return dataset_texts(dataset, str(path), options, row_index(str(path)))


def stream_parquet(path: Path, options: ReadOptions, rows: int) -> Iterator[list]:
    """The texts of a Parquet table, ``rows`` at a time."""
    return streamed_texts(path, "parquet", options.text_columns, rows)


# ----------------------------------------------------------------------------- NPZ images
def check_finite(images: np.ndarray, name: str, row: str) -> None:
    """Refuse float images holding NaN or infinite values, naming the first such row."""
    if images.dtype.kind == "f":
        bad = ~np.isfinite(images.reshape(len(images), -1)).all(axis=1)
        if bad.any():
            raise ProbtransError(
                f"{name} holds NaN or infinite values ({row} {int(np.argmax(bad))} first)"
            )


def read_npz_images(path: Path, options: ReadOptions) -> Rows:
    """Images (N, C, H, W) from the array ``x`` of an .npz file ((N, H, W): one channel),
    labels from ``y``."""
    arrays = read_npz(path)
    if IMAGE_ARRAY not in arrays:
        raise ProbtransError(
            f"{path}: no array {IMAGE_ARRAY!r} with the images (arrays: {listed(arrays)})"
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
    check_finite(images, f"{path}: array {IMAGE_ARRAY!r}", "image")
    where = row_index(str(path))
    if not options.read_labels or (options.labels is None and LABEL_ARRAY not in arrays):
        return Rows(images, None, None, where)
    if LABEL_ARRAY not in arrays:
        raise ProbtransError(
            f"{path}: no array {LABEL_ARRAY!r} with the labels (arrays: {listed(arrays)})"
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
    return Rows(images, y.tolist(), None, where)
