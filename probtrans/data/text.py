"""Labelled text for sentiment (IMDB, with CR as out-of-domain) and acceptability (CoLA).

Rows come from local files under the folder named by the environment variable
``PROBTRANS_DATA_DIR`` (layout of the project's staged copies: ``imdb/{train,test}.jsonl.gz``,
``cr/tsv/test.tsv``, ``cola/raw/*.tsv``) and, when a file is not there, from the Hugging Face hub
(:data:`HUB_SOURCES`). Every row is checked: a missing or unknown label, an empty text or bytes
that are not UTF-8 raise :class:`~probtrans.errors.ProbtransError` naming ``file:line``, in one
line; so does a file that cannot be read or decompressed.

The split protocols (``data.protocol``) reproduce the two papers, seeded by ``data.split_seed``:

* ``h_sto`` — Pei et al., "Transformer Uncertainty Estimation with Hierarchical Stochastic
  Attention", AAAI 2022. IMDB: the original 25,000 training reviews are shuffled and split 90/10
  into train / validation (22,500 / 2,500), the original 25,000 test reviews are the in-domain test
  set, and the 500 CR test sentences are out of domain (Table 1). CoLA: in-domain train + dev
  (9,078 sentences) shuffled and split 7:1:2 into train / validation / test, validation and test
  sizes rounded to the nearest integer (6,354 / 908 / 1,816); the 516 out-of-domain dev sentences
  are out of domain (Table 2).
* ``sgpa`` — Chen & Li, "Calibrating Transformers via Sparse Gaussian Processes", ICLR 2023.
  CoLA: in-domain train + dev pooled and shuffled, ``ceil(0.7 N)`` train, the rest of the first
  ``floor(0.8 N)`` validation, the last 20% test (6,355 / 907 / 1,816), out-of-domain dev as OOD.
  IMDB: all 50,000 labelled reviews pooled and shuffled, 35,000 / 5,000 / 10,000; the SGPA paper
  has no IMDB out-of-domain set, so the CR test sentences serve here as for ``h_sto``.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from datasets import Dataset, concatenate_datasets

from probtrans.errors import ProbtransError

DATA_DIR_ENV = "PROBTRANS_DATA_DIR"
MAX_REPORTED = 5  # malformed rows listed in one error message


@dataclass(frozen=True)
class Source:
    """Where one table of rows lives: a local file (relative to the data folder) with its text
    and label columns (JSON keys, or TSV column numbers unless ``header``), and the Hugging Face
    hub dataset split (and rows of it) used when the local file is absent."""

    local: str
    text_column: str | int
    label_column: str | int
    header: bool
    hub: tuple[str, str | None, str]  # dataset id, configuration, split
    hub_text: str = "text"
    hub_rows: tuple[int, int] | None = None  # [start, stop) rows of the hub split


# The one table of sources. CoLA's hub copy (GLUE) holds in-domain dev followed by
# out-of-domain dev in one 1,043-row "validation" split, hence the row ranges. The hub copy of CR
# (SentEval) is not the 500-sentence Hendrycks test split that H-STO used.
HUB_SOURCES: dict[str, Source] = {
    "imdb/train": Source(
        "imdb/train.jsonl.gz", "text", "label", False, ("stanfordnlp/imdb", None, "train")
    ),
    "imdb/test": Source(
        "imdb/test.jsonl.gz", "text", "label", False, ("stanfordnlp/imdb", None, "test")
    ),
    "cr/test": Source(
        "cr/tsv/test.tsv", "text", "label", True, ("SetFit/SentEval-CR", None, "test")
    ),
    "cola/in_domain_train": Source(
        "cola/raw/in_domain_train.tsv", 3, 1, False, ("nyu-mll/glue", "cola", "train"), "sentence"
    ),
    "cola/in_domain_dev": Source(
        "cola/raw/in_domain_dev.tsv",
        3,
        1,
        False,
        ("nyu-mll/glue", "cola", "validation"),
        "sentence",
        (0, 527),
    ),
    "cola/out_of_domain_dev": Source(
        "cola/raw/out_of_domain_dev.tsv",
        3,
        1,
        False,
        ("nyu-mll/glue", "cola", "validation"),
        "sentence",
        (527, 1043),
    ),
}


def data_dir() -> Path | None:
    """The local data folder from ``$PROBTRANS_DATA_DIR``, or None when unset."""
    value = os.environ.get(DATA_DIR_ENV)
    return Path(value) if value else None


def local_path(key: str) -> Path | None:
    """The local file of source ``key`` if it exists under the data folder."""
    root = data_dir()
    if root is None:
        return None
    path = root / HUB_SOURCES[key].local
    return path if path.is_file() else None


# The sources each data set reads (train and test pools, then out-of-domain).
TASK_SOURCES: dict[str, list[str]] = {
    "imdb": ["imdb/train", "imdb/test", "cr/test"],
    "cola": ["cola/in_domain_train", "cola/in_domain_dev", "cola/out_of_domain_dev"],
}


def source_description(key: str) -> str:
    """The local file read for source ``key``, or the hub dataset if there is none."""
    path = local_path(key)
    return str(path) if path else f"hub {'/'.join(p or 'default' for p in HUB_SOURCES[key].hub)}"


def source_fingerprint(key: str) -> str:
    """What identifies a source's content for caching: the local file's size and mtime, or the
    hub dataset id."""
    path = local_path(key)
    if path is None:
        source = HUB_SOURCES[key]
        return f"hub:{source.hub}:{source.hub_rows}"
    stat = path.stat()
    return f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"


# ----------------------------------------------------------------------------- reading rows
def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """The numbered lines of ``path`` (gunzipped if it ends in ``.gz``); a file that cannot be
    read or decompressed raises ProbtransError naming it."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            for number, raw in enumerate(fh, start=1):
                yield number, raw.rstrip(b"\r\n")
    except gzip.BadGzipFile:
        raise ProbtransError(f"{path}: not a gzip file") from None
    except EOFError:
        raise ProbtransError(f"{path}: truncated (the gzip stream ends early)") from None
    except zlib.error as err:
        raise ProbtransError(f"{path}: corrupt gzip data ({err})") from None
    except OSError as err:
        raise ProbtransError(f"{path}: cannot be read ({err.strerror or err})") from None


def _check_label(value: object, classes: int) -> str | None:
    """Why ``value`` is not a label in 0..classes-1, or None if it is one."""
    if value is None or value == "":
        return "missing label"
    if isinstance(value, bool):
        return f"label {value!r} is not an integer"
    try:
        label = int(value) if isinstance(value, int | str) else None
    except ValueError:
        label = None
    if label is None:
        return f"label {value!r} is not an integer"
    if not 0 <= label < classes:
        return f"label {label} is outside the classes 0..{classes - 1}"
    return None


def _raise_problems(problems: list[str]) -> None:
    """One error line listing the first malformed rows (``file:line: problem``), if any."""
    if problems:
        more = len(problems) - MAX_REPORTED
        tail = f" (and {more} more malformed rows)" if more > 0 else ""
        raise ProbtransError("; ".join(problems[:MAX_REPORTED]) + tail)


def read_labelled_file(
    path: str | Path,
    text_column: str | int = "text",
    label_column: str | int = "label",
    header: bool | None = None,
    classes: int = 2,
) -> Dataset:
    """Rows ``text``, ``label`` of a JSON Lines file (``.jsonl``, ``.jsonl.gz``: keys
    ``text_column``, ``label_column``) or a tab-separated file (anything else: column numbers,
    or names when ``header`` is true; by default a TSV has a ``text<TAB>label`` header).

    TSV fields are split on tabs only (no quoting). Raises ProbtransError listing the first
    malformed rows as ``file:line: problem``.
    """
    path = Path(path)
    jsonl = path.name.endswith((".jsonl", ".jsonl.gz"))
    texts: list[str] = []
    labels: list[int] = []
    problems: list[str] = []
    columns: dict[str, int] = {}
    if not jsonl and header is None:
        header = True
    for number, raw in _lines(path):
        where = f"{path}:{number}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            problems.append(f"{where}: not valid UTF-8 ({err.reason} at byte {err.start})")
            continue
        if jsonl:
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                problems.append(f"{where}: not a JSON object ({err.msg})")
                continue
            if not isinstance(row, dict):
                problems.append(f"{where}: not a JSON object")
                continue
            text, label = row.get(text_column), row.get(label_column)
        else:
            fields = next(csv.reader([line], delimiter="\t", quoting=csv.QUOTE_NONE), [])
            if header and number == 1:
                columns = {name: i for i, name in enumerate(fields)}
                missing = [c for c in (text_column, label_column) if c not in columns]
                if missing:
                    raise ProbtransError(f"{where}: header {fields} lacks column(s) {missing}")
                continue
            t = columns[text_column] if header else int(text_column)
            lab = columns[label_column] if header else int(label_column)
            text = fields[t] if t < len(fields) else None
            label = fields[lab] if lab < len(fields) else None
        if not isinstance(text, str) or not text.strip():
            problems.append(f"{where}: empty or missing text")
            continue
        reason = _check_label(label, classes)
        if reason:
            problems.append(f"{where}: {reason}")
            continue
        texts.append(text)
        labels.append(int(label))
    _raise_problems(problems)
    if not texts:
        raise ProbtransError(f"{path}: no rows")
    return Dataset.from_dict({"text": texts, "label": labels})


def _from_hub(key: str, classes: int) -> Dataset:
    import datasets

    source = HUB_SOURCES[key]
    hub_id, config, split = source.hub
    name = f"{hub_id}/{config or 'default'}/{split}"
    try:
        table = datasets.load_dataset(hub_id, config, split=split)
    except Exception as err:  # offline, unknown id, ...: say where a local copy would go
        reason = (str(err).strip().splitlines() or [""])[0]  # one line
        raise ProbtransError(
            f"{key}: no local file {source.local!r} under ${DATA_DIR_ENV}, and the hub dataset "
            f"{name} could not be loaded ({type(err).__name__}: {reason})"
        ) from None
    rows = range(*source.hub_rows) if source.hub_rows else range(len(table))
    table = table.select(rows)
    texts, labels = table[source.hub_text], table["label"]
    problems = []
    for row, text, label in zip(rows, texts, labels, strict=True):
        reason = None if (text or "").strip() else "empty or missing text"
        reason = reason or _check_label(label, classes)
        if reason:
            problems.append(f"{name}:{row + 1}: {reason}")
    _raise_problems(problems)
    return Dataset.from_dict({"text": texts, "label": [int(v) for v in labels]})


def read_source(key: str, classes: int = 2) -> Dataset:
    """Rows of source ``key`` of :data:`HUB_SOURCES`: the local file if present, else the hub."""
    path = local_path(key)
    if path is None:
        return _from_hub(key, classes)
    source = HUB_SOURCES[key]
    return read_labelled_file(path, source.text_column, source.label_column, source.header, classes)


# --------------------------------------------------------------------------------- protocols
@dataclass
class TextTask:
    """A data set's rows before tokenisation: four splits of (text, label) rows."""

    name: str
    train: Dataset
    val: Dataset
    test: Dataset
    ood: Dataset
    class_names: list[str]
    normalise_html: bool  # IMDB reviews carry "<br />" line breaks


def shuffled_split(n: int, sizes: tuple[int, int, int], seed: int) -> tuple[np.ndarray, ...]:
    """Shuffle ``range(n)`` with ``seed`` and cut it into consecutive pieces of ``sizes``
    (train, validation, test); their sum must be ``n``."""
    if sum(sizes) != n:
        raise ValueError(f"split sizes {sizes} do not add up to {n}")
    order = np.random.default_rng(seed).permutation(n)
    cuts = np.cumsum(sizes)[:-1]
    return tuple(np.split(order, cuts))


def split_sizes(name: str, protocol: str, n: int) -> tuple[int, int, int]:
    """(train, validation, test) sizes of the shuffled pool of ``n`` rows (see the module
    docstring). For IMDB under ``h_sto`` the pool is the original training set only."""
    if name == "imdb" and protocol == "h_sto":
        val = round(0.1 * n)
        return n - val, val, 0
    if name == "imdb":
        return n - 15_000, 5_000, 10_000
    if protocol == "h_sto":
        val, test = round(0.1 * n), round(0.2 * n)
        return n - val - test, val, test
    train, train_and_val = math.ceil(0.7 * n), math.floor(0.8 * n)
    return train, train_and_val - train, n - train_and_val


def split_indices(name: str, protocol: str, seed: int, n_pool: int) -> tuple[np.ndarray, ...]:
    """Row indices (train, validation, test) into the pool of ``name`` under ``protocol``; for
    IMDB ``h_sto`` test is empty (it is the original test set)."""
    return shuffled_split(n_pool, split_sizes(name, protocol, n_pool), seed)


def load_text_task(name: str, protocol: str, seed: int) -> TextTask:
    """Read the rows of ``name`` ("imdb" or "cola") and split them under ``protocol``."""
    if name == "imdb":
        train, test = read_source("imdb/train"), read_source("imdb/test")
        pool = train if protocol == "h_sto" else concatenate_datasets([train, test])
        tr, va, te = split_indices(name, protocol, seed, len(pool))
        return TextTask(
            name=name,
            train=pool.select(tr),
            val=pool.select(va),
            test=test if protocol == "h_sto" else pool.select(te),
            ood=read_source("cr/test"),
            class_names=["negative", "positive"],
            normalise_html=True,
        )
    in_domain = [read_source("cola/in_domain_train"), read_source("cola/in_domain_dev")]
    pool = concatenate_datasets(in_domain)
    tr, va, te = split_indices(name, protocol, seed, len(pool))
    return TextTask(
        name=name,
        train=pool.select(tr),
        val=pool.select(va),
        test=pool.select(te),
        ood=read_source("cola/out_of_domain_dev"),
        class_names=["unacceptable", "acceptable"],
        normalise_html=False,
    )
