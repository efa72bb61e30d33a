"""Predictions on new inputs: one row of columns per input, and the files they are written to.

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
* the feature-space scores where the run has them (``mahalanobis``, ``relative_mahalanobis``,
  ``feature_density``, ``knn``; :mod:`probtrans.analysis.feature_scores`), each followed by its
  percentile among the validation split's (``mahalanobis_percentile``, ...): a percentile of
  99 means farther from the training data than 99 % of the validation inputs;
* ``label`` — with labels: the class name of the label, or "" where the label is −1 (no class).

``probtrans predict`` puts the input before them, so that each row reads against its input:
``text`` (the text, as read; pairs of texts: ``text`` and ``text_pair``, :func:`input_columns`)
or, for images, ``row`` (0-based position in the input); it reads the input's labels only when
asked (``--labels``).

Entropies are in nats (natural logarithms), computed by :mod:`probtrans.analysis.metrics`.

:func:`write_predictions` writes the columns in a file format with a writer
(:mod:`probtrans.data.formats`: CSV, TSV, JSON Lines, Parquet), or shows them as a table
(:func:`format_predictions`). The inputs of ``probtrans predict`` are read by
:func:`probtrans.data.files.read_inputs`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from probtrans.analysis import metrics
from probtrans.analysis.report import text_table
from probtrans.data.formats import find_format, formats, suffixes
from probtrans.data.writers import checked_chunks, table_length, table_rows
from probtrans.errors import ProbtransError
from probtrans.storage.io import atomic_write

SHOWN_ROWS = 20  # rows of the table shown on the terminal
SHOWN_CHARACTERS = 40  # of an input text in that table (files keep it whole)


# ----------------------------------------------------------------------------- columns
def input_columns(texts: Sequence[str] | Sequence[tuple[str, str]]) -> dict[str, np.ndarray]:
    """The input columns of predicted texts: ``text``, and for pairs of texts ``text_pair``."""
    texts = list(texts)
    if texts and isinstance(texts[0], tuple):
        first, second = zip(*texts, strict=True)
        return {"text": np.array(first, dtype=object), "text_pair": np.array(second, dtype=object)}
    return {"text": np.array(texts, dtype=object)}


def prediction_columns(
    probs: np.ndarray,
    class_names: list[str],
    reference_entropy: np.ndarray | None = None,
    labels: np.ndarray | None = None,
    given: dict[str, np.ndarray] | None = None,
    given_references: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """The columns of the module docstring for ``probs`` (S, N, C), each of length N.

    ``class_names`` has C names; ``reference_entropy`` (any number of entropies, in nats) adds
    ``entropy_percentile``; ``labels`` (N,), classes 0..C−1 or −1 for none, adds ``label``;
    ``given`` (score → (N,)) the scores the network gives (feature-space scores), each with
    its percentile among ``given_references`` (score → the validation split's values).
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
    scores = metrics.uncertainty_scores(probs, given)
    columns: dict[str, np.ndarray] = {"predicted": np.array(names, dtype=str)[mean.argmax(1)]}
    columns.update({f"p_{name}": mean[:, c] for c, name in enumerate(names)})
    references = given_references or {}
    for score in metrics.UNCERTAINTY_SCORES.entries():
        if score.column and score.name in scores:
            columns[score.name] = scores[score.name]
            if score.function is None and score.name in references:
                percentile = percentile_among(scores[score.name], references[score.name])
                columns[f"{score.name}_percentile"] = percentile
    if reference_entropy is not None:
        columns["entropy_percentile"] = percentile_among(scores["entropy"], reference_entropy)
    if labels is not None:
        columns["label"] = _label_names(labels, names, n_examples)
    return columns


def percentile_among(values: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """For each value, the percentage (0–100) of ``reference`` values ≤ it."""
    reference = np.sort(np.asarray(reference, dtype=np.float64).ravel())
    if reference.size == 0:
        raise ValueError("the reference values must not be empty")
    below = np.searchsorted(reference, np.asarray(values, dtype=np.float64), side="right")
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


# ----------------------------------------------------------------------------- outputs
def write_predictions(
    table: dict[str, np.ndarray] | Iterable[dict[str, np.ndarray]], out: Path | None = None
) -> Path | None:
    """Write ``table`` (columns, or the chunks of a table in order: each is written as it comes,
    so a table of any length is written in the memory of one chunk) to ``out`` in the format
    its extension names (a format with a writer: ``.csv``, ``.tsv`` (tab-separated),
    ``.jsonl`` (one JSON object per row), ``.parquet`` (typed columns, through pyarrow), ...)
    atomically, with full precision; returns ``out``. A chunk that fails (a ValueError for
    columns of several lengths, or any error of whatever computes the chunks) leaves no file.
    Without ``out``, print :func:`format_predictions` of the first rows to standard output
    and return None."""
    chunks = checked_chunks([table] if isinstance(table, dict) else table)
    if out is None:
        print(format_predictions(*head(chunks, SHOWN_ROWS)))
        return None
    out = Path(out)
    writable = formats(writable=True)
    fmt = find_format(out, writable)
    if fmt is None or fmt.write is None:
        suffix = out.suffix.lower()
        raise ProbtransError(
            f"{out}: unknown extension {suffix or '(none)'!r}; predictions are written as "
            f"{suffixes(writable)}"
        )
    write = fmt.write
    try:
        return atomic_write(out, lambda tmp: write(chunks, tmp))
    except OSError as err:
        raise ProbtransError(f"{out}: cannot be written ({err.strerror or err})") from None


def head(chunks: Iterable[dict[str, np.ndarray]], rows: int) -> tuple[dict[str, np.ndarray], int]:
    """The first ``rows`` rows of a table given in chunks, and how many rows it has."""
    parts, total = [], 0
    for columns in chunks:
        if total < rows:
            parts.append({name: np.asarray(v)[: rows - total] for name, v in columns.items()})
        total += table_length(columns)
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}, total


def format_predictions(
    columns: dict[str, np.ndarray], total: int | None = None, max_rows: int = SHOWN_ROWS
) -> str:
    """A text table of ``columns``: numbers with 4 decimals, right-aligned, texts cut to
    :data:`SHOWN_CHARACTERS`; at most the first ``max_rows`` rows, then a line saying how many
    more there are (of ``total`` where ``columns`` are the first rows of a longer table)."""
    rows = table_rows(columns)
    total = len(rows) if total is None else total
    shown = [[shown_value(value) for value in row] for row in rows[:max_rows]]
    numeric = [np.issubdtype(np.asarray(v).dtype, np.number) for v in columns.values()]
    lines = [text_table([list(columns), *shown], numeric)]
    more = total - len(shown)
    if more:
        lines.append(f"… and {more} more row{'s' * (more > 1)} (of {total})")
    return "\n".join(lines)


def shown_value(value: object) -> str:
    """A cell of :func:`format_predictions`: a float with 4 decimals, a text on one line and
    cut to :data:`SHOWN_CHARACTERS` characters (with "…")."""
    if isinstance(value, float):
        return f"{value:.4f}"
    text = " ".join(str(value).split())
    return text if len(text) <= SHOWN_CHARACTERS else text[: SHOWN_CHARACTERS - 1] + "…"
