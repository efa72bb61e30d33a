"""Data sets as tensors: splits for training, validation, in-domain test and out-of-domain test.

Every data source (:mod:`probtrans.data.sources`) returns a :class:`DataBundle`; models only see
:class:`DataSplit` tensors. Data held in memory become a bundle through
:meth:`DataBundle.from_tensors` (images or token ids) and :meth:`DataBundle.from_texts` (texts,
tokenised with a vocabulary learned on the training texts). A split whose rows have no class
(out-of-domain data, inputs to predict) carries the label :data:`NO_LABEL`;
:meth:`DataSplit.unlabelled` builds one.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from sklearn.model_selection import train_test_split
from tokenizers import Tokenizer
from torch import Tensor

from probtrans.data.tokenizer import decoder, encode, encoder, pad_id, train_tokenizer
from probtrans.errors import ProbtransError
from probtrans.specs import DataSpec
from probtrans.specs.base import check_seed, parse
from probtrans.specs.model import SET_NAME_PATTERN
from probtrans.summary import is_ood_split, ood_sets, ood_split

#: batches per pool of length-grouped shuffling (``DataSplit.batches(by_length=True)``)
POOL_BATCHES = 50
#: the label of a row without a class: out-of-domain data, inputs to predict
NO_LABEL = -1
SET_NAME = re.compile(SET_NAME_PATTERN)
#: split fractions and tokenisation settings of the in-memory constructors (the spec defaults)
_DEFAULTS = DataSpec()


@dataclass
class DataSplit:
    """inputs: images (N, C, H, W) or token ids (N, L); mask: (N, L) bool or None; labels: (N,)
    classes in 0..C−1, or :data:`NO_LABEL` (−1) for a row without a class."""

    inputs: Tensor
    labels: Tensor
    mask: Tensor | None = None

    @classmethod
    def unlabelled(cls, inputs: Tensor, mask: Tensor | None = None) -> DataSplit:
        """A split of ``inputs`` without classes (to predict): every label is :data:`NO_LABEL`.
        Token ids (an integer (N, L) tensor) without ``mask`` get the mask ``inputs != 0``."""
        inputs = torch.as_tensor(inputs)
        if mask is None and inputs.ndim == 2 and not inputs.is_floating_point():
            mask = inputs != 0
        return cls(inputs, torch.full((len(inputs),), NO_LABEL, dtype=torch.long), mask)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, rows: slice) -> DataSplit:
        """The rows of the slice ``rows`` as a split (views, not copies)."""
        mask = None if self.mask is None else self.mask[rows]
        return DataSplit(self.inputs[rows], self.labels[rows], mask)

    def lengths(self) -> Tensor | None:
        """Tokens per row, padding excluded (N,); None for images."""
        return None if self.mask is None else self.mask.sum(1)

    def batches(
        self,
        batch_size: int,
        shuffle: bool = False,
        generator: torch.Generator | None = None,
        trim: bool = True,
        by_length: bool = False,
    ) -> Iterator[tuple[Tensor, Tensor, Tensor | None, Tensor]]:
        """Yield (index, inputs, mask, labels) minibatches; ``index`` locates them in the split.

        With ``trim``, token batches drop the trailing columns that are padding in every row:
        padding gets exactly zero attention weight and no pooling weight, so dropping it cannot
        change any output (keep them when per-token outputs of batches are concatenated).

        With ``by_length`` (token splits), rows of similar length share a batch, so that ``trim``
        removes most of the padding (IMDB reviews fill half of 512 tokens on average). Without
        ``shuffle`` the rows come in order of length; with it, a random permutation is cut into
        pools of ``POOL_BATCHES`` batches, each pool is sorted by length and cut into batches, and
        the batches of all pools come in random order. Batch sizes are those of plain batching.
        """
        for index in self.batch_indices(batch_size, shuffle, generator, by_length):
            yield self.batch(index, trim)

    def batch(
        self, index: Tensor, trim: bool = True
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
        """The minibatch (index, inputs, mask, labels) of the rows ``index`` (see :meth:`batches`
        for ``trim``)."""
        inputs, mask = self.inputs[index], None
        if self.mask is not None:
            mask = self.mask[index]
            if trim:
                real = mask.any(0).nonzero()
                length = int(real.max()) + 1 if len(real) else 1
                inputs, mask = inputs[:, :length], mask[:, :length]
        return index, inputs, mask, self.labels[index]

    def batch_indices(
        self,
        batch_size: int,
        shuffle: bool = False,
        generator: torch.Generator | None = None,
        by_length: bool = False,
    ) -> list[Tensor]:
        """The row indices of the minibatches :meth:`batches` yields, in order."""
        lengths = self.lengths() if by_length else None
        if lengths is not None and not shuffle:
            return list(torch.sort(lengths, stable=True).indices.split(batch_size))
        order = (
            torch.randperm(len(self), generator=generator) if shuffle else torch.arange(len(self))
        )
        if lengths is None:
            return list(order.split(batch_size))
        batches: list[Tensor] = []
        for pool in order.split(batch_size * POOL_BATCHES):
            batches += pool[torch.sort(lengths[pool], stable=True).indices].split(batch_size)
        return [batches[i] for i in torch.randperm(len(batches), generator=generator)]


#: new images whose pixels stray beyond the training pixels' range [lo, hi] by more than this
#: fraction of its width, on either side, are refused (README, "Ask a trained run")
RANGE_MARGIN = 0.5
#: ... and so are images whose pixels span less than this fraction of it (but more than
#: nothing): a batch in another scale, e.g. pixels in [0, 1] for a run trained on [0, 16]
MIN_SPAN = 0.125


@dataclass(frozen=True)
class ImageScaling:
    """How raw pixels become model inputs. Integer pixels are 8-bit (0–255) and divided by 255;
    float pixels are taken as they are (in [0, 1] where the training pixels were 8-bit:
    ``eight_bit``). Then, with ``mean`` and ``std``, x = (p − mean_c) / std_c per channel c.
    ``pixel_range``: the range of the training pixels p, which new images must fit
    (:meth:`check_range`)."""

    eight_bit: bool = False
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    pixel_range: tuple[float, float] | None = None

    def __call__(self, pixels: Tensor, what: str = "images") -> Tensor:
        """pixels (N, C, H, W) → float32 inputs (N, C, H, W) (:meth:`pixels`, then
        :meth:`standardise`)."""
        return self.standardise(self.pixels(pixels, what))

    def pixels(self, pixels: Tensor, what: str = "images") -> Tensor:
        """Raw pixels → float32 pixels p; ProbtransError naming ``what`` for boolean pixels,
        integer pixels outside 0–255, or float pixels above 1 where the training pixels were
        8-bit."""
        if pixels.dtype == torch.bool:
            raise ProbtransError(
                f"{what}: boolean pixels; give 8-bit integers (0–255) or floats scaled as the "
                f"training images"
            )
        if pixels.is_floating_point():
            x = pixels.float()
            if self.eight_bit and len(x) and float(x.max()) > 1.0:
                raise ProbtransError(
                    f"{what}: float pixels up to {float(x.max()):g}, but this data set's images "
                    f"are 8-bit: give integers 0–255, or floats in [0, 1]"
                )
            return x
        if len(pixels) and (int(pixels.min()) < 0 or int(pixels.max()) > 255):
            raise ProbtransError(
                f"{what}: integer pixels in [{int(pixels.min())}, {int(pixels.max())}]; "
                f"integer pixels are 8-bit (0–255): scale others to floats in [0, 1]"
            )
        return pixels.float() / 255.0

    def standardise(self, x: Tensor) -> Tensor:
        """Pixels p → (p − mean_c) / std_c per channel (p itself without ``mean``, ``std``)."""
        if self.mean is None or self.std is None:
            return x
        mean = torch.tensor(self.mean, dtype=torch.float32, device=x.device)[:, None, None]
        std = torch.tensor(self.std, dtype=torch.float32, device=x.device)[:, None, None]
        return (x - mean) / std

    def unstandardised(self, x: Tensor) -> Tensor:
        """Inputs → the pixels p they were standardised from."""
        if self.mean is None or self.std is None:
            return x
        mean = torch.tensor(self.mean, dtype=x.dtype, device=x.device)[:, None, None]
        std = torch.tensor(self.std, dtype=x.dtype, device=x.device)[:, None, None]
        return x * std + mean

    def check_range(self, pixels: Tensor, what: str) -> None:
        """Refuse pixels p (new images) in another range than the training pixels': beyond
        it by more than :data:`RANGE_MARGIN` of its width, or spanning less than
        :data:`MIN_SPAN` of it (constant images pass)."""
        if self.pixel_range is None or not len(pixels):
            return
        low, high = self.pixel_range
        width = high - low
        given_low, given_high = float(pixels.min()), float(pixels.max())
        outside = given_low < low - RANGE_MARGIN * width or given_high > high + RANGE_MARGIN * width
        narrow = 0 < given_high - given_low < MIN_SPAN * width
        if width > 0 and (outside or narrow):
            raise ProbtransError(
                f"{what}: pixels in [{given_low:g}, {given_high:g}], but the training images' "
                f"were in [{low:g}, {high:g}]: scale them as the training images were (e.g. "
                f"multiply by {high / given_high if given_high else 1:.3g})"
            )


@dataclass
class DataBundle:
    """The splits of a task and what a model needs to know about its inputs.

    ``ood`` holds the named out-of-domain sets (possibly none), each scored against ``test``.
    Text bundles keep the ``tokenizer`` learned on their training split; image bundles the
    ``scaling`` of raw pixels. :meth:`encode` prepares new inputs with them."""

    name: str
    train: DataSplit
    val: DataSplit
    test: DataSplit
    ood: dict[str, DataSplit]
    class_names: list[str]
    kind: str  # "image" or "tokens"
    image_shape: tuple[int, int, int] | None = None
    vocab_size: int | None = None
    description: dict = field(default_factory=dict)
    tokenizer: Tokenizer | None = None
    scaling: ImageScaling = ImageScaling()

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    def encode(
        self, inputs: Sequence[str] | Any, what: str = "images"
    ) -> tuple[Tensor, Tensor | None]:
        """New inputs as the model takes them: texts → (token ids (N, L) long, mask (N, L) bool)
        with the bundle's tokenizer; raw images (N, C, H, W) or (N, H, W) → (images (N, C, H, W)
        float32 scaled as the training images (:class:`ImageScaling`), None). Raises
        ProbtransError naming ``what`` (the images' file) for inputs of the other kind, of
        another shape or scale, or texts without a tokenizer."""
        if self.kind == "tokens":
            if self.tokenizer is None:
                raise ProbtransError(
                    f"{self.name}: given as token ids, it has no tokenizer to read texts"
                )
            return encoder(self.tokenizer)(inputs)
        if isinstance(inputs, list | tuple) and inputs and isinstance(inputs[0], str):
            raise ProbtransError(f"{self.name}: an image data set; it cannot read texts")
        images = _as_tensor(inputs, f"{what}")
        if images.ndim == 3:
            images = images[:, None]
        if images.ndim != 4 or tuple(images.shape[1:]) != tuple(self.image_shape or ()):
            raise ProbtransError(
                f"{what} of shape {tuple(images.shape)}: this data set's images are (N, "
                f"{', '.join(map(str, self.image_shape or ()))})"
            )
        if self.scaling.pixel_range is None:  # kept once known: the splits do not change
            self.scaling = dataclasses.replace(self.scaling, pixel_range=self.pixel_range())
        pixels = self.scaling.pixels(images, what)
        self.scaling.check_range(pixels, what)
        return _check_inputs(self.scaling.standardise(pixels), "image", what), None

    def decode(self, ids: list[int]) -> str:
        """Token ids → the words the model sees (lower-cased, unknown words as [UNK])."""
        if self.tokenizer is None:
            raise ProbtransError(f"{self.name}: no tokenizer to decode token ids")
        return decoder(self.tokenizer)(ids)

    def pixel_range(self) -> tuple[float, float] | None:
        """The range of the training images' pixels (before standardisation): the scaling's,
        else the training split's (the validation split's where it is not kept); None for
        token ids."""
        if self.kind != "image":
            return None
        if self.scaling.pixel_range is not None:
            return self.scaling.pixel_range
        split = self.train if len(self.train) else self.val
        if not len(split):
            return None
        pixels = self.scaling.unstandardised(split.inputs)
        return float(pixels.min()), float(pixels.max())

    def standardised(self, mean: Sequence[float], std: Sequence[float], why: str) -> DataBundle:
        """A copy whose images are standardised per channel with ``mean`` and ``std`` (of
        pixels in [0, 1], e.g. a pretrained backbone's image processor's, ``why``) instead of
        its own scaling's; new inputs are scaled the same way."""
        old = self.scaling
        new = ImageScaling(old.eight_bit, tuple(mean), tuple(std), self.pixel_range())

        def again(split: DataSplit) -> DataSplit:
            pixels = old.unstandardised(split.inputs)
            return DataSplit(new.standardise(pixels), split.labels, split.mask)

        return dataclasses.replace(
            self,
            train=again(self.train),
            val=again(self.val),
            test=again(self.test),
            ood={name: again(split) for name, split in self.ood.items()},
            scaling=new,
            description={**self.description, "image_standardisation": why},
        )

    def splits(self) -> dict[str, DataSplit]:
        """The splits a run is evaluated on: ``val``, ``test`` and ``ood:NAME`` per set."""
        return {"val": self.val, "test": self.test} | {
            ood_split(name): split for name, split in self.ood.items()
        }

    @classmethod
    def from_tensors(
        cls,
        train: tuple[Any, Any],
        val: tuple[Any, Any] | None = None,
        test: tuple[Any, Any] | None = None,
        ood: Any | tuple[Any, Any] | dict[str, Any] | None = None,
        *,
        class_names: Sequence[str] | None = None,
        name: str = "tensors",
        vocab_size: int | None = None,
        val_fraction: float = _DEFAULTS.val_fraction,
        test_fraction: float = _DEFAULTS.test_fraction,
        seed: int = 0,
        kind: Literal["image", "tokens"] | None = None,
    ) -> DataBundle:
        """A bundle of arrays in memory (torch tensors or numpy arrays), each split an ``(x, y)``.

        ``x`` holds images, (N, C, H, W) or (N, H, W) (one channel added), or token ids, (N, L)
        integers with 0 as padding (mask ``x != 0``; every row needs a token). ``kind`` says
        which; by default float ``x`` are images and integer ``x`` token ids, and uint8 ``x``
        are refused as ambiguous. Integer images (``kind="image"``) are 8-bit pixels (0–255),
        scaled to [0, 1], as new images will be. ``y`` holds classes 0..C−1, C =
        ``len(class_names)`` or else the largest label + 1 (class names "0", "1", …). A missing
        ``val`` or ``test`` is split off ``train``, stratified by class and seeded by ``seed``
        (scikit-learn ``train_test_split``), the fractions being of the given ``train``. ``ood``
        is one out-of-domain set named "ood", or a dict of named sets, each ``x`` alone (labels
        :data:`NO_LABEL`) or a tuple ``(x, y)`` with classes or −1; by default there is none.
        ``vocab_size`` (token ids) defaults to the largest id + 1.

        Raises ProbtransError naming the argument and shape of the first problem.
        """
        where = "DataBundle.from_tensors"
        given = {"train": train, "val": val, "test": test}
        pairs = {s: _pair(v, s, where) for s, v in given.items() if v is not None}
        xs = {s: _as_tensor(x, f"{where}: {s} x") for s, (x, _) in pairs.items()}
        ys = {s: _labels_tensor(y, f"{where}: {s} y") for s, (_, y) in pairs.items()}
        for set_name, value in _named_sets(ood, where).items():
            s = ood_split(set_name)
            ood_x, ood_y = _pair(value, s, where) if isinstance(value, tuple) else (value, None)
            xs[s] = _as_tensor(ood_x, f"{where}: {s} x")
            ys[s] = (
                torch.full((len(xs[s]),), NO_LABEL, dtype=torch.long)
                if ood_y is None
                else _labels_tensor(ood_y, f"{where}: {s} y")
            )
        shapes = {s: tuple(x.shape) for s, x in xs.items()}  # as given, for messages
        if kind is None and str(getattr(pairs["train"][0], "dtype", "")).endswith("uint8"):
            raise ProbtransError(
                f"{where}: train x: dtype uint8: 8-bit images? pass kind='image'; token ids? "
                f"give them as int64"
            )
        kind = kind or _input_kind(xs["train"], f"{where}: train x")
        scaling = ImageScaling()
        if kind == "image" and not xs["train"].is_floating_point():
            scaling = ImageScaling(eight_bit=True)
            xs = {s: scaling.pixels(x, f"{where}: {s} x") for s, x in xs.items()}
        xs = {s: _check_inputs(x, kind, f"{where}: {s} x") for s, x in xs.items()}
        for s in pairs:
            if not len(xs[s]):
                raise ProbtransError(f"{where}: {s} x: shape {shapes[s]}; no rows")
        if kind == "image":
            _same_image_shape(xs, where)
        for s, y in ys.items():
            if len(y) != len(xs[s]):
                raise ProbtransError(
                    f"{where}: {s}: x has {len(xs[s])} rows (shape {shapes[s]}) but y "
                    f"has {len(y)} labels"
                )
        names = _class_names(class_names, ys, where)
        for s, y in ys.items():
            _check_classes(y, len(names), f"{where}: {s} y", allow_none=is_ood_split(s))
        rows = _split_rows(
            ys["train"].numpy(), "val" in xs, "test" in xs, val_fraction, test_fraction, seed, where
        )
        all_x, all_y = xs["train"], ys["train"]
        for s, index in rows.items():
            xs[s], ys[s] = all_x[index], all_y[index]
        vocab = None
        if kind == "tokens":
            vocab = _vocab_size(xs, vocab_size, where)

        def split(s: str) -> DataSplit:
            x = xs[s]
            return DataSplit(x, ys[s], x != 0 if kind == "tokens" else None)

        splits = {s: split(s) for s in xs}
        return cls(
            name=name,
            **_arranged(splits),
            class_names=names,
            kind=kind,
            image_shape=tuple(xs["train"].shape[1:]) if kind == "image" else None,
            vocab_size=vocab,
            description=_description("in-memory tensors", splits, rows, seed),
            scaling=scaling,
        )

    @classmethod
    def from_texts(
        cls,
        train: tuple[Sequence[str], Sequence[Any]],
        val: tuple[Sequence[str], Sequence[Any]] | None = None,
        test: tuple[Sequence[str], Sequence[Any]] | None = None,
        ood: Sequence[str] | dict[str, Any] | None = None,
        *,
        labels: Sequence[Any] | None = None,
        max_len: int = _DEFAULTS.max_len,
        vocab_size: int = _DEFAULTS.vocab_size,
        min_freq: int = _DEFAULTS.min_freq,
        name: str = "texts",
        val_fraction: float = _DEFAULTS.val_fraction,
        test_fraction: float = _DEFAULTS.test_fraction,
        seed: int = 0,
        tokenizer: str | None = None,
    ) -> DataBundle:
        """A bundle of labelled texts in memory, each split a ``(texts, labels)`` pair.

        Labels are strings or integers. ``labels`` lists the classes in order: the label values
        themselves, or, for integer labels 0..C−1, the C class names. Without it, string labels
        give the sorted distinct values as classes and integer labels are the classes 0..C−1
        (named "0", "1", …, C the largest label + 1). A missing ``val`` or ``test`` is split off
        ``train`` as in :meth:`from_tensors`. ``ood`` is one out-of-domain set of texts named
        "ood", or a dict of named sets, each texts alone or ``(texts, labels)`` with labels of
        the task's classes; by default there is none.

        The word-level tokenizer (:mod:`probtrans.data.tokenizer`) is learned on the training
        texts only, with ``max_len``, ``vocab_size`` and ``min_freq`` as in a model spec's
        ``[data]`` table (defaults from :class:`~probtrans.specs.DataSpec`). The bundle's
        ``encode`` and ``decode`` use it; ``tokenizer`` (a folder written by ``save_pretrained``
        or ``hf:ID``, as ``data.tokenizer``) is a pretrained one used instead. Raises
        ProbtransError naming the argument of the first problem.
        """
        where = "DataBundle.from_texts"
        spec = parse(
            DataSpec,
            {
                "name": name,
                "split_seed": seed,
                "max_len": max_len,
                "vocab_size": vocab_size,
                "min_freq": min_freq,
                "tokenizer": tokenizer,
            },
            where,
        )
        given = {"train": train, "val": val, "test": test}
        pairs = {s: _pair(v, s, where) for s, v in given.items() if v is not None}
        texts = {s: _texts(t, f"{where}: {s} texts") for s, (t, _) in pairs.items()}
        values = {s: _label_list(y, f"{where}: {s} labels") for s, (_, y) in pairs.items()}
        for s, t in texts.items():
            if len(t) != len(values[s]):
                raise ProbtransError(f"{where}: {s}: {len(t)} texts but {len(values[s])} labels")
        for set_name, value in _named_sets(ood, where).items():
            s = ood_split(set_name)
            ood_texts, ood_labels = (
                _pair(value, s, where) if isinstance(value, tuple) else (value, None)
            )
            texts[s] = _texts(ood_texts, f"{where}: {s} texts")
            if ood_labels is not None:
                values[s] = _label_list(ood_labels, f"{where}: {s} labels")
                if len(values[s]) != len(texts[s]):
                    raise ProbtransError(
                        f"{where}: {s}: {len(texts[s])} texts but {len(values[s])} labels"
                    )
        ys, names = class_indices(values, labels, where)
        rows = _split_rows(
            ys["train"], val is not None, test is not None, val_fraction, test_fraction, seed, where
        )
        all_texts, all_y = texts["train"], ys["train"]
        for s, index in rows.items():
            texts[s], ys[s] = [all_texts[i] for i in index], all_y[index]
        tokenizer = train_tokenizer(texts["train"], spec, strip_html=False)

        def split(s: str) -> DataSplit:
            ids = encode(tokenizer, texts[s]).long()
            y = ys.get(s)
            y = torch.full((len(ids),), NO_LABEL) if y is None else torch.from_numpy(y)
            return DataSplit(ids, y.long(), ids != pad_id(tokenizer))

        splits = {s: split(s) for s in texts}
        description = _description("in-memory texts", splits, rows, seed)
        description.update(max_len=spec.max_len, min_freq=spec.min_freq)
        return cls(
            name=name,
            **_arranged(splits),
            class_names=names,
            kind="tokens",
            vocab_size=tokenizer.get_vocab_size(),
            description=description,
            tokenizer=tokenizer,
        )


# ------------------------------------------------------------------ in-memory data: checks
def _named_sets(ood: Any, where: str) -> dict[str, Any]:
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


def _arranged(splits: dict[str, DataSplit]) -> dict[str, Any]:
    """``train``, ``val``, ``test`` and the ``ood:NAME`` splits as DataBundle's arguments."""
    return {s: splits[s] for s in ("train", "val", "test")} | {"ood": ood_sets(splits)}


def _pair(value: Any, split: str, where: str) -> tuple[Any, Any]:
    if not isinstance(value, tuple | list) or len(value) != 2:
        what = f"a {type(value).__name__}" + (
            f" of length {len(value)}" if isinstance(value, tuple | list) else ""
        )
        raise ProbtransError(f"{where}: {split} must be a pair (x, y), got {what}")
    return value[0], value[1]


def _as_tensor(value: Any, what: str) -> Tensor:
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


def _labels_tensor(value: Any, what: str) -> Tensor:
    y = _as_tensor(value, what)
    if y.ndim != 1:
        raise ProbtransError(f"{what}: labels must be 1-D (N,), got shape {tuple(y.shape)}")
    if y.is_floating_point() or y.dtype == torch.bool:
        raise ProbtransError(f"{what}: labels must be integers, got dtype {y.dtype}")
    return y.long()


def _input_kind(x: Tensor, what: str) -> str:
    if x.dtype == torch.bool:
        raise ProbtransError(
            f"{what}: dtype bool; give float images (N, C, H, W) or integer token ids (N, L)"
        )
    return "image" if x.is_floating_point() else "tokens"


def _check_inputs(x: Tensor, kind: str, what: str) -> Tensor:
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


def _same_image_shape(xs: dict[str, Tensor], where: str) -> None:
    shape = tuple(xs["train"].shape[1:])
    for s, x in xs.items():
        if tuple(x.shape[1:]) != shape:
            raise ProbtransError(
                f"{where}: {s} x: images of shape {tuple(x.shape[1:])} (C, H, W), but train "
                f"images are {shape}"
            )


def _class_names(class_names: Sequence[str] | None, ys: dict[str, Tensor], where: str) -> list[str]:
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


def _check_classes(y: Tensor, n_classes: int, what: str, allow_none: bool) -> None:
    low = NO_LABEL if allow_none else 0
    bad = ((y < low) | (y >= n_classes)).nonzero().flatten()
    if len(bad):
        row = int(bad[0])
        allowed = f"{low}..{n_classes - 1}" + (" (−1: no class)" if allow_none else "")
        raise ProbtransError(
            f"{what}: shape {tuple(y.shape)}; label {int(y[row])} at row {row} is outside the "
            f"classes {allowed}"
        )


def _vocab_size(xs: dict[str, Tensor], vocab_size: int | None, where: str) -> int:
    largest = max(int(x.max()) for x in xs.values() if len(x))
    if vocab_size is None:
        return max(largest + 1, 2)
    if largest >= vocab_size:
        s = next(s for s, x in xs.items() if len(x) and int(x.max()) == largest)
        raise ProbtransError(
            f"{where}: {s} x: token id {largest} is outside vocab_size = {vocab_size}"
        )
    return vocab_size


def _split_rows(
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


def _description(source: str, splits: dict[str, DataSplit], rows: dict, seed: int) -> dict:
    return {
        "source": source,
        "sizes": {s: len(split) for s, split in splits.items()},
        "split_off_train": sorted(s for s in rows if s != "train"),
        "split_seed": seed,
    }


def _texts(value: Any, what: str, empty_ok: bool = False) -> list[str]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ProbtransError(f"{what}: must be a list of strings, got a {type(value).__name__}")
    texts = list(value)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ProbtransError(f"{what}[{i}]: a {type(text).__name__}, not a string")
        if not text.strip():
            raise ProbtransError(f"{what}[{i}]: empty text")
    if not texts and not empty_ok:
        raise ProbtransError(f"{what}: no texts")
    return texts


def _label_list(value: Any, what: str) -> list[Any]:
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
