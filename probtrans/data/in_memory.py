"""Data given in memory, checked and split before it becomes a
:class:`~probtrans.data.bundle.DataBundle` (:meth:`~probtrans.data.bundle.DataBundle.from_tensors`,
:meth:`~probtrans.data.bundle.DataBundle.from_texts`): each argument's type, shape and values
(token ids within the vocabulary, labels within the classes, out-of-domain set names), with one
ProbtransError naming the argument, split and row; labels as class indices
(:func:`class_indices`); the validation and test rows split off the training rows, stratified and
seeded (:func:`split_rows`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence, Sized
from typing import Any, TypeVar

import numpy as np
import torch
from sklearn.model_selection import train_test_split
from torch import Tensor

from probtrans.analysis.summary import is_ood_split, ood_sets
from probtrans.data.rows import is_text_pair, kind_of, pair_kind_of, text_rows
from probtrans.errors import ProbtransError
from probtrans.specs.base import check_seed
from probtrans.specs.model import SET_NAME_PATTERN

#: the label of a row without a class: out-of-domain data, inputs to predict
NO_LABEL = -1
SET_NAME = re.compile(SET_NAME_PATTERN)
Split = TypeVar("Split", bound=Sized)  # a DataSplit (not imported: the bundle imports this module)


def named_sets(ood: Any, where: str) -> dict[str, Any]:
    """``ood`` as out-of-domain sets by name: one set (named "ood"), or a dict of them."""
    if ood is None:
        return {}
    if not isinstance(ood, dict):
        return {"ood": ood}
    for set_name in ood:
        if not isinstance(set_name, str) or not SET_NAME.fullmatch(set_name):
            raise ProbtransError(
                f"{where}: ood set name {set_name!r}: letters, digits and _ . + - only, starting "
                f"with a letter or digit"
            )
    return dict(ood)


def arranged_splits(splits: dict[str, Split]) -> dict[str, Any]:
    """``train``, ``val``, ``test`` and the ``ood:NAME`` splits as DataBundle's arguments."""
    return {s: splits[s] for s in ("train", "val", "test")} | {"ood": ood_sets(splits)}


def checked_pair(value: Any, split: str, where: str) -> tuple[Any, Any]:
    if not isinstance(value, tuple | list) or len(value) != 2:
        what = f"a {type(value).__name__}" + (
            f" of length {len(value)}" if isinstance(value, tuple | list) else ""
        )
        raise ProbtransError(f"{where}: {split} must be a pair (x, y), got {what}")
    return value[0], value[1]


def as_tensor(value: Any, what: str) -> Tensor:
    """``value`` (a tensor, numpy array or nested list of numbers) as a CPU tensor."""
    if isinstance(value, Tensor):
        return value.detach().cpu()
    try:
        array = np.asarray(value)
    except ValueError as err:  # ragged nested lists
        raise ProbtransError(f"{what}: not an array ({err})") from None
    if array.dtype.kind not in "biuf":
        raise ProbtransError(
            f"{what}: must hold numbers, got a {type(value).__name__} of dtype {array.dtype}"
        )
    if array.dtype.kind == "u":  # torch lacks most unsigned types
        array = array.astype(np.int64)
    return torch.from_numpy(array.copy())


def labels_tensor(value: Any, what: str) -> Tensor:
    y = as_tensor(value, what)
    if y.ndim != 1:
        raise ProbtransError(f"{what}: labels must be 1-D (N,), got shape {tuple(y.shape)}")
    if y.is_floating_point() or y.dtype == torch.bool:
        raise ProbtransError(f"{what}: labels must be integers, got dtype {y.dtype}")
    return y.long()


def input_kind(x: Tensor, what: str) -> str:
    if x.dtype == torch.bool:
        raise ProbtransError(
            f"{what}: dtype bool; give float images (N, C, H, W) or integer token ids (N, L)"
        )
    return "image" if x.is_floating_point() else "tokens"


def check_inputs(x: Tensor, kind: str, what: str) -> Tensor:
    """``x`` checked as ``kind``: float32 images (N, C, H, W) or long token ids (N, L)."""
    shape = tuple(x.shape)
    if x.dtype == torch.bool or x.is_floating_point() != (kind == "image"):
        given = "float" if x.is_floating_point() else str(x.dtype).removeprefix("torch.")
        want = "float images" if kind == "image" else "integer token ids"
        raise ProbtransError(
            f"{what}: dtype {given}, but train x holds {want} (all splits hold the same kind)"
        )
    if kind == "image":
        if x.ndim == 3:
            x = x[:, None]
        if x.ndim != 4 or 0 in x.shape[1:]:
            raise ProbtransError(f"{what}: shape {shape}; images must be (N, C, H, W) or (N, H, W)")
        x = x.float()
        if not torch.isfinite(x).all():
            raise ProbtransError(f"{what}: shape {shape}; holds NaN or infinite values")
        return x
    if x.ndim != 2 or x.shape[1] == 0:
        raise ProbtransError(f"{what}: shape {shape}; token ids must be (N, L) with L ≥ 1")
    x = x.long()
    if len(x) and int(x.min()) < 0:
        raise ProbtransError(f"{what}: shape {shape}; token ids must be ≥ 0 (0 is padding)")
    blank = (x == 0).all(1).nonzero().flatten()
    if len(blank):
        raise ProbtransError(
            f"{what}: shape {shape}; row {int(blank[0])} is all padding (id 0), it needs a token"
        )
    return x


def check_same_image_shape(xs: dict[str, Tensor], where: str) -> None:
    shape = tuple(xs["train"].shape[1:])
    for s, x in xs.items():
        if tuple(x.shape[1:]) != shape:
            raise ProbtransError(
                f"{where}: {s} x: images of shape {tuple(x.shape[1:])} (C, H, W), but train "
                f"images are {shape}"
            )


def checked_class_names(
    class_names: Sequence[str] | None, ys: dict[str, Tensor], where: str
) -> list[str]:
    if class_names is None:
        in_domain = [y for s, y in ys.items() if not is_ood_split(s) and len(y)]
        n = max(int(y.max()) for y in in_domain) + 1 if in_domain else 0
        if n < 2:
            raise ProbtransError(
                f"{where}: the labels hold {max(n, 0)} class(es) (largest label {n - 1}); a "
                f"classifier needs at least 2 (or give class_names)"
            )
        return [str(c) for c in range(n)]
    if isinstance(class_names, str):
        raise ProbtransError(f"{where}: class_names must be a list of names, not one string")
    names = [str(c) for c in class_names]
    if len(names) < 2 or len(set(names)) != len(names):
        raise ProbtransError(f"{where}: class_names = {names}: must be at least 2 distinct names")
    return names


def check_classes(y: Tensor, n_classes: int, what: str, allow_none: bool) -> None:
    low = NO_LABEL if allow_none else 0
    bad = ((y < low) | (y >= n_classes)).nonzero().flatten()
    if len(bad):
        row = int(bad[0])
        allowed = f"{low}..{n_classes - 1}" + (" (−1: no class)" if allow_none else "")
        raise ProbtransError(
            f"{what}: shape {tuple(y.shape)}; label {int(y[row])} at row {row} is outside the "
            f"classes {allowed}"
        )


def checked_vocab_size(xs: dict[str, Tensor], vocab_size: int | None, where: str) -> int:
    largest = max(int(x.max()) for x in xs.values() if len(x))
    if vocab_size is None:
        return max(largest + 1, 2)
    if largest >= vocab_size:
        s = next(s for s, x in xs.items() if len(x) and int(x.max()) == largest)
        raise ProbtransError(
            f"{where}: {s} x: token id {largest} is outside vocab_size = {vocab_size}"
        )
    return vocab_size


def split_rows(
    labels: np.ndarray,
    have_val: bool,
    have_test: bool,
    val_fraction: float,
    test_fraction: float,
    seed: int,
    where: str,
) -> dict[str, np.ndarray]:
    """Rows of ``train`` that become ``train`` and the missing ``test`` and ``val`` splits,
    stratified by ``labels`` and seeded; fractions are of all of ``train``."""
    check_seed(seed, f"{where}: seed = {seed!r}")
    rows = {"train": np.arange(len(labels))}
    if have_val and have_test:
        return {}
    fractions = {}
    if not have_test:
        fractions["test"] = test_fraction
    if not have_val:
        fractions["val"] = val_fraction
    for s, f in fractions.items():
        if not (isinstance(f, int | float) and 0 < f < 1):
            raise ProbtransError(f"{where}: {s}_fraction = {f!r}: must be in (0, 1)")
    if sum(fractions.values()) >= 1:
        raise ProbtransError(
            f"{where}: val_fraction + test_fraction = {sum(fractions.values())}: must be < 1, "
            f"train needs rows"
        )
    for s, f in fractions.items():  # test first, then val, as the digits data
        size = max(1, round(f * len(labels)))  # rows, of all of train: no rounding drift
        try:
            rest, part = train_test_split(
                rows["train"],
                test_size=size,
                stratify=labels[rows["train"]],
                random_state=seed,
            )
        except ValueError as err:
            raise ProbtransError(
                f"{where}: cannot split {s} ({s}_fraction = {f}) off train ({len(labels)} rows) "
                f"stratified by class: {err}"
            ) from None
        rows["train"], rows[s] = np.sort(rest), np.sort(part)
    return rows


def split_description(source: str, splits: dict[str, Split], rows: dict, seed: int) -> dict:
    return {
        "source": source,
        "sizes": {s: len(split) for s, split in splits.items()},
        "split_off_train": sorted(s for s in rows if s != "train"),
        "split_seed": seed,
    }


def checked_texts(
    value: Any, what: str, empty_ok: bool = False, pairs: bool | None = False
) -> list[str] | list[tuple[str, str]]:
    """The texts of ``value`` (``pairs``: pairs of texts, as tuples; None: pairs if the first
    is one), each checked."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ProbtransError(f"{what}: must be a list of strings, got a {type(value).__name__}")
    texts = text_rows(value, what)
    if texts is None:
        raise ProbtransError(f"{what}: must be a list of strings, got numbers")
    if pairs is None:
        pairs = bool(texts) and is_text_pair(texts[0])
    for i, text in enumerate(texts):
        if pairs:
            if not is_text_pair(text):
                raise ProbtransError(
                    f"{what}[{i}]: {pair_kind_of(text)}, not a pair of texts (the training "
                    f"texts are pairs: give every text as a (text, text_pair) tuple of two "
                    f"strings)"
                )
            texts[i] = text = tuple(text)
            if not all(part.strip() for part in text):
                raise ProbtransError(f"{what}[{i}]: an empty text in the pair")
            continue
        if not isinstance(text, str):
            pair = " (the training texts are single strings)" if is_text_pair(text) else ""
            raise ProbtransError(f"{what}[{i}]: {kind_of(text)}, not a string{pair}")
        if not text.strip():
            raise ProbtransError(f"{what}[{i}]: empty text")
    if not texts and not empty_ok:
        raise ProbtransError(f"{what}: no texts")
    return texts


def checked_label_list(value: Any, what: str) -> list[Any]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ProbtransError(f"{what}: must be a list of labels, got a {type(value).__name__}")
    values = value.tolist() if isinstance(value, np.ndarray | Tensor) else list(value)
    for i, v in enumerate(values):
        if isinstance(v, np.generic):
            v = values[i] = v.item()
        if isinstance(v, bool) or not isinstance(v, int | str):
            raise ProbtransError(
                f"{what}[{i}]: label {v!r} is a {type(v).__name__}; labels are strings or integers"
            )
    return values


def class_indices(
    values: dict[str, list[Any]],
    labels: Sequence[Any] | None,
    where: str,
    locate: Callable[[str, int], str] | None = None,
) -> tuple[dict[str, np.ndarray], list[str]]:
    """Class indices per split and the class names (see :meth:`DataBundle.from_texts`);
    ``locate(split, row)`` names where a bad label is (a file and line) in errors."""
    strings = isinstance(values["train"][0], str)
    for s, vs in values.items():
        for i, v in enumerate(vs):
            if isinstance(v, str) != strings:
                raise ProbtransError(
                    f"{_row(where, s, i, locate)} = {v!r}: labels mix strings and integers"
                )
    by_index = not strings  # integer labels are class indices, unless ``labels`` orders them
    by_name = False  # integer labels indexing the class names of ``labels``
    if labels is not None:
        if isinstance(labels, str):
            raise ProbtransError(f"{where}: labels must be a list of classes, not one string")
        order = [v.item() if isinstance(v, np.generic) else v for v in labels]
        twice = sorted({str(v) for v in order if order.count(v) > 1})
        if twice:
            raise ProbtransError(f"{where}: labels = {order}: lists {twice[0]!r} twice")
        if len(order) < 2:
            raise ProbtransError(f"{where}: labels = {order}: must be at least 2 classes")
        by_index = not strings and all(isinstance(v, str) for v in order)  # names of 0..C−1
        by_name = by_index
        names = [str(v) for v in order]
        index = (
            {c: c for c in range(len(order))} if by_index else {v: i for i, v in enumerate(order)}
        )
        known = f"{order}"
    elif strings:
        names = sorted(set(values["train"]))
        index = {v: i for i, v in enumerate(names)}
        known = f"{names} (the train labels; labels=[...] names them all)"
    else:
        n = max(max(vs) for s, vs in values.items() if not is_ood_split(s)) + 1
        names = [str(c) for c in range(n)]
        index = {c: c for c in range(n)}
    if len(names) < 2:
        raise ProbtransError(
            f"{where}: the labels hold the single class {names}; a classifier needs at least 2"
        )
    if by_index:
        known = f"0..{len(names) - 1}" + (" (integer labels index the names given)" * by_name)
    ys = {}
    for s, vs in values.items():
        for i, v in enumerate(vs):
            if v not in index:
                raise ProbtransError(
                    f"{_row(where, s, i, locate)} = {v!r}: not one of the classes {known}"
                )
        ys[s] = np.array([index[v] for v in vs], dtype=np.int64)
    unseen = [names[c] for c in range(len(names)) if c not in set(ys["train"].tolist())]
    if unseen:
        raise ProbtransError(
            f"{where}: class {unseen[0]!r} of the classes {names} has no training example"
            + (" (integer labels are the classes 0..C−1; labels = [...] lists yours)" * by_index)
        )
    return ys, names


def _row(where: str, split: str, i: int, locate: Callable[[str, int], str] | None) -> str:
    """How an error names label ``i`` of ``split``: its file and line, or its list position."""
    return f"{locate(split, i)}: label" if locate else f"{where}: {split} labels[{i}]"
