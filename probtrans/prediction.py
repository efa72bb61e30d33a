"""Predictions on new inputs: one row of columns per input, the input files, the output files.

:func:`prediction_columns` turns posterior-predictive samples (S, N, C) into named columns
(numpy arrays of length N), in this order:

* ``predicted`` — the class name of argmax_c p̄(c | x_n), p̄ the mean over the S samples;
* ``p_<class>`` — p̄(c | x_n), one column per class;
* ``entropy`` — H[p̄(· | x_n)], the entropy of the mean prediction (total uncertainty);
* ``expected_entropy`` — (1/S) Σ_s H[p_s(· | x_n)] (the aleatoric part);
* ``mutual_information`` — entropy − expected_entropy, clipped at 0 (the epistemic part);
* ``std_top`` — the standard deviation (ddof = 0) over samples of p_s(ĉ | x_n), ĉ the predicted
  class;
* ``entropy_percentile`` — with reference entropies (the validation split's): the percentage of
  them ≤ the input's entropy; 90 means as uncertain as the 10% most uncertain validation inputs;
* ``label`` — with labels: the class name of the label, or "" where the label is −1 (no class).

Entropies are in nats (natural logarithms), computed by :mod:`probtrans.metrics`.

:func:`read_inputs` reads the inputs of ``probtrans predict``; :func:`write_predictions` writes
the columns as CSV, TSV or JSON Lines, or shows them as a table.
"""

from __future__ import annotations

import csv
import gzip
import json
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from probtrans import metrics
from probtrans.errors import ProbtransError
from probtrans.io import atomic_write, read_npz

#: the files read for text runs (``-`` is standard input, one text per line)
TEXT_FORMATS = (".txt", ".csv", ".tsv", ".jsonl", ".jsonl.gz")
#: the files read for image runs: an ``.npz`` with the array ``x``
IMAGE_FORMATS = (".npz",)
#: the files :func:`write_predictions` writes
OUTPUT_FORMATS = (".csv", ".tsv", ".jsonl")
TEXT_COLUMN = "text"
IMAGE_ARRAY = "x"
SHOWN_ROWS = 20  # rows of the table shown on the terminal


# ----------------------------------------------------------------------------- columns
def prediction_columns(
    probs: np.ndarray,
    class_names: list[str],
    reference_entropy: np.ndarray | None = None,
    labels: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """The columns of the module docstring for ``probs`` (S, N, C), each of length N.

    ``class_names`` has C names; ``reference_entropy`` (any number of entropies, in nats) adds
    ``entropy_percentile``; ``labels`` (N,), classes 0..C−1 or −1 for none, adds ``label``.
    Entropies and mutual information are in nats (natural logarithms). Raises ValueError for
    arrays of the wrong shape.
    """
    probs = np.asarray(probs, dtype=np.float64)
    mean = metrics.predictive_mean(probs)  # checks (S, N, C)
    n_examples, n_classes = mean.shape
    names = [str(name) for name in class_names]
    if len(names) != n_classes:
        raise ValueError(f"class_names has {len(names)} names but probs has {n_classes} classes")
    if len(set(names)) != len(names):
        raise ValueError(f"class_names must be distinct, got {names}")
    top = mean.argmax(axis=1)
    entropy = metrics.predictive_entropy(probs)
    columns: dict[str, np.ndarray] = {"predicted": np.array(names, dtype=str)[top]}
    columns.update({f"p_{name}": mean[:, c] for c, name in enumerate(names)})
    columns["entropy"] = entropy
    columns["expected_entropy"] = metrics.expected_entropy(probs)
    columns["mutual_information"] = metrics.mutual_information(probs)
    columns["std_top"] = probs[:, np.arange(n_examples), top].std(axis=0)
    if reference_entropy is not None:
        columns["entropy_percentile"] = entropy_percentile(entropy, reference_entropy)
    if labels is not None:
        columns["label"] = _label_names(labels, names, n_examples)
    return columns


def entropy_percentile(entropy: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """For each entropy, the percentage (0–100) of ``reference`` values ≤ it."""
    reference = np.sort(np.asarray(reference, dtype=np.float64).ravel())
    if reference.size == 0:
        raise ValueError("reference_entropy must not be empty")
    below = np.searchsorted(reference, np.asarray(entropy, dtype=np.float64), side="right")
    return 100.0 * below / reference.size


def _label_names(labels: np.ndarray, names: list[str], n_examples: int) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.shape != (n_examples,) or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"labels must be integers of shape ({n_examples},), got {labels.dtype} of shape "
            f"{labels.shape}"
        )
    if n_examples and (labels.min() < -1 or labels.max() >= len(names)):
        raise ValueError(
            f"labels must lie in -1..{len(names) - 1}, got values in "
            f"[{labels.min()}, {labels.max()}]"
        )
    return np.array([names[y] if y >= 0 else "" for y in labels.tolist()], dtype=str)


# ----------------------------------------------------------------------------- inputs
def read_inputs(source: str, kind: str) -> list[str] | np.ndarray:
    """The inputs to predict, for a run whose data are of ``kind``.

    ``kind`` "tokens": a list of texts, from ``-`` (standard input) or a ``.txt`` file, one text
    per non-empty line, or from the ``text`` column of a ``.csv`` (comma-separated, quoted as
    usual), ``.tsv`` (split on tabs only, no quoting, as the project's data files),
    ``.jsonl`` or ``.jsonl.gz`` file (one JSON object per line); a table row with an empty text is
    an error. ``kind`` "image": the array ``x`` of an ``.npz`` file, (N, H, W) or (N, C, H, W),
    as float32 (scaled as the training images were).

    Raises ProbtransError naming the file (and the line) for a missing file, an unknown
    extension, a missing column, a malformed line or no inputs at all.
    """
    if kind == "tokens":
        texts = _read_texts(source)
        if not texts:
            raise ProbtransError(f"{_name(source)}: no texts to predict")
        return texts
    if kind == "image":
        return _read_images(source)
    raise ValueError(f"kind must be 'tokens' or 'image', got {kind!r}")


def _name(source: str) -> str:
    return "standard input" if source == "-" else source


def _suffix(path: Path) -> str:
    return ".jsonl.gz" if path.name.endswith(".jsonl.gz") else path.suffix.lower()


def _existing(source: str, formats: tuple[str, ...], what: str) -> Path:
    path = Path(source)
    if not path.is_file():
        raise ProbtransError(f"{path}: no such file")
    if _suffix(path) not in formats:
        raise ProbtransError(
            f"{path}: unknown extension {_suffix(path) or '(none)'!r}; {what} are read from "
            f"{', '.join(formats)}"
        )
    return path


def _read_texts(source: str) -> list[str]:
    if source == "-":
        try:
            lines = sys.stdin.read().splitlines()
        except UnicodeDecodeError as err:
            raise ProbtransError(f"standard input: not UTF-8 text ({err.reason})") from None
        return [line for line in lines if line.strip()]
    path = _existing(source, TEXT_FORMATS, "texts (or '-' for standard input)")
    suffix = _suffix(path)
    if suffix == ".txt":
        return [line for _, line in _lines(path) if line.strip()]
    if suffix in (".csv", ".tsv"):
        return _read_table(path, delimiter="," if suffix == ".csv" else "\t")
    return _read_json_lines(path)


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """The numbered lines of ``path`` (gunzipped if it ends in ``.gz``), without line ends."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            for number, raw in enumerate(fh, start=1):
                try:
                    yield number, raw.decode("utf-8").rstrip("\r\n")
                except UnicodeDecodeError as err:
                    raise ProbtransError(
                        f"{path}:{number}: not valid UTF-8 ({err.reason} at byte {err.start})"
                    ) from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:
        raise ProbtransError(
            f"{path}: not a readable gzip file ({str(err) or 'truncated'})"
        ) from None
    except OSError as err:
        raise ProbtransError(f"{path}: cannot be read ({err.strerror or err})") from None


def _checked_text(text: object, where: str) -> str:
    if not isinstance(text, str):
        raise ProbtransError(f"{where}: {TEXT_COLUMN!r} is a {type(text).__name__}, not a string")
    if not text.strip():
        raise ProbtransError(f"{where}: empty {TEXT_COLUMN!r}")
    return text


def _read_table(path: Path, delimiter: str) -> list[str]:
    quoting = csv.QUOTE_MINIMAL if delimiter == "," else csv.QUOTE_NONE
    texts = []
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh, delimiter=delimiter, quoting=quoting)
            header = next(reader, None)
            if header is None:
                raise ProbtransError(
                    f"{path}: empty file (no header with a {TEXT_COLUMN!r} column)"
                )
            if TEXT_COLUMN not in header:
                raise ProbtransError(
                    f"{path}:1: no {TEXT_COLUMN!r} column in the header (columns: "
                    f"{', '.join(map(repr, header))})"
                )
            column = header.index(TEXT_COLUMN)
            for row in reader:
                if not row:  # a blank line
                    continue
                where = f"{path}:{reader.line_num}"
                text = row[column] if column < len(row) else ""
                texts.append(_checked_text(text, where))
    except UnicodeDecodeError as err:
        raise ProbtransError(
            f"{path}: not valid UTF-8 ({err.reason} at byte {err.start})"
        ) from None
    except csv.Error as err:
        raise ProbtransError(f"{path}: not a readable table ({err})") from None
    return texts


def _read_json_lines(path: Path) -> list[str]:
    texts = []
    for number, line in _lines(path):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ProbtransError(f"{where}: not a JSON object ({err.msg})") from None
        if not isinstance(row, dict):
            raise ProbtransError(f"{where}: not a JSON object (a {type(row).__name__})")
        if TEXT_COLUMN not in row:
            raise ProbtransError(
                f"{where}: no {TEXT_COLUMN!r} key (keys: {', '.join(map(repr, row))})"
            )
        texts.append(_checked_text(row[TEXT_COLUMN], where))
    return texts


def _read_images(source: str) -> np.ndarray:
    if source == "-":
        raise ProbtransError(
            f"standard input: images are read from an {IMAGE_FORMATS[0]} file with an array "
            f"{IMAGE_ARRAY!r}"
        )
    path = _existing(source, IMAGE_FORMATS, f"images (an array {IMAGE_ARRAY!r})")
    arrays = read_npz(path)
    if IMAGE_ARRAY not in arrays:
        raise ProbtransError(
            f"{path}: no array {IMAGE_ARRAY!r} (arrays: {', '.join(map(repr, arrays)) or 'none'})"
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
    return x.astype(np.float32)


# ----------------------------------------------------------------------------- outputs
def write_predictions(columns: dict[str, np.ndarray], out: Path | None = None) -> Path | None:
    """Write ``columns`` to ``out`` by its extension — ``.csv``, ``.tsv`` (tab-separated) or
    ``.jsonl`` (one JSON object per row) — atomically, with full precision; returns ``out``.
    Without ``out``, print :func:`format_predictions` to standard output and return None."""
    rows = _rows(columns)
    if out is None:
        print(format_predictions(columns))
        return None
    out = Path(out)
    suffix = out.suffix.lower()
    if suffix not in OUTPUT_FORMATS:
        raise ProbtransError(
            f"{out}: unknown extension {suffix or '(none)'!r}; predictions are written as "
            f"{', '.join(OUTPUT_FORMATS)}"
        )
    names = list(columns)

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="", encoding="utf-8") as fh:
            if suffix == ".jsonl":
                for row in rows:
                    fh.write(json.dumps(dict(zip(names, row, strict=True))) + "\n")
                return
            writer = csv.writer(
                fh, delimiter="," if suffix == ".csv" else "\t", lineterminator="\n"
            )
            writer.writerow(names)
            writer.writerows(rows)

    try:
        return atomic_write(out, write)
    except OSError as err:
        raise ProbtransError(f"{out}: cannot be written ({err.strerror or err})") from None


def format_predictions(columns: dict[str, np.ndarray], max_rows: int = SHOWN_ROWS) -> str:
    """A text table of ``columns``: numbers with 4 decimals, right-aligned; at most the first
    ``max_rows`` rows, then a line saying how many more there are."""
    rows = _rows(columns)
    shown = [
        [f"{value:.4f}" if isinstance(value, float) else str(value) for value in row]
        for row in rows[:max_rows]
    ]
    numeric = [np.issubdtype(np.asarray(v).dtype, np.number) for v in columns.values()]
    table = [list(columns), *shown]
    widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
    lines = [
        "  ".join(
            cell.rjust(width) if right else cell.ljust(width)
            for cell, width, right in zip(row, widths, numeric, strict=True)
        ).rstrip()
        for row in table
    ]
    more = len(rows) - len(shown)
    if more:
        lines.append(f"… and {more} more row{'s' * (more > 1)} (of {len(rows)})")
    return "\n".join(lines)


def _rows(columns: dict[str, np.ndarray]) -> list[list]:
    """The rows of ``columns`` as Python values (float, int, str)."""
    if not columns:
        raise ValueError("no columns to write")
    arrays = {name: np.asarray(values) for name, values in columns.items()}
    lengths = {name: a.shape for name, a in arrays.items()}
    n = len(next(iter(arrays.values())))
    if any(a.ndim != 1 or len(a) != n for a in arrays.values()):
        raise ValueError(f"columns must be 1-D of one length, got shapes {lengths}")
    return [list(row) for row in zip(*(a.tolist() for a in arrays.values()), strict=True)]
