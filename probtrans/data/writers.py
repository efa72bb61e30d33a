"""The writers of a table given as its chunks of columns (:data:`Writer`): CSV and TSV
(:func:`write_delimited`), JSON Lines, Parquet (a row group per chunk). ``probtrans predict``
writes each chunk as it is predicted, so one chunk is in memory at a time.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

#: writes a table given as its chunks in order (each a dict of 1-D columns, the same names in
#: each), one chunk in memory at a time: ``probtrans predict`` writes each chunk as it is predicted
Writer = Callable[[Iterable[dict[str, np.ndarray]], Path], None]


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
