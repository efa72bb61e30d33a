"""The file formats: one table (:data:`FORMATS`) of :class:`Format` descriptors — name, suffixes,
what the rows hold, the reader and, for tables, the writer — that every reader of probtrans
(training files, out-of-domain sets, the built-in IMDB/CR/CoLA files, ``probtrans predict``
inputs), the prediction writer and the command's help use.

Built in: CSV (comma-separated, quoted as usual), TSV (split on tabs only, no quoting: a quote is
an ordinary character; a header-less file is read with :attr:`ReadOptions.header`), JSON Lines
(``.jsonl``, gzipped ``.jsonl.gz``), Parquet, text lines (``.txt``, one text per line, no
labels) and NPZ images (the array ``x``, (N, H, W) or (N, C, H, W), the labels ``y``).
:func:`register_format` adds one (a plugin's one registration call); an unknown suffix is an
error naming the known ones (:func:`format_of`).

A reader returns :class:`Rows` with the labels as the file holds them, each row named in
messages by ``where`` (``FILE:LINE``, the line the row starts on, for line-based files); the
texts and labels are checked by :mod:`probtrans.data.files` with :func:`text_problem` and
:func:`checked_label`. Problems are raised in one line listing the first :data:`MAX_REPORTED`
(:func:`raise_problems`). A text table that ``datasets`` cannot parse (a bad JSON line, a CSV row
with extra fields, bytes that are not UTF-8, a truncated gzip file) is read again line by line
(:func:`numbered_lines`) to name the first bad lines; so is a CSV file that it parses but the
csv module refuses in strict mode (a quote left open, which pandas silently runs on into the
following lines). ``datasets`` is imported on first read,
so the table loads without it.
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
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn, overload

import numpy as np

from probtrans.errors import ProbtransError
from probtrans.io import read_npz
from probtrans.registry import Registry

MAX_REPORTED = 5  # malformed rows listed in one error message
IMAGE_ARRAY = "x"  # the images of an .npz file
LABEL_ARRAY = "y"  # the labels of an .npz file
_INTEGER = re.compile(r"\s*[+-]?\d+\s*")
#: label strings that mean "no value" (compared in lower case, stripped): refused as labels
#: unless ``data.labels`` lists them (:func:`checked_label`)
MISSING_WORDS = frozenset({"nan", "-nan", "na", "n/a", "#n/a", "<na>", "null", "none"})
SHOWN_NAME = 60  # the longest a column or array name is shown in messages (:func:`shown`)
MAX_LISTED = 12  # names listed in one message (:func:`listed`)

Kind = Literal["text", "image"]


# ----------------------------------------------------------------------------- rows
class TextColumn(Sequence[str]):
    """The texts of a table read through ``datasets``, kept as its Arrow strings (about the
    size of the texts themselves) and made Python strings a slice at a time: ``column[a:b]`` is
    a list, and iterating goes :data:`SLICE_ROWS` rows at a time. So ``probtrans predict`` holds
    an input of millions of rows once, compactly. Equal to a list of the same texts."""

    SLICE_ROWS = 8192

    def __init__(self, array: Any) -> None:
        self.array = array  # a pyarrow (Chunked)Array of strings (None where a row has none)

    def __len__(self) -> int:
        return len(self.array)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return [self[row] for row in range(start, stop, step)]
            return self.array.slice(start, max(stop - start, 0)).to_pylist()
        row = range(len(self))[index]  # IndexError out of range, as a list
        return self.array[row].as_py()

    def __iter__(self) -> Iterator[str]:
        for start in range(0, len(self), self.SLICE_ROWS):
            yield from self[start : start + self.SLICE_ROWS]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TextColumn | list):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-looking, as a list

    def __repr__(self) -> str:
        return f"TextColumn({len(self)} texts)"


@dataclass
class Rows:
    """The rows read from one source."""

    values: Sequence[str] | np.ndarray  # texts, or images (N, C, H, W) in the source's dtype
    labels: list[int | str] | None  # raw label values, None when the source has no label column
    label_names: list[str] | None  # class names a datasets ClassLabel feature gives, else None
    where: Callable[[int], str]  # row number (0-based) → "FILE:LINE", "FILE: row K", ...

    def __len__(self) -> int:
        return len(self.values)


@dataclass(frozen=True)
class ReadOptions:
    """What a reader reads: the columns, whether labels are read (True: required; None: when
    present; False or no ``label_column``: not read), the classes integer labels must lie in
    (0..classes−1; None: any integer or string), for a header-less CSV/TSV file its column
    names, and the labels declared as classes (``data.labels``: a declared ``"NaN"`` is a
    class, not a missing value)."""

    text_column: str = "text"
    image_column: str = "image"
    label_column: str | None = "label"
    labels: bool | None = True
    classes: int | None = None
    header: tuple[str, ...] | None = None
    declared: tuple[Any, ...] = ()

    @property
    def read_labels(self) -> bool:
        return self.labels is not False and bool(self.label_column)


Reader = Callable[[Path, ReadOptions], Rows]
#: the texts of a file's text column, at most ``rows`` at a time, in order, read as they are
#: asked for (never the whole file): ``probtrans predict`` on inputs larger than memory. It
#: checks nothing: on a file its format's reader refuses it may raise anything, or give
#: texts the reader's checks refuse (the caller reads such a file whole, for the reader's
#: message: :func:`probtrans.data.files.input_text_chunks`)
TextStreamer = Callable[[Path, ReadOptions, int], Iterator[list[Any]]]
#: writes a table given as its chunks in order (each a dict of 1-D columns, the same names in
#: each), one chunk in memory at a time: ``probtrans predict`` writes each chunk as it is predicted
Writer = Callable[[Iterable[dict[str, np.ndarray]], Path], None]


@dataclass(frozen=True)
class Format:
    """A file format: its name (in help and messages), its suffixes (lower case, with the dot),
    what its rows hold, its reader (errors name ``FILE:LINE``, or ``FILE: row K`` where a file
    has no lines), its writer of a table given in chunks of columns (:data:`Writer`; None: not
    written), whether its rows can hold labels, and for texts the streamer of its text column
    (:data:`TextStreamer`; None: a file is read whole)."""

    name: str
    suffixes: tuple[str, ...]
    kind: Kind
    read: Reader
    write: Writer | None = None
    labels: bool = True
    stream: TextStreamer | None = None


#: the file formats by name, in the order messages and help list them
FORMATS: Registry[Format] = Registry("file format")


def register_format(fmt: Format) -> Format:
    """Add ``fmt`` to :data:`FORMATS` (a plugin's one call); a taken name or suffix raises
    ValueError."""
    taken = [s for s in fmt.suffixes for other in FORMATS.entries() if s in other.suffixes]
    if taken or not fmt.suffixes:
        raise ValueError(f"file format {fmt.name!r}: suffixes {taken or 'none'} (taken or none)")
    return FORMATS.register(fmt.name, fmt)


def formats(
    kind: Kind | None = None, *, labels: bool | None = None, writable: bool = False
) -> list[Format]:
    """The formats holding ``kind`` rows (any kind if None), with labels when ``labels`` is
    True, with a writer when ``writable``."""
    return [
        f
        for f in FORMATS.entries()
        if kind in (None, f.kind) and (f.labels or labels is not True) and (f.write or not writable)
    ]


def suffixes(chosen: Iterable[Format]) -> str:
    """``.csv, .tsv, ...``: the suffixes of ``chosen``, for messages and help."""
    return ", ".join(s for f in chosen for s in f.suffixes)


def find_format(path: Path, chosen: Iterable[Format]) -> Format | None:
    """The format of ``chosen`` whose suffix ends the name of ``path`` (the longest such)."""
    name = Path(path).name.lower()
    found = [(len(s), f) for f in chosen for s in f.suffixes if name.endswith(s)]
    return max(found, key=lambda pair: pair[0])[1] if found else None


def format_of(path: Path, kind: Kind, what: str, labels: bool | None, hint: str = "") -> Format:
    """The format of ``path`` among :func:`formats` of ``kind`` (and ``labels``); an unknown
    suffix raises ProbtransError naming the known ones (``what`` are read from them, or
    ``hint``)."""
    chosen = formats(kind, labels=labels)
    fmt = find_format(path, chosen)
    if fmt is None:
        suffix = "".join(Path(path).suffixes[-1:]).lower() or "(none)"
        raise ProbtransError(
            f"{path}: unknown extension {suffix!r}; {what} are read from {suffixes(chosen)} "
            f"files{hint}"
        )
    return fmt


# ----------------------------------------------------------------------------- checks
def raise_problems(problems: list[tuple[int, str]], where: Callable[[int], str]) -> None:
    """One error line listing the first malformed rows (``WHERE: problem``), if any."""
    if problems:
        shown = "; ".join(f"{where(row)}: {problem}" for row, problem in problems[:MAX_REPORTED])
        more = len(problems) - MAX_REPORTED
        raise ProbtransError(shown + (f" (and {more} more malformed rows)" if more > 0 else ""))


def text_problem(value: object, column: str) -> str | None:
    """Why ``value`` is not a text, or None if it is one."""
    if value is None:
        return f"{column!r} is missing"
    if not isinstance(value, str):
        return f"{column!r} is a {type(value).__name__}, not a string"
    if not value.strip():
        return f"{column!r} is empty"
    return None


def checked_label(
    value: object, column: str, classes: int | None = None, declared: Collection[Any] = ()
) -> tuple[int | str | None, str | None]:
    """(the label, None), or (None, why ``value`` is not a label): labels are integers or
    strings; an integral float becomes an integer; None, "" and NaN are missing, and so are
    the strings of :data:`MISSING_WORDS` ("NaN", "N/A", "null"...) unless ``declared`` (the
    classes ``data.labels`` lists) holds them. With ``classes``, a label is an integer (or
    integer string) in 0..classes−1."""
    label: int | str | None = None
    if isinstance(value, str) and value in declared:
        return value, None
    if value is None or (isinstance(value, str) and not value.strip()):
        return None, f"{column!r} is missing"
    if isinstance(value, bool | np.bool_):
        return None, f"{column!r} is {value!r}, a bool, not an integer or a string"
    if isinstance(value, int | np.integer):
        label = int(value)
    elif isinstance(value, float | np.floating):
        if math.isnan(value):
            return None, f"{column!r} is missing"
        if not float(value).is_integer():
            return None, f"{column!r} is {float(value)!r}, not an integer or a string"
        label = int(value)
    elif isinstance(value, str):
        label = value
    else:
        return None, f"{column!r} is a {type(value).__name__}, not an integer or a string"
    if classes is None:
        if isinstance(label, str) and label.strip().lower() in MISSING_WORDS:
            return None, (
                f"{column!r} is {label!r}, a missing value (list it in data.labels to make it "
                f"a class)"
            )
        return label, None
    if isinstance(label, str):
        if not _INTEGER.fullmatch(label):
            return None, f"{column!r} is {label!r}, not an integer"
        label = int(label)
    if not 0 <= label < classes:
        return None, f"{column!r} is {label}, outside the classes 0..{classes - 1}"
    return label, None


def checked_labels(
    values: list, column: str, classes: int | None = None, declared: Collection[Any] = ()
) -> tuple[list[int | str], list[tuple[int, str]]]:
    """The labels of ``values`` and the problems of the rows that hold none
    (:func:`checked_label`)."""
    labels: list[int | str] = []
    problems: list[tuple[int, str]] = []
    for row, value in enumerate(values):
        label, problem = checked_label(value, column, classes, declared)
        if problem:
            problems.append((row, problem))
        labels.append(label)  # None only in a row with a problem
    return labels, problems


def require_column(name: str, columns: list[str], column: str, what: str) -> None:
    if column not in columns:
        raise ProbtransError(
            f"{name}: no {what} column {shown(column)} (columns: {listed(columns)})"
        )


def label_to_read(name: str, columns: list[str], options: ReadOptions) -> str | None:
    """The label column to read: None when labels are not read, or ``options.labels`` is None
    and the column is absent; a column required (labels True) but absent raises
    ProbtransError."""
    if not options.read_labels:
        return None
    if options.label_column in columns:
        return options.label_column
    if options.labels is None:
        return None
    require_column(name, columns, options.label_column or "", "label")
    return None


def listed(names: Iterable[str]) -> str:
    """``'a', 'b', ...`` for a message: each name :func:`shown`, the first :data:`MAX_LISTED`."""
    names = list(names)
    more = f", ... ({len(names)} in all)" if len(names) > MAX_LISTED else ""
    return ", ".join(map(shown, names[:MAX_LISTED])) + more or "none"


def shown(name: object) -> str:
    """A name read from a file (a column, an array) as a message shows it: quoted, with
    characters that are not printable escaped (as ``repr`` does), and cut to
    :data:`SHOWN_NAME` characters with its length said."""
    text = repr(name)
    if len(text) <= SHOWN_NAME or not isinstance(name, str):
        return text[: SHOWN_NAME * 2]
    cut = name[:SHOWN_NAME]
    while len(repr(cut)) > SHOWN_NAME:
        cut = cut[:-1]
    return f"{cut!r}... ({len(name)} characters)"


def row_index(name: str) -> Callable[[int], str]:
    """``where`` for a source without lines: row K (0-based, as the source indexes it)."""
    return lambda row: f"{name}: row {row}"


def reason(err: BaseException) -> str:
    """``Type: first line`` of ``err`` (of its cause when datasets wrapped it)."""
    cause = err.__cause__ or err
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0]}" if lines else type(cause).__name__


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


def _decoded(raw: list[bytes]) -> tuple[list[str], list[tuple[int, str]]]:
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
    problems: list[tuple[int, str]] = []
    if path is None:
        try:
            lines = sys.stdin.read().split("\n")
        except UnicodeDecodeError as err:
            raise ProbtransError(f"standard input: not UTF-8 text ({err.reason})") from None
    else:
        lines, problems = _decoded(path.read_bytes().split(b"\n"))
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


def stream_lines(path: Path, options: ReadOptions, rows: int) -> Iterator[list[str]]:
    """The lines of a ``.txt`` file as :func:`read_lines` reads them, ``rows`` at a time (a
    line that is not UTF-8, or an empty line before a text, raises)."""
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


def _load(path: Path, builder: str, **options: Any) -> Any:
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


def _streamed(path: Path, builder: str, column: str, rows: int, **options: Any) -> Iterator[list]:
    """The ``column`` of a file through ``datasets``' ``builder`` in streaming mode (read as it
    is iterated), ``rows`` values at a time; a KeyError for a file without the column."""
    import datasets

    with quiet_datasets():
        dataset = datasets.load_dataset(
            builder, data_files=str(path.resolve()), split="train", streaming=True, **options
        )
    for batch in dataset.iter(batch_size=rows):
        yield batch[column]


def _rows_of(dataset: Any, name: str, options: ReadOptions, label: str | None, where) -> Rows:
    """The text and label columns of a loaded table as :class:`Rows` (``name`` names it)."""
    if len(dataset) == 0:
        raise ProbtransError(f"{name}: no rows")
    labels = dataset[label] if label else None
    texts = TextColumn(dataset.data.column(options.text_column))
    texts.array.validate(full=True)  # bytes that are not UTF-8 raise here, as a read would
    return Rows(texts, labels, class_names(dataset, label), where)


def dataset_texts(dataset: Any, name: str, options: ReadOptions, where) -> Rows:
    """The texts and labels of a loaded ``datasets`` table (a file's, a saved folder's or a hub
    dataset's), its text column and, where required, its label column checked."""
    require_column(name, dataset.column_names, options.text_column, "text")
    label = label_to_read(name, dataset.column_names, options)
    return _rows_of(dataset, name, options, label, where)


# ----------------------------------------------------------------------------- CSV and TSV
@contextmanager
def _long_csv_fields() -> Iterator[None]:
    """Let the csv module read fields of any length (as pandas does) inside the block."""
    limit = csv.field_size_limit()
    csv.field_size_limit(2**31 - 1)
    try:
        yield
    finally:
        csv.field_size_limit(limit)


def _blank(fields: list[str]) -> bool:
    """Whether a CSV/TSV record is a blank line or a line of spaces (pandas skips both)."""
    return not fields or (len(fields) == 1 and not fields[0].strip())


def _records(lines: Iterable[str], dialect: dict[str, Any]) -> Iterator[tuple[int, list[str]]]:
    """(the line it starts on, its fields) of each record of a CSV/TSV file, skipping the
    records that pandas skips (:func:`_blank`)."""
    reader = csv.reader(lines, **dialect)
    start = 1
    for fields in reader:
        if not _blank(fields):
            yield start, fields
        start = reader.line_num + 1


def _integer_strings(values: list) -> list:
    """The labels of a CSV or TSV column: integers when every label written is an integer."""
    written = [v for v in values if isinstance(v, str) and v.strip()]
    if written and all(_INTEGER.fullmatch(v) for v in written):
        return [int(v) if isinstance(v, str) and v.strip() else v for v in values]
    return values


def _row_problems(row: dict[str, Any], options: ReadOptions, label: str | None) -> list[str]:
    """The problems of one row of a file read by hand: its text, and its label when read
    (required, or the row has it)."""
    problems = [text_problem(row.get(options.text_column), options.text_column)]
    if label and (options.labels is True or label in row):
        problems.append(checked_label(row.get(label), label, options.classes, options.declared)[1])
    return [problem for problem in problems if problem]


def _unreadable(path: Path, problems: list[tuple[int, str]], rows: int, err: Exception) -> NoReturn:
    """The error for a file ``datasets`` failed on: its first bad lines (``FILE:LINE``), else
    "no rows", else the ``datasets`` error."""
    if problems:
        problems.sort(key=lambda problem: problem[0])
        raise_problems(problems, lambda number: f"{path}:{number}")
    if rows == 0:
        raise ProbtransError(f"{path}: no rows")
    raise ProbtransError(f"{path}: cannot be read ({reason(err)})")


class _LineStarts:
    """``where`` for a line-based file: row → ``FILE:LINE``, the line the row starts on. The
    lines are found by reading the file again on first use, i.e. only when a row is reported;
    if they do not match the rows ``datasets`` read, rows are named ``FILE: row K``."""

    def __init__(self, path: Path, n_rows: int, starts: Callable[[list[str]], list[int]]):
        self.path, self.n_rows, self._find = path, n_rows, starts
        self._starts: list[int] | None = None

    def __call__(self, row: int) -> str:
        if self._starts is None:
            raw, _ = numbered_lines(self.path)
            starts = self._find(_decoded(raw)[0])
            self._starts = starts if len(starts) == self.n_rows else []
        if 0 <= row < len(self._starts):
            return f"{self.path}:{self._starts[row]}"
        return f"{self.path}: row {row}"


def delimited(delimiter: str, quoting: bool) -> tuple[Reader, TextStreamer]:
    """The reader and the text streamer of a table of fields split on ``delimiter`` (quoted as
    usual if ``quoting``, else a quote is an ordinary character): the first record names the
    columns unless :attr:`ReadOptions.header` does; fields are read as written, strings (no
    type guessing; an empty or absent field is ""), a label column of integers written becomes
    integers."""
    dialect: dict[str, Any] = {"delimiter": delimiter}
    if not quoting:
        dialect["quoting"] = csv.QUOTE_NONE
    what = "CSV" if delimiter == "," else "TSV" if delimiter == "\t" else "delimited"

    def header_of(path: Path, options: ReadOptions) -> list[str]:
        if options.header is not None:
            return list(options.header)
        with _long_csv_fields(), open(path, newline="", encoding="utf-8-sig") as fh:
            header = next((fields for _, fields in _records(fh, dialect)), None)
        if header is None:
            raise ProbtransError(f"{path}: empty file (no header naming the columns)")
        return header

    def starts(lines: list[str], options: ReadOptions) -> list[int]:
        with _long_csv_fields():
            try:
                found = [start for start, _ in _records(lines, dialect)]
            except csv.Error:
                return []
        return found if options.header is not None else found[1:]

    def by_hand(path: Path, options: ReadOptions, label: str | None) -> tuple[list, int]:
        """The problems of the file read line by line, and the rows found."""
        raw, stopped = numbered_lines(path)
        lines, problems = _decoded(raw)
        header = list(options.header) if options.header is not None else None
        reader = csv.reader(lines, strict=True, **dialect)
        rows, start = 0, 1
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
                        problems.extend((start, p) for p in _row_problems(row, options, label))
                    start = reader.line_num + 1
            except csv.Error as err:
                problems.append((start, f"not a valid {what} row ({err})"))
        if stopped:
            problems.append((len(raw) + 1, stopped))
        return problems, rows

    def quoting_problems(path: Path) -> list[tuple[int, str]]:
        """The record the csv module refuses in strict mode, of a file that ``datasets`` read:
        a quote left open takes the lines up to the next quote into one field, which pandas
        accepts without a word; reported at the line the record starts on."""
        raw, _ = numbered_lines(path)
        if not any(b'"' in line for line in raw):
            return []
        reader = csv.reader(_decoded(raw)[0], strict=True, **dialect)
        start = 1
        with _long_csv_fields():
            try:
                for _ in reader:
                    start = reader.line_num + 1
            except csv.Error as err:
                if reader.line_num > start:
                    return [
                        (
                            start,
                            f"a quoted field opened here runs on to line {reader.line_num}, "
                            f"where {err} (a quote left open?)",
                        )
                    ]
                return [(start, f"not a valid {what} row ({err})")]
        return []

    def read(path: Path, options: ReadOptions) -> Rows:
        import datasets

        where = _LineStarts(path, 0, lambda lines: starts(lines, options))
        try:
            header = header_of(path, options)
            require_column(str(path), header, options.text_column, "text")
            label = label_to_read(str(path), header, options)
            columns = [options.text_column] + ([label] if label else [])
            strings = {column: datasets.Value("string") for column in columns}
            names = {"column_names": header} if options.header is not None else {}
            dataset = _load(  # "NA", "null"... are texts; an empty field is ""
                path,
                "csv",
                features=datasets.Features(strings),
                na_filter=False,
                **names,
                **dialect,
            )
            where.n_rows = len(dataset)
            rows = _rows_of(dataset, str(path), options, label, where)
        except ProbtransError:
            raise
        except Exception as err:  # a file datasets cannot parse (or decode): find the bad lines
            read_label = options.label_column if options.read_labels else None
            _unreadable(path, *by_hand(path, options, read_label), err)
        if quoting:
            raise_problems(quoting_problems(path), lambda number: f"{path}:{number}")
        if rows.labels is not None:
            rows.labels = _integer_strings(rows.labels)
        return rows

    def stream(path: Path, options: ReadOptions, rows: int) -> Iterator[list]:
        import datasets

        header = header_of(path, options)
        if quoting:  # a quote left open, which pandas runs on into the next lines, raises
            with _long_csv_fields(), open(path, newline="", encoding="utf-8-sig") as fh:
                for _ in csv.reader(fh, strict=True, **dialect):
                    pass
        names = {"column_names": header} if options.header is not None else {}
        yield from _streamed(
            path,
            "csv",
            options.text_column,
            rows,
            features=datasets.Features({options.text_column: datasets.Value("string")}),
            na_filter=False,
            **names,
            **dialect,
        )

    return read, stream


# ----------------------------------------------------------------------------- JSON Lines
def _json_starts(lines: list[str]) -> list[int]:
    return [number for number, line in enumerate(lines, start=1) if line.strip()]


def _json_by_hand(path: Path, options: ReadOptions, label: str | None) -> tuple[list, int]:
    """The problems of a JSON Lines file read line by line, and the rows found."""
    raw, stopped = numbered_lines(path)
    lines, problems = _decoded(raw)
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
        problems.extend((number, problem) for problem in _row_problems(row, options, label))
    if stopped:
        problems.append((len(raw) + 1, stopped))
    return problems, rows


def read_json_lines(path: Path, options: ReadOptions) -> Rows:
    """One JSON object per line (gunzipped for ``.gz``); blank lines are skipped."""
    read_label = options.label_column if options.read_labels else None
    try:
        dataset = _load(path, "json")
        where = _LineStarts(path, len(dataset), _json_starts)
        return dataset_texts(dataset, str(path), options, where)
    except ProbtransError:
        raise
    except Exception as err:  # a file datasets cannot parse (or decode): find the bad lines
        _unreadable(path, *_json_by_hand(path, options, read_label), err)


def stream_json_lines(path: Path, options: ReadOptions, rows: int) -> Iterator[list]:
    """The texts of a JSON Lines file (gunzipped for ``.gz``), ``rows`` at a time."""
    return _streamed(path, "json", options.text_column, rows)


# ----------------------------------------------------------------------------- Parquet
def read_parquet(path: Path, options: ReadOptions) -> Rows:
    """A Parquet table; rows are named by their index (``FILE: row K``)."""
    try:
        dataset = _load(path, "parquet")
    except Exception as err:
        raise ProbtransError(f"{path}: not a readable Parquet file ({reason(err)})") from None
    return dataset_texts(dataset, str(path), options, row_index(str(path)))


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


# ----------------------------------------------------------------------------- writers
def table_rows(columns: dict[str, np.ndarray]) -> list[list]:
    """The rows of ``columns`` (1-D arrays of one length) as Python values (float, int, str)."""
    table_length(columns)
    arrays = [np.asarray(values).tolist() for values in columns.values()]
    return [list(row) for row in zip(*arrays, strict=True)]


def table_length(columns: dict[str, np.ndarray]) -> int:
    """The number of rows of ``columns``; ValueError unless they are 1-D arrays of one length."""
    if not columns:
        raise ValueError("no columns to write")
    shapes = {name: np.shape(values) for name, values in columns.items()}
    lengths = {shape[0] if len(shape) == 1 else -1 for shape in shapes.values()}
    if len(lengths) != 1 or -1 in lengths:
        raise ValueError(f"columns must be 1-D of one length, got shapes {shapes}")
    return lengths.pop()


def checked_chunks(chunks: Iterable[dict[str, np.ndarray]]) -> Iterator[dict[str, np.ndarray]]:
    """``chunks`` as they are, each checked (:func:`table_length`) and to have the first one's
    column names in its order; ValueError for a table with no chunk."""
    names = None
    for columns in chunks:
        table_length(columns)
        if names is None:
            names = list(columns)
        elif list(columns) != names:
            raise ValueError(f"every chunk must have the columns {names}, got {list(columns)}")
        yield columns
    if names is None:
        raise ValueError("no columns to write")


def write_delimited(delimiter: str) -> Writer:
    """The writer of a header line and one line per row, fields split on ``delimiter``."""

    def write(chunks: Iterable[dict[str, np.ndarray]], path: Path) -> None:
        with open(path, "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh, delimiter=delimiter, lineterminator="\n")
            for number, columns in enumerate(chunks):
                if number == 0:
                    writer.writerow(list(columns))
                writer.writerows(table_rows(columns))

    return write


def write_json_lines(chunks: Iterable[dict[str, np.ndarray]], path: Path) -> None:
    """One JSON object per row."""
    with open(path, "w", encoding="utf-8") as fh:
        for columns in chunks:
            names = list(columns)
            for row in table_rows(columns):
                fh.write(json.dumps(dict(zip(names, row, strict=True))) + "\n")


def write_parquet(chunks: Iterable[dict[str, np.ndarray]], path: Path) -> None:
    """One Parquet table, a row group per chunk: strings, float64 and integers as they are (the
    schema is the first chunk's, through pyarrow)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer = None
    try:
        for columns in chunks:
            arrays = {name: _arrow(np.asarray(values)) for name, values in columns.items()}
            if writer is None:
                table = pa.table(arrays)
                writer = pq.ParquetWriter(path, table.schema)
            else:
                table = pa.table(arrays).cast(writer.schema)
            writer.write_table(table)
    finally:
        if writer is not None:
            writer.close()


def _arrow(values: np.ndarray) -> Any:
    """A pyarrow array of a column: texts (NumPy strings or Python str objects, which a column
    of long texts is kept as) as strings, even where there are none."""
    import pyarrow as pa

    return pa.array(values, type=pa.string() if values.dtype.kind in "OU" else None)


def stream_parquet(path: Path, options: ReadOptions, rows: int) -> Iterator[list]:
    """The texts of a Parquet table, ``rows`` at a time."""
    return _streamed(path, "parquet", options.text_column, rows)


# ----------------------------------------------------------------------------- the table
_CSV, _TSV = delimited(",", True), delimited("\t", False)
register_format(Format("CSV", (".csv",), "text", _CSV[0], write_delimited(","), stream=_CSV[1]))
register_format(Format("TSV", (".tsv",), "text", _TSV[0], write_delimited("\t"), stream=_TSV[1]))
register_format(
    Format(
        "JSON Lines",
        (".jsonl",),
        "text",
        read_json_lines,
        write_json_lines,
        stream=stream_json_lines,
    )
)
register_format(
    Format("gzipped JSON Lines", (".jsonl.gz",), "text", read_json_lines, stream=stream_json_lines)
)
register_format(
    Format("Parquet", (".parquet",), "text", read_parquet, write_parquet, stream=stream_parquet)
)
register_format(
    Format("text lines", (".txt",), "text", read_lines, labels=False, stream=stream_lines)
)
register_format(Format("NPZ", (".npz",), "image", read_npz_images))
