"""What a file reader is asked for (:class:`ReadOptions`) and returns (:class:`Rows`, the texts
of a table as :class:`TextColumn`, two columns of them as :class:`TextPairs`), and the checks
every reader shares: a text (:func:`text_problem`; a row's texts: :func:`texts_problem`), a
label (:func:`checked_label`; "NaN", "N/A"... are missing values unless ``data.labels``
declares them), a column (:func:`require_column`, :func:`label_to_read`), and
names read from a file as messages show them (:func:`shown`, :func:`listed`). Problems are raised
in one line listing the first :data:`MAX_REPORTED` (:func:`raise_problems`). Texts given in memory
(a list, an array, a pandas Series or DataFrame) are rows by :func:`text_rows`, a value that is no
text named by :func:`kind_of`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, overload

import numpy as np

from probtrans.errors import ProbtransError

MAX_REPORTED = 5  # malformed rows listed in one error message
INTEGER = re.compile(r"\s*[+-]?\d+\s*")  # an integer label as a file writes it
#: label strings that mean "no value" (compared in lower case, stripped): refused as labels
#: unless ``data.labels`` lists them (:func:`checked_label`)
MISSING_WORDS = frozenset({"nan", "-nan", "na", "n/a", "#n/a", "<na>", "null", "none"})
SHOWN_NAME = 60  # the longest a column or array name is shown in messages (:func:`shown`)
MAX_LISTED = 12  # names listed in one message (:func:`listed`)
T = TypeVar("T")


# ----------------------------------------------------------------------------- rows
class ListLike(Sequence[T]):
    """A read-only sequence equal to a list of the same items (and to another of its kind),
    unhashable as a list."""

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ListLike | list):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-looking, as a list


class TextColumn(ListLike[str]):
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

    def __repr__(self) -> str:
        return f"TextColumn({len(self)} texts)"


class TextPairs(ListLike[tuple[str, str]]):
    """The texts of two columns of a table read as pairs (a sentence-pair task's premise and
    hypothesis, ``data.text_column`` and ``data.text_pair_column``): row K is the tuple of the
    two columns' K-th texts, a slice a list of them. Equal to a list of the same tuples."""

    def __init__(self, first: Sequence[str], second: Sequence[str]) -> None:
        if len(first) != len(second):
            raise ValueError(f"{len(first)} first texts but {len(second)} second texts")
        self.first, self.second = first, second

    def __len__(self) -> int:
        return len(self.first)

    @overload
    def __getitem__(self, index: int) -> tuple[str, str]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[str, str]]: ...

    def __getitem__(self, index: int | slice) -> tuple[str, str] | list[tuple[str, str]]:
        if isinstance(index, slice):
            return list(zip(self.first[index], self.second[index], strict=True))
        return self.first[index], self.second[index]

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return zip(self.first, self.second, strict=True)

    def __repr__(self) -> str:
        return f"TextPairs({len(self)} pairs of texts)"


def text_rows(value: Any, what: str) -> list[Any] | None:
    """The rows of ``value`` where it holds texts, pairs of texts as tuples: a list or tuple
    holding a text, or anything but numbers (for the caller's check to name: None, NaN...); a
    NumPy array of strings or objects, (N,) or (N, 2) for pairs, as a pandas Series or a
    two-column DataFrame gives; any other iterable of texts. None where ``value`` holds numbers
    only (token ids). An array of texts of another shape is refused, naming ``what``."""
    if isinstance(value, list | tuple):
        return list(value) if holds_text(value) or not value else None
    if not hasattr(value, "__array__"):
        return list(value)
    values = np.asarray(value)
    if values.dtype.kind not in "USO":
        return None
    if values.ndim == 1:
        return values.tolist()
    if values.ndim == 2 and values.shape[1] == 2:
        return [tuple(row) for row in values.tolist()]
    raise ProbtransError(
        f"{what}: an array of texts of shape {values.shape}: give N texts (N,) or N pairs of "
        f"texts (N, 2)"
    )


def holds_text(value: object) -> bool:
    """Whether ``value`` (an input, or nested inputs) holds anything but numbers."""
    if isinstance(value, int | float | np.number):
        return False
    if isinstance(value, list | tuple):
        return any(holds_text(x) for x in value)
    if hasattr(value, "__array__"):  # a NumPy array or a tensor
        return np.asarray(value).dtype.kind in "USO"
    return True


def kind_of(value: object) -> str:
    """What a value given as a text is, for messages: "missing (None)", "missing (NaN)" (as
    pandas gives an empty cell), else its type ("a float")."""
    if value is None:
        return "missing (None)"
    if isinstance(value, float) and math.isnan(value):
        return "missing (NaN)"
    return f"a {type(value).__name__}"


def pair_kind_of(value: object) -> str:
    """What a value given as a pair of texts is, for messages: of two values, each one's
    :func:`kind_of` ("(a str, missing (None))"), else its own."""
    if isinstance(value, tuple | list) and len(value) == 2:
        return f"({', '.join(map(kind_of, value))})"
    return kind_of(value)


def is_text_pair(value: object) -> bool:
    """Whether ``value`` is a pair of texts (a tuple or list of two strings)."""
    return (
        isinstance(value, tuple | list)
        and len(value) == 2
        and all(isinstance(text, str) for text in value)
    )


def paired(columns: Sequence[Sequence[Any]]) -> Sequence[Any]:
    """The texts of one text column as they are, or of two as :class:`TextPairs`."""
    return columns[0] if len(columns) == 1 else TextPairs(*columns)


@dataclass
class Rows:
    """The rows read from one source."""

    #: texts (pairs of texts with a pair column), or images (N, C, H, W) in the source's dtype
    values: Sequence[str] | Sequence[tuple[str, str]] | np.ndarray
    labels: list[int | str] | None  # raw label values, None when the source has no label column
    label_names: list[str] | None  # class names a datasets ClassLabel feature gives, else None
    where: Callable[[int], str]  # row number (0-based) → "FILE:LINE", "FILE: row K", ...

    def __len__(self) -> int:
        return len(self.values)

    def named_labels(self, names: list[str] | None = None) -> list[int | str] | None:
        """The labels with each integer of a ClassLabel feature given as its class name (two
        sources may number the same classes differently), or where the source has none, as its
        name in ``names`` (integers that index the task's classes); other labels (and integers
        outside the classes, e.g. -1 for none) as they are."""
        names = self.label_names or names
        if self.labels is None or names is None:
            return self.labels
        return [names[v] if isinstance(v, int) and 0 <= v < len(names) else v for v in self.labels]


@dataclass(frozen=True)
class ReadOptions:
    """What a reader reads: the columns (with ``pair_column``, each row's texts are a pair: that of
    ``text_column`` and that of ``pair_column``), whether labels are read (True: required; None:
    when present; False or no ``label_column``: not read), the classes integer labels must lie in
    (0..classes−1; None: any integer or string), for a header-less CSV/TSV file its column names,
    and the labels declared as classes (``data.labels``: a declared ``"NaN"`` is a class, not a
    missing value)."""

    text_column: str = "text"
    pair_column: str | None = None
    image_column: str = "image"
    label_column: str | None = "label"
    labels: bool | None = True
    classes: int | None = None
    header: tuple[str, ...] | None = None
    declared: tuple[Any, ...] = ()

    @property
    def read_labels(self) -> bool:
        return self.labels is not False and bool(self.label_column)

    @property
    def text_columns(self) -> tuple[str, ...]:
        """The text column, and the pair column if there is one."""
        return (self.text_column,) + ((self.pair_column,) if self.pair_column else ())


Reader = Callable[[Path, ReadOptions], Rows]
#: the texts of a file's text column (pairs of texts with a pair column), at most ``rows`` at
#: a time, in order, read as they are asked for (never the whole file): ``probtrans predict``
#: on inputs larger than memory. It
#: checks nothing: on a file its format's reader refuses it may raise anything, or give
#: texts the reader's checks refuse (the caller reads such a file whole, for the reader's
#: message: :func:`probtrans.data.files.input_text_chunks`)
TextStreamer = Callable[[Path, ReadOptions, int], Iterator[list[Any]]]


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


def texts_problem(value: object, options: ReadOptions) -> str | None:
    """Why ``value`` is not a row's input (a text, or with a pair column a pair of texts), or
    None if it is one."""
    if options.pair_column is None:
        return text_problem(value, options.text_column)
    first, second = value  # type: ignore[misc]  # a pair, as the readers give it
    return text_problem(first, options.text_column) or text_problem(second, options.pair_column)


def checked_label(
    value: object, column: str, classes: int | None = None, declared: Collection[Any] = ()
) -> tuple[int | str | None, str | None]:
    """(the label, None), or (None, why ``value`` is not a label): labels are integers or
    strings; an integral float becomes an integer, a bool the string "False" or "True" (what
    a CSV of the same labels holds); None, "" and NaN are missing, and so are
    the strings of :data:`MISSING_WORDS` ("NaN", "N/A", "null"...) unless ``declared`` (the
    classes ``data.labels`` lists) holds them. With ``classes``, a label is an integer (or
    integer string) in 0..classes−1."""
    label: int | str | None = None
    if isinstance(value, str) and value in declared:
        return value, None
    if value is None or (isinstance(value, str) and not value.strip()):
        return None, f"{column!r} is missing"
    if isinstance(value, bool | np.bool_):  # as a CSV gives it: the classes "False", "True"
        value = str(bool(value))
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
        if not INTEGER.fullmatch(label):
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


#: separators a delimited file may use other than its format's (spreadsheets export ';' where
#: the comma is the decimal mark)
OTHER_SEPARATORS = (";", "|")


def require_column(name: str, columns: list[str], column: str, what: str) -> None:
    """Raise ProbtransError where ``column`` is not one of ``columns`` (file ``name``'s); a
    header read as one column that holds ``column`` between another separator is named as
    such."""
    if column in columns:
        return
    hint = ""
    if len(columns) == 1:
        for separator in OTHER_SEPARATORS:
            if column in columns[0].split(separator):
                hint = (
                    f"; its header is one column holding {separator!r}: a file separated by "
                    f"{separator!r}? save it with commas (.csv) or tabs (.tsv)"
                )
                break
    raise ProbtransError(
        f"{name}: no {what} column {shown(column)} (columns: {listed(columns)}){hint}"
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
