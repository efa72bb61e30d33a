"""Rows of a user's data source — a local file, a saved folder or a Hugging Face hub dataset.

A source is written as a file path or as ``hf:ID[:CONFIG][@SPLIT]`` (:func:`parse_source`):

* a file of one of the formats of :mod:`probtrans.data.formats` (CSV, TSV, JSON Lines, Parquet,
  ``.txt`` lines of texts; ``.npz`` images), read by the format its suffix names;
* ``hf:ID``: a dataset of the Hugging Face hub, or — when ID is a local folder — a folder written
  by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``, or a folder of data files that
  ``datasets``' folder builders read (images in one subfolder per class; CSV, JSON Lines or
  Parquet files split by their names).

:func:`read_texts` and :func:`read_images` return :class:`~probtrans.data.rows.Rows`: the
texts or images, their raw labels (integers or strings, as the source holds them; the labels of a
CSV or TSV column are integers when every one is written as an integer), the class names of a
``ClassLabel`` feature, and ``where``, which names a row in messages (``FILE:LINE`` for text
files). Every row is checked here, whatever its format; a problem raises
:class:`~probtrans.errors.ProbtransError` in one line listing the first malformed rows as
``WHERE: problem``. :func:`read_inputs` reads the inputs of ``probtrans predict``.

Hub datasets are downloaded into the ``datasets`` cache (``HF_DATASETS_CACHE``), as
``datasets.load_dataset`` does, so they are fetched once; ``datasets``' progress bars and log
messages are silenced while a saved folder is read.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np

from probtrans.data.formats import Format, Kind, format_of, formats, suffixes
from probtrans.data.readers import (
    LABEL_ARRAY,
    check_finite,
    class_names,
    dataset_texts,
    quiet_datasets,
    read_lines,
)
from probtrans.data.rows import (
    ReadOptions,
    Rows,
    TextStreamer,
    checked_labels,
    label_to_read,
    listed,
    raise_problems,
    reason,
    require_column,
    row_index,
    texts_problem,
)
from probtrans.errors import ProbtransError
from probtrans.hub import is_offline
from probtrans.storage.io import check_is_file

__all__ = [
    "HF_PREFIX",
    "Rows",
    "Source",
    "check_data_file",
    "parse_source",
    "read_images",
    "read_inputs",
    "read_texts",
]

#: how a source names a Hugging Face dataset (or a folder written by ``save_to_disk``)
HF_PREFIX = "hf:"
STDIN = "-"  # read_inputs: texts from standard input
_WHAT = {"text": "texts", "image": "images"}


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


# ----------------------------------------------------------------------------- local files
def check_data_file(path: str | os.PathLike[str]) -> Path:
    """``path`` if it is a file; else one error saying it is missing, or that it is a folder
    (a folder written by save_to_disk is read as ``hf:PATH``)."""
    path = Path(path)
    if path.is_dir():
        raise ProbtransError(
            f"{path}: is a folder, not a file (a folder written by save_to_disk is read as "
            f"{HF_PREFIX}{path})"
        )
    return check_is_file(path)


def _file_format(path: Path, kind: Kind, labels: bool | None) -> Format:
    """The format of ``path``, an existing file holding ``kind`` rows (with labels if
    ``labels`` is True)."""
    check_data_file(path)
    hint = f" or a Hugging Face dataset ({HF_PREFIX}ID)"
    return format_of(path, kind, _WHAT[kind], labels, hint)


def _checked(rows: Rows, options: ReadOptions, column: str | None) -> Rows:
    """``rows`` with their labels checked (``column`` names them) and, for texts, their texts;
    a problem raises ProbtransError listing the first malformed rows."""
    problems: list[tuple[int, str]] = []
    if not isinstance(rows.values, np.ndarray):  # texts
        problems = [
            (row, problem)
            for row, text in enumerate(rows.values)
            if (problem := texts_problem(text, options))
        ]
    if rows.labels is not None:
        rows.labels, label_problems = checked_labels(
            rows.labels, column or "", options.classes, options.declared
        )
        problems = sorted(problems + label_problems, key=lambda problem: problem[0])
    raise_problems(problems, rows.where)
    return rows


# ----------------------------------------------------------------------------- Hugging Face
def check_hub_reachable(hub_id: str, name: str) -> None:
    """Fail at once, rather than after ``datasets``' retries (about 25 s), when the hub cannot
    be reached or has no such data set: one request (none under ``HF_HUB_OFFLINE`` or
    ``HF_DATASETS_OFFLINE``, where ``datasets`` reads its cache without retrying)."""
    if is_offline("HF_DATASETS_OFFLINE"):
        return
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    try:
        HfApi().dataset_info(hub_id, timeout=10)
    except RepositoryNotFoundError:
        raise ProbtransError(f"{name}: no such data set on the Hugging Face hub") from None
    except HfHubHTTPError:
        return  # reachable; datasets says what is wrong (gated, private...)
    except Exception as err:  # no network: a connection error of the HTTP client
        raise ProbtransError(
            f"{name}: the Hugging Face hub cannot be reached ({reason(err)}); it needs a "
            f"network, or HF_HUB_OFFLINE=1 to read a copy in the local cache, or give a local "
            f"file or a folder written by save_to_disk"
        ) from None


#: the files by which ``datasets`` knows a folder written by ``save_to_disk``
SAVED_MARKERS = ("dataset_dict.json", "state.json")


def _is_saved(folder: Path) -> bool:
    """Whether ``folder`` was written by ``save_to_disk`` (a Dataset or a DatasetDict)."""
    return any((folder / name).is_file() for name in SAVED_MARKERS)


def _saved_folder(folder: Path) -> datasets.Dataset | datasets.DatasetDict:
    try:
        with quiet_datasets():
            return datasets.load_from_disk(str(folder))
    except Exception as err:
        raise ProbtransError(
            f"{folder}: not a folder written by save_to_disk ({reason(err)})"
        ) from None


def _files_folder(folder: Path) -> datasets.DatasetDict:
    """A folder of data files read by ``datasets``' folder builders: images in one subfolder
    per class (``imagefolder``: an ``image`` column and a ``label`` column named by the
    subfolders), or CSV, JSON Lines or Parquet files, split by their names (train, validation,
    test) as ``datasets.load_dataset(FOLDER)`` splits them."""
    try:
        with quiet_datasets():
            return datasets.load_dataset(str(folder))
    except Exception as err:
        raise ProbtransError(
            f"{folder}: neither a folder written by save_to_disk nor a folder of data "
            f"files (images in one subfolder per class, CSV, JSON Lines, Parquet) that datasets "
            f"reads ({reason(err)})"
        ) from None


def _hf_dataset(source: Source, split: str) -> tuple[datasets.Dataset, str]:
    """The split of a saved folder or hub dataset, and how messages name it."""
    split = source.split or split
    if source.path is not None:
        if _is_saved(source.path):
            loaded = _saved_folder(source.path)
        else:  # files whose names name no split are all datasets' "train", whatever is read
            loaded = _files_folder(source.path)
            if source.split is None and len(loaded) == 1:
                (only,) = loaded.values()
                return only, str(source.path)
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise ProbtransError(
                    f"{source.path}: no split {split!r} (splits: {listed(loaded)})"
                )
            return loaded[split], f"{source.path}@{split}"
        if source.split is not None:
            raise ProbtransError(
                f"{source}: the folder holds one Dataset, not splits; drop '@{source.split}'"
            )
        return loaded, str(source.path)
    name = str(Source(source.text, None, source.hub_id, source.config, split))
    check_hub_reachable(source.hub_id, name)
    try:
        dataset = datasets.load_dataset(source.hub_id, source.config, split=split)
    except Exception as err:  # offline, unknown id, unknown split...
        raise ProbtransError(
            f"{name}: the Hugging Face dataset cannot be loaded ({reason(err)}); give a local "
            f"file or a folder written by save_to_disk instead"
        ) from None
    return dataset, name


# ----------------------------------------------------------------------------- texts
def read_texts(
    source: Source,
    *,
    text_column: str = "text",
    text_pair_column: str | None = None,
    label_column: str | None = "label",
    split: str = "train",
    labels: bool | None = True,
    classes: int | None = None,
    header: tuple[str, ...] | None = None,
    declared: Sequence[Any] = (),
) -> Rows:
    """The texts of ``source`` (a file, a saved folder or a hub dataset) and their labels;
    with ``text_pair_column``, each row's pair of texts (``text_column``'s, that column's).

    ``split`` is the split read from a folder or hub dataset when ``source`` names none.
    ``labels``: True, the ``label_column`` is required; None, read when present; False (or no
    ``label_column``), not read. ``classes``: labels must be integers 0..classes−1.
    ``header``: the column names of a header-less CSV/TSV file. ``declared``: the classes
    ``data.labels`` lists (a declared "NaN" is a label, else a missing value). Raises
    ProbtransError naming the source for a missing file, an unknown extension, a missing
    column, a file without rows, a file that cannot be parsed (``FILE:LINE: problem``) and rows
    with a missing, non-string or empty text or a missing or invalid label (the first rows,
    ``WHERE: problem``).
    """
    options = ReadOptions(
        text_column=text_column,
        pair_column=text_pair_column,
        label_column=label_column,
        labels=labels,
        classes=classes,
        header=header,
        declared=tuple(declared),
    )
    if source.path is not None and not _is_folder(source):
        rows = _file_format(source.path, "text", labels).read(source.path, options)
    else:
        dataset, name = _hf_dataset(source, split)
        rows = dataset_texts(dataset, name, options, row_index(name))
    return _checked(rows, options, label_column)


def input_text_chunks(
    text: str, rows: int, *, text_column: str = "text", text_pair_column: str | None = None
) -> Iterator[list[str]] | Iterator[list[tuple[str, str]]] | None:
    """The texts of the ``probtrans predict`` input ``text``, at most ``rows`` at a time, each
    checked as :func:`read_inputs` checks them and read as it is asked for, so that a file of any
    size takes the memory of one chunk; iterate it twice to check every row before using any (pairs
    of texts with ``text_pair_column``). None for an input that is read whole: standard input, a
    Hugging Face dataset or folder, a format without a streamer
    (:attr:`~probtrans.data.formats.Format.stream`). A file with a problem is read whole where it is
    found, for :func:`read_inputs`' own message (a ProbtransError naming the file and line)."""
    if text.strip() == STDIN:
        return None
    source = parse_source(text)
    if source.path is None or _is_folder(source):
        return None
    fmt = _file_format(source.path, "text", None)
    if fmt.stream is None:
        return None
    options = ReadOptions(text_column=text_column, pair_column=text_pair_column)
    return _checked_chunks(source, fmt.stream, options, rows)


def _checked_chunks(
    source: Source, stream: TextStreamer, options: ReadOptions, rows: int
) -> Iterator[list[Any]]:
    """:func:`input_text_chunks` of a file of a format with a streamer."""
    assert source.path is not None
    read = 0
    try:
        for texts in stream(source.path, options, rows):
            if any(texts_problem(text, options) for text in texts):
                raise ValueError(f"a malformed text after row {read}")
            yield texts
            read += len(texts)
        if read == 0:
            raise ValueError("no rows")
    except Exception as err:  # the problem in the reader's words, from the whole file
        read_texts(
            source,
            text_column=options.text_column,
            text_pair_column=options.pair_column,
            label_column=None,
            labels=False,
        )
        raise ProbtransError(f"{source.path}: cannot be read ({reason(err)})") from None


# ----------------------------------------------------------------------------- images
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
    raise_problems(problems, where)
    return np.stack(images)


def read_images(
    source: Source,
    *,
    image_column: str = "image",
    label_column: str | None = "label",
    split: str = "train",
    labels: bool | None = True,
    declared: Sequence[Any] = (),
) -> Rows:
    """The images of ``source`` (N, C, H, W), in the source's dtype, and their labels.

    An ``.npz`` file holds the images in the array ``x`` ((N, H, W) is one channel) and the
    labels in ``y``; a saved folder or hub dataset holds them in ``image_column`` (PIL images
    or arrays (H, W) or (H, W, C), all of one shape) and ``label_column``. ``split``,
    ``labels`` and ``declared`` as for :func:`read_texts`. Raises ProbtransError naming the
    source (and the array or row) for a missing file, an unknown extension, a missing array or
    column, arrays of the wrong shape or dtype, NaN values, images of different shapes and
    missing labels.
    """
    options = ReadOptions(
        image_column=image_column,
        label_column=label_column,
        labels=labels,
        declared=tuple(declared),
    )
    if source.path is not None and not _is_folder(source):
        rows = _file_format(source.path, "image", labels).read(source.path, options)
        return _checked(rows, options, LABEL_ARRAY)
    dataset, name = _hf_dataset(source, split)
    require_column(name, dataset.column_names, image_column, "image")
    label = label_to_read(name, dataset.column_names, options)
    if len(dataset) == 0:
        raise ProbtransError(f"{name}: no rows")
    where = row_index(name)
    images = _hf_images(dataset, image_column, where)
    check_finite(images, f"{name}: column {image_column!r}", "row")
    values = list(dataset[label]) if label else None
    return _checked(Rows(images, values, class_names(dataset, label), where), options, label)


# ----------------------------------------------------------------------------- predict inputs
def read_inputs(
    text: str,
    kind: str,
    *,
    text_column: str = "text",
    text_pair_column: str | None = None,
    image_column: str = "image",
    label_column: str | None = "label",
    declared: Sequence[Any] = (),
) -> Rows:
    """The inputs of ``probtrans predict``, of ``kind`` "text" or "image", with their labels
    when the source has a label column (``declared``: the run's ``data.labels``, see
    :func:`read_texts`; ``text_pair_column``: texts read as pairs).

    ``text``: ``-`` (texts only) reads standard input, one text per line; anything else is a
    source (:func:`parse_source`, relative to the working directory) read by :func:`read_texts`
    (a ``.txt`` file: one text per line, blank lines only at the end) or :func:`read_images`
    with the split "test" unless the source names one. Raises ProbtransError naming the source
    (and the line) for a problem; ValueError for an unknown ``kind``.
    """
    if kind not in ("text", "image"):
        raise ValueError(f"kind must be 'text' or 'image', got {kind!r}")
    if kind == "image":
        if text.strip() == STDIN:
            raise ProbtransError(
                f"standard input: images are read from {suffixes(formats('image'))} files "
                f"or a Hugging Face dataset ({HF_PREFIX}ID)"
            )
        return read_images(
            parse_source(text),
            image_column=image_column,
            label_column=label_column,
            split="test",
            labels=None,
            declared=declared,
        )
    if text.strip() == STDIN:
        return read_lines(None, ReadOptions(text_column=text_column, pair_column=text_pair_column))
    source = parse_source(text)
    return read_texts(
        source,
        text_column=text_column,
        text_pair_column=text_pair_column,
        label_column=label_column,
        split="test",
        labels=None,
        declared=declared,
    )
