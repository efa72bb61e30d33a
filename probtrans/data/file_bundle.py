"""A data set from your own files, declared in a model spec's ``[data]`` table, and the named
out-of-domain sets of ``[[data.ood]]`` (or ``probtrans evaluate --ood NAME=SOURCE``).

Rows are read by :mod:`probtrans.data.files` (CSV, TSV, JSON Lines, Parquet, ``.npz``, Hugging
Face data sets). Labels are strings or integers; the classes are ``data.labels`` in order, or the
sorted string labels, or the integers 0..C−1 (named by the data set's ``ClassLabel`` when it has
one). A missing ``validation`` or ``test`` file is split off ``train`` (stratified, seeded by
``data.split_seed``). Texts are tokenised with a vocabulary learned on the training split
(:mod:`probtrans.data.tokenizer`); images are scaled to [0, 1] when their pixels are integers
(8-bit) and, with ``data.normalize``, standardised per channel with the training split's mean and
standard deviation. Out-of-domain sets are prepared with the same tokenizer or scaling.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from probtrans.data.bundle import DataBundle, DataSplit, ImageScaling
from probtrans.data.corruptions import corrupt, parse_corruption
from probtrans.data.files import Rows, parse_source, read_images, read_texts
from probtrans.data.in_memory import NO_LABEL, class_indices, split_rows
from probtrans.errors import ProbtransError
from probtrans.specs import DataSpec
from probtrans.specs.model import OodSetSpec

#: the Hugging Face split each role reads unless its source names one
HUB_SPLITS = {"train": "train", "val": "validation", "test": "test"}
#: the description key saying whether the training labels were strings or integers
LABELS = "labels"
#: the prefix of the corrupted digits (``digits-c:CORRUPTION:SEVERITY``)
CORRUPTED_DIGITS = "digits-c:"


def load_file_bundle(spec: DataSpec, base: Path | None = None) -> DataBundle:
    """The :class:`DataBundle` of ``spec``'s files (``kind``, ``train``, ``validation``,
    ``test``); relative paths start at ``base`` (the spec's folder). Out-of-domain sets are
    added by :func:`add_ood_sets`."""
    given = {"train": spec.train, "val": spec.validation, "test": spec.test}
    sources = {role: parse_source(text, base) for role, text in given.items() if text}
    rows = {
        role: _read(spec, source, HUB_SPLITS[role], labels=True) for role, source in sources.items()
    }
    values = {role: r.labels for role, r in rows.items()}
    order: list[Any] | None = spec.labels
    integers = isinstance(values["train"][0], int)  # the training labels as the file holds them
    if names_classes(rows["train"], spec):  # labels by name: sources may number them otherwise
        values = {role: r.named_labels(rows["train"].label_names) for role, r in rows.items()}
        if order is None and rows["train"].label_names:
            order = rows["train"].label_names  # the classes in the training feature's order
    ys, names = class_indices(values, order, "data", lambda role, i: rows[role].where(i))
    pairs = {role: (rows[role].values, ys[role]) for role in rows}
    fractions = {
        "val_fraction": spec.val_fraction,
        "test_fraction": spec.test_fraction,
        "seed": spec.split_seed,
    }
    name = spec.train  # as the spec writes it
    # a file too small to split is named here, as the spec's data (the bundle splits it again)
    split_rows(ys["train"], "val" in pairs, "test" in pairs, **fractions, where=f"data: {name}")
    if spec.kind == "text":
        bundle = DataBundle.from_texts(
            pairs["train"],
            pairs.get("val"),
            pairs.get("test"),
            labels=names,
            max_len=spec.max_len,
            vocab_size=spec.vocab_size,
            min_freq=spec.min_freq,
            name=name,
            tokenizer=spec.tokenizer,
            **fractions,
        )
    else:
        eight_bit = not np.issubdtype(np.asarray(rows["train"].values).dtype, np.floating)
        scaling = ImageScaling(eight_bit)
        images = {
            role: (scaling(torch.from_numpy(np.asarray(x)), str(sources[role])), y)
            for role, (x, y) in pairs.items()
        }
        bundle = DataBundle.from_tensors(
            images["train"],
            images.get("val"),
            images.get("test"),
            class_names=names,
            name=name,
            **fractions,
        )
        bundle.scaling = scaling
        if spec.normalize:
            _standardise(bundle)
    bundle.description["source"] = "files"
    bundle.description[LABELS] = "integers" if integers else "strings"
    bundle.description["sources"] = {role: str(source) for role, source in sources.items()}
    return bundle


def add_ood_sets(
    bundle: DataBundle,
    sets: list[OodSetSpec],
    spec: DataSpec,
    base: Path | None = None,
    replace: bool = False,
) -> DataBundle:
    """``bundle`` with each of ``sets`` added to its out-of-domain sets (relative paths start at
    ``base``); a name it already has is refused, or with ``replace`` its set is replaced."""
    for ood in sets:
        if ood.name in bundle.ood and not replace:
            raise ProbtransError(f"data.ood: the name {ood.name!r} is taken; choose another")
        bundle.ood[ood.name] = load_ood_set(ood, bundle, spec, base)
        bundle.description.setdefault("ood_sources", {})[ood.name] = ood.source
    return bundle


def load_ood_set(
    ood: OodSetSpec, bundle: DataBundle, spec: DataSpec, base: Path | None = None
) -> DataSplit:
    """The rows of ``ood.source`` prepared as ``bundle``'s inputs (its tokenizer or image
    scaling), with their labels where the source has the label column (they must be classes of
    the task); ``digits-c:CORRUPTION:SEVERITY`` is the digits test split corrupted."""
    if ood.source.startswith(CORRUPTED_DIGITS):
        return _corrupted_digits(ood, bundle, spec)
    label_column = spec.label_column if ood.label_column is None else ood.label_column
    columns = {
        "text_column": ood.text_column or spec.text_column,
        "text_pair_column": ood.text_pair_column or spec.text_pair_column,
        "image_column": ood.image_column or spec.image_column,
        "label_column": label_column or None,
    }
    source = parse_source(ood.source, base)
    kind = "text" if bundle.kind == "tokens" else "image"
    read = read_texts if kind == "text" else read_images
    rows = read(
        source,
        **_columns(kind, columns),
        split="test",
        labels=None if label_column else False,
        declared=spec.labels or (),
    )
    try:
        inputs, mask = bundle.encode(rows.values, str(source))
    except ProbtransError as err:
        raise ProbtransError(f"data.ood {ood.name!r}: {err}") from None
    what = f'out-of-domain set {ood.name!r}; label_column = "" in its table ignores its labels'
    labels = label_indices(rows, bundle, spec, what)
    return DataSplit(inputs, labels, mask)


def _read(spec: DataSpec, source: Any, split: str, labels: bool | None) -> Rows:
    columns = {
        "text_column": spec.text_column,
        "text_pair_column": spec.text_pair_column,
        "image_column": spec.image_column,
        "label_column": spec.label_column,
    }
    read = read_texts if spec.kind == "text" else read_images
    return read(
        source,
        **_columns(spec.kind, columns),
        split=split,
        labels=labels,
        declared=spec.labels or (),
    )


def _columns(kind: str, columns: dict[str, str | None]) -> dict[str, str | None]:
    unused = ("image_column",) if kind == "text" else ("text_column", "text_pair_column")
    return {key: value for key, value in columns.items() if key not in unused}


def names_classes(rows: Rows, spec: DataSpec) -> bool:
    """Whether the labels of ``rows`` name their classes: strings, or the integers of a
    ClassLabel feature (not where ``data.labels`` lists integer label values)."""
    if spec.labels is not None and not all(isinstance(v, str) for v in spec.labels):
        return False
    return bool(rows.labels) and (isinstance(rows.labels[0], str) or rows.label_names is not None)


def label_indices(rows: Rows, bundle: DataBundle, spec: DataSpec, what: str) -> torch.Tensor:
    """Class indices (N,) of the labels of ``rows`` (new inputs or an out-of-domain set:
    ``what`` names it, and how its labels are left unread, for messages), −1 for all when it has
    none: string labels by class name; integer labels by
    their place in ``data.labels`` when it lists integers, else as class indices (not where the
    training labels were strings)."""
    if rows.labels is None:
        return torch.full((len(rows),), NO_LABEL, dtype=torch.long)
    names = bundle.class_names
    by_name = {name: c for c, name in enumerate(names)}
    labels = rows.labels
    if names != [str(c) for c in range(len(names))] and names_classes(rows, spec):
        labels = rows.named_labels()  # a ClassLabel's integers by their names
    if spec.labels is not None and all(isinstance(v, int) for v in spec.labels):
        index = {value: c for c, value in enumerate(spec.labels)}  # integer label values
    elif bundle.description.get(LABELS) == "strings":  # the classes are the string labels
        index = by_name
    else:  # integer labels are class indices; the class names name them too
        index = by_name | {c: c for c in range(len(names))}
    classes = []
    for i, value in enumerate(labels):
        if value not in index or isinstance(value, bool):
            raise ProbtransError(
                f"{rows.where(i)}: label {value!r} is not one of the classes {names} of the "
                f"task ({what})"
            )
        classes.append(index[value])
    return torch.tensor(classes, dtype=torch.long)


def _corrupted_digits(ood: OodSetSpec, bundle: DataBundle, spec: DataSpec) -> DataSplit:
    if bundle.name != "digits":
        raise ProbtransError(
            f"data.ood {ood.name!r}: {ood.source!r} corrupts the digits test split; this data "
            f"set is {bundle.name!r}"
        )
    corruption, severity = parse_corruption(ood.source.removeprefix(CORRUPTED_DIGITS))
    images = corrupt(bundle.test.inputs.numpy(), corruption, severity, seed=spec.split_seed)
    return DataSplit(torch.from_numpy(images), bundle.test.labels.clone())


def _standardise(bundle: DataBundle) -> None:
    """Standardise every split per channel with the training split's mean and std, and keep
    the scaling for new inputs."""
    train = bundle.train.inputs  # (N, C, H, W), already scaled
    mean = train.mean(dim=(0, 2, 3))
    std = train.std(dim=(0, 2, 3)).clamp_min(1e-6)
    mean, std = tuple(mean.tolist()), tuple(std.tolist())
    standardise = ImageScaling(False, mean, std)  # of pixels already scaled to [0, 1]
    for split in (bundle.train, bundle.val, bundle.test, *bundle.ood.values()):
        split.inputs = standardise(split.inputs)
    bundle.scaling = ImageScaling(bundle.scaling.eight_bit, mean, std)
