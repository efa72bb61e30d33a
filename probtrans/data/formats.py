"""The file formats: one table (:data:`FORMATS`) of :class:`Format` descriptors — name, suffixes,
what the rows hold, the reader and, for tables, the writer and the text streamer — that every
reader of probtrans (training files, out-of-domain sets, the built-in IMDB/CR/CoLA files,
``probtrans predict`` inputs), the prediction writer and the command's help use.

Built in: CSV and TSV (:mod:`~probtrans.data.delimited`), JSON Lines (``.jsonl``, gzipped
``.jsonl.gz``), Parquet, text lines (``.txt``, one text per line, no labels) and NPZ images
(:mod:`~probtrans.data.readers`); the writers are in :mod:`~probtrans.data.writers`.
:func:`register_format` adds one (a plugin's one registration call); an unknown suffix is an
error naming the known ones (:func:`format_of`). A reader returns
:class:`~probtrans.data.rows.Rows`, each row named in messages by ``where`` (``FILE:LINE``);
the texts and labels are checked by :mod:`probtrans.data.files` with the checks of
:mod:`~probtrans.data.rows`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from probtrans.data.delimited import delimited
from probtrans.data.readers import (
    read_json_lines,
    read_lines,
    read_npz_images,
    read_parquet,
    stream_json_lines,
    stream_lines,
    stream_parquet,
)
from probtrans.data.rows import Reader, TextStreamer
from probtrans.data.writers import Writer, write_delimited, write_json_lines, write_parquet
from probtrans.errors import ProbtransError
from probtrans.registry import Registry

Kind = Literal["text", "image"]


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
