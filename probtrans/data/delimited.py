"""CSV and TSV: the reader and text streamer of a table of fields split on a delimiter
(:func:`delimited`). CSV is quoted as usual; TSV is split on tabs only (a quote is an ordinary
character). A header-less file is read with :attr:`~probtrans.data.rows.ReadOptions.header`.
Fields are strings as written (no type guessing); a file ``datasets`` cannot parse is read again
by the csv module to name its bad lines, and so is one it parses but the csv module refuses in
strict mode (a quote left open, which pandas silently runs on into the following lines).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from probtrans.data.readers import (
    LineStarts,
    decoded,
    load_table,
    numbered_lines,
    row_problems,
    rows_of,
    streamed_texts,
    unreadable,
)
from probtrans.data.rows import (
    INTEGER,
    Reader,
    ReadOptions,
    Rows,
    TextStreamer,
    label_to_read,
    raise_problems,
    require_column,
)
from probtrans.errors import ProbtransError


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
    if written and all(INTEGER.fullmatch(v) for v in written):
        return [int(v) if isinstance(v, str) and v.strip() else v for v in values]
    return values


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
        for column in (*options.text_columns, options.label_column):
            places = [str(i + 1) for i, name in enumerate(header) if name == column]
            if column and len(places) > 1:  # which one is read would be a guess
                raise ProbtransError(
                    f"{path}: the header names {column!r} in columns {', '.join(places)}; "
                    f"give each column its own name"
                )
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
        lines, problems = decoded(raw)
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
                        problems.extend((start, p) for p in row_problems(row, options, label))
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
        reader = csv.reader(decoded(raw)[0], strict=True, **dialect)
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

        where = LineStarts(path, 0, lambda lines: starts(lines, options))
        try:
            header = header_of(path, options)
            for column in options.text_columns:
                require_column(str(path), header, column, "text")
            label = label_to_read(str(path), header, options)
            columns = [*options.text_columns] + ([label] if label else [])
            strings = {column: datasets.Value("string") for column in columns}
            names = {"column_names": header} if options.header is not None else {}
            dataset = load_table(  # "NA", "null"... are texts; an empty field is ""
                path,
                "csv",
                features=datasets.Features(strings),
                na_filter=False,
                **names,
                **dialect,
            )
            where.n_rows = len(dataset)
            rows = rows_of(dataset, str(path), options, label, where)
        except ProbtransError:
            raise
        except Exception as err:  # a file datasets cannot parse (or decode): find the bad lines
            read_label = options.label_column if options.read_labels else None
            unreadable(path, *by_hand(path, options, read_label), err)
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
        strings = {column: datasets.Value("string") for column in options.text_columns}
        yield from streamed_texts(
            path,
            "csv",
            options.text_columns,
            rows,
            features=datasets.Features(strings),
            na_filter=False,
            **names,
            **dialect,
        )

    return read, stream
