"""Labelled text for sentiment (IMDB, with CR as out-of-domain; CR) and acceptability (CoLA).

Rows come from local files under the folder named by the environment variable
``PROBTRANS_DATA_DIR`` (layout of the project's staged copies: ``imdb/{train,test}.jsonl.gz``,
``cr/tsv/{train,dev,test}.tsv``, ``cola/raw/*.tsv``) and, when a file is not there, from the
Hugging Face hub (:data:`HUB_SOURCES`). Every row is checked: a missing or unknown label, an
empty text or bytes that are not UTF-8 raise :class:`~probtrans.errors.ProbtransError` naming
``file:line``, in one line; so does a file that cannot be read or decompressed.

The split protocols (``data.protocol``) reproduce the two papers, seeded by ``data.split_seed``:

* ``h_sto`` — Pei et al., "Transformer Uncertainty Estimation with Hierarchical Stochastic
  Attention", AAAI 2022. IMDB: the original 25,000 training reviews are shuffled and split 90/10
  into train / validation (22,500 / 2,500), the original 25,000 test reviews are the in-domain test
  set, and the 500 CR test sentences are out of domain (Table 1). CoLA: in-domain train + dev
  (9,078 sentences) shuffled and split 7:1:2 into train / validation / test, validation and test
  sizes rounded to the nearest integer (6,354 / 908 / 1,816); the 516 out-of-domain dev sentences
  are out of domain (Table 2). CR (Hu & Liu 2004, product-review sentiment, not a task of the
  papers: the second task on which a comparison tuned on CoLA is checked): its train, dev and
  test files (2,775 + 500 + 500 sentences) pooled and cut 7:1:2 as CoLA (2,642 / 378 / 755), the
  CoLA out-of-domain dev sentences (no sentiment) out of domain.
* ``sgpa`` — Chen & Li, "Calibrating Transformers via Sparse Gaussian Processes", ICLR 2023.
  CoLA: in-domain train + dev pooled and shuffled, ``ceil(0.7 N)`` train, the rest of the first
  ``floor(0.8 N)`` validation, the last 20% test (6,355 / 907 / 1,816), out-of-domain dev as OOD.
  IMDB: all 50,000 labelled reviews pooled and shuffled, 35,000 / 5,000 / 10,000; the SGPA paper
  has no IMDB out-of-domain set, so the CR test sentences serve here as for ``h_sto``. CR is cut
  as CoLA.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from datasets import Dataset, concatenate_datasets

from probtrans.data.files import parse_source, read_texts
from probtrans.data.rows import checked_labels, raise_problems, text_problem
from probtrans.errors import ProbtransError

DATA_DIR_ENV = "PROBTRANS_DATA_DIR"
CLASSES = 2  # both tasks are binary: labels 0 and 1
#: the columns of CoLA's header-less TSV files (source, acceptability, original mark, sentence)
COLA_COLUMNS = ("source", "label", "mark", "sentence")


@dataclass(frozen=True)
class Source:
    """Where one table of rows lives: a local file (relative to the data folder) with its text
    column (and, for a header-less TSV file, its column names), and the Hugging Face hub dataset
    split (and rows of it) used when the local file is absent; the labels are ``label``."""

    local: str
    text_column: str
    header: tuple[str, ...] | None
    hub: tuple[str, str | None, str]  # dataset id, configuration, split
    hub_rows: tuple[int, int] | None = None  # [start, stop) rows of the hub split


# The one table of sources. CoLA's hub copy (GLUE) holds in-domain dev followed by
# out-of-domain dev in one 1,043-row "validation" split, hence the row ranges. The hub copy of CR
# (SentEval) is not the 500-sentence Hendrycks test split that H-STO used, and has no dev split:
# its train and test splits make the CR pool.
HUB_SOURCES: dict[str, Source] = {
    "imdb/train": Source("imdb/train.jsonl.gz", "text", None, ("stanfordnlp/imdb", None, "train")),
    "imdb/test": Source("imdb/test.jsonl.gz", "text", None, ("stanfordnlp/imdb", None, "test")),
    "cr/train": Source("cr/tsv/train.tsv", "text", None, ("SetFit/SentEval-CR", None, "train")),
    "cr/dev": Source("cr/tsv/dev.tsv", "text", None, ("SetFit/SentEval-CR", None, "test"), (0, 0)),
    "cr/test": Source("cr/tsv/test.tsv", "text", None, ("SetFit/SentEval-CR", None, "test")),
    "cola/in_domain_train": Source(
        "cola/raw/in_domain_train.tsv", "sentence", COLA_COLUMNS, ("nyu-mll/glue", "cola", "train")
    ),
    "cola/in_domain_dev": Source(
        "cola/raw/in_domain_dev.tsv",
        "sentence",
        COLA_COLUMNS,
        ("nyu-mll/glue", "cola", "validation"),
        (0, 527),
    ),
    "cola/out_of_domain_dev": Source(
        "cola/raw/out_of_domain_dev.tsv",
        "sentence",
        COLA_COLUMNS,
        ("nyu-mll/glue", "cola", "validation"),
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


# The sources each data set reads: its labelled pools, then its out-of-domain set.
TASK_SOURCES: dict[str, list[str]] = {
    "imdb": ["imdb/train", "imdb/test", "cr/test"],
    "cola": ["cola/in_domain_train", "cola/in_domain_dev", "cola/out_of_domain_dev"],
    "cr": ["cr/train", "cr/dev", "cr/test", "cola/out_of_domain_dev"],
}
CLASS_NAMES = {
    "imdb": ["negative", "positive"],
    "cola": ["unacceptable", "acceptable"],
    "cr": ["negative", "positive"],
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
def _from_hub(key: str) -> Dataset:
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
    texts = table[source.text_column]
    labels, problems = checked_labels(table["label"], "label", CLASSES)
    problems += [(i, p) for i, text in enumerate(texts) if (p := text_problem(text, "text"))]
    raise_problems(sorted(problems), lambda i: f"{name}:{rows[i] + 1}")
    return Dataset.from_dict({"text": texts, "label": labels})


def read_source(key: str) -> Dataset:
    """Rows ``text``, ``label`` of source ``key`` of :data:`HUB_SOURCES`: the local file (read
    by its format, :mod:`probtrans.data.formats`) if present, else the hub."""
    path = local_path(key)
    if path is None:
        return _from_hub(key)
    source = HUB_SOURCES[key]
    rows = read_texts(
        parse_source(str(path)),
        text_column=source.text_column,
        classes=CLASSES,
        header=source.header,
    )
    return Dataset.from_dict({"text": list(rows.values), "label": rows.labels})


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
    """Read the rows of ``name`` (a key of :data:`TASK_SOURCES`) and split them under
    ``protocol``."""
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
            class_names=CLASS_NAMES[name],
            normalise_html=True,
        )
    *in_domain, ood = TASK_SOURCES[name]
    pool = concatenate_datasets([read_source(key) for key in in_domain])
    tr, va, te = split_indices(name, protocol, seed, len(pool))
    return TextTask(
        name=name,
        train=pool.select(tr),
        val=pool.select(va),
        test=pool.select(te),
        ood=read_source(ood),
        class_names=CLASS_NAMES[name],
        normalise_html=False,
    )
