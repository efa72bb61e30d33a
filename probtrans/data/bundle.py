"""Data sets as tensors: splits for training, validation, in-domain test and out-of-domain test.

Every data source (:mod:`probtrans.data.sources`) returns a :class:`DataBundle`; models only see
:class:`DataSplit` tensors. Data held in memory become a bundle through
:meth:`DataBundle.from_tensors` (images or token ids) and :meth:`DataBundle.from_texts` (texts,
tokenised with a vocabulary learned on the training texts), their arguments checked and split by
:mod:`probtrans.data.in_memory`. A split whose rows have no class (out-of-domain data, inputs to
predict) carries the label :data:`~probtrans.data.in_memory.NO_LABEL`;
:meth:`DataSplit.unlabelled` builds one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from tokenizers import Tokenizer
from torch import Tensor

from probtrans.analysis.summary import is_ood_split, ood_split
from probtrans.data.in_memory import (
    NO_LABEL,
    arranged_splits,
    as_tensor,
    check_classes,
    check_inputs,
    check_same_image_shape,
    checked_class_names,
    checked_label_list,
    checked_pair,
    checked_texts,
    checked_vocab_size,
    class_indices,
    input_kind,
    labels_tensor,
    named_sets,
    split_description,
    split_rows,
)
from probtrans.data.tokenizer import decoder, encode, encoder, pad_id, train_tokenizer
from probtrans.errors import ProbtransError
from probtrans.specs import DataSpec
from probtrans.specs.base import parse

#: batches per pool of length-grouped shuffling (``DataSplit.batches(by_length=True)``)
POOL_BATCHES = 50
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
    Text bundles keep the ``tokenizer`` learned on their training split (``text_pairs``: their
    inputs are pairs of texts); image bundles the ``scaling`` of raw pixels. :meth:`encode`
    prepares new inputs with them."""

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
    text_pairs: bool = False

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    def encode(
        self, inputs: Sequence[str] | Any, what: str = "images", first: int = 0
    ) -> tuple[Tensor, Tensor | None]:
        """New inputs as the model takes them: texts (``text_pairs``: pairs of texts, as tuples) →
        (token ids (N, L) long, mask (N, L) bool) with the bundle's tokenizer; raw images (N, C, H,
        W) or (N, H, W) → (images (N, C, H, W) float32 scaled as the training images
        (:class:`ImageScaling`), None). Raises ProbtransError naming ``what`` (the images' file) for
        inputs of the other kind, of another shape or scale, or texts without a tokenizer; a bad
        text by its row, counted from ``first`` (the first row of a chunk of inputs)."""
        if self.kind == "tokens":
            if self.tokenizer is None:
                raise ProbtransError(
                    f"{self.name}: given as token ids, it has no tokenizer to read texts"
                )
            return encoder(self.tokenizer, self.text_pairs)(inputs, first)
        if isinstance(inputs, list | tuple) and inputs and isinstance(inputs[0], str):
            raise ProbtransError(f"{self.name}: an image data set; it cannot read texts")
        images = as_tensor(inputs, f"{what}")
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
        return check_inputs(self.scaling.standardise(pixels), "image", what), None

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
        pairs = {s: checked_pair(v, s, where) for s, v in given.items() if v is not None}
        xs = {s: as_tensor(x, f"{where}: {s} x") for s, (x, _) in pairs.items()}
        ys = {s: labels_tensor(y, f"{where}: {s} y") for s, (_, y) in pairs.items()}
        for set_name, value in named_sets(ood, where).items():
            s = ood_split(set_name)
            ood_x, ood_y = (
                checked_pair(value, s, where) if isinstance(value, tuple) else (value, None)
            )
            xs[s] = as_tensor(ood_x, f"{where}: {s} x")
            ys[s] = (
                torch.full((len(xs[s]),), NO_LABEL, dtype=torch.long)
                if ood_y is None
                else labels_tensor(ood_y, f"{where}: {s} y")
            )
        shapes = {s: tuple(x.shape) for s, x in xs.items()}  # as given, for messages
        if kind is None and str(getattr(pairs["train"][0], "dtype", "")).endswith("uint8"):
            raise ProbtransError(
                f"{where}: train x: dtype uint8: 8-bit images? pass kind='image'; token ids? "
                f"give them as int64"
            )
        kind = kind or input_kind(xs["train"], f"{where}: train x")
        scaling = ImageScaling()
        if kind == "image" and not xs["train"].is_floating_point():
            scaling = ImageScaling(eight_bit=True)
            xs = {s: scaling.pixels(x, f"{where}: {s} x") for s, x in xs.items()}
        xs = {s: check_inputs(x, kind, f"{where}: {s} x") for s, x in xs.items()}
        for s in pairs:
            if not len(xs[s]):
                raise ProbtransError(f"{where}: {s} x: shape {shapes[s]}; no rows")
        if kind == "image":
            check_same_image_shape(xs, where)
        for s, y in ys.items():
            if len(y) != len(xs[s]):
                raise ProbtransError(
                    f"{where}: {s}: x has {len(xs[s])} rows (shape {shapes[s]}) but y "
                    f"has {len(y)} labels"
                )
        names = checked_class_names(class_names, ys, where)
        for s, y in ys.items():
            check_classes(y, len(names), f"{where}: {s} y", allow_none=is_ood_split(s))
        rows = split_rows(
            ys["train"].numpy(), "val" in xs, "test" in xs, val_fraction, test_fraction, seed, where
        )
        all_x, all_y = xs["train"], ys["train"]
        for s, index in rows.items():
            xs[s], ys[s] = all_x[index], all_y[index]
        vocab = None
        if kind == "tokens":
            vocab = checked_vocab_size(xs, vocab_size, where)

        def split(s: str) -> DataSplit:
            x = xs[s]
            return DataSplit(x, ys[s], x != 0 if kind == "tokens" else None)

        splits = {s: split(s) for s in xs}
        return cls(
            name=name,
            **arranged_splits(splits),
            class_names=names,
            kind=kind,
            image_shape=tuple(xs["train"].shape[1:]) if kind == "image" else None,
            vocab_size=vocab,
            description=split_description("in-memory tensors", splits, rows, seed),
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

        Texts are strings, or for a sentence-pair task (entailment, paraphrase) pairs of
        strings, ``(text, text_pair)`` tuples, encoded as the tokenizer's pair (every split, out-
        of-domain sets and new inputs then pairs too); a split's texts are a list, a NumPy array
        or a pandas Series, its pairs an (N, 2) array or a two-column DataFrame too
        (:func:`~probtrans.data.rows.text_rows`).

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
        labelled = {s: checked_pair(v, s, where) for s, v in given.items() if v is not None}
        texts = {"train": checked_texts(labelled["train"][0], f"{where}: train texts", pairs=None)}
        text_pairs = isinstance(texts["train"][0], tuple)  # pairs of texts (checked: not empty)
        for s, (t, _) in labelled.items():
            if s != "train":
                texts[s] = checked_texts(t, f"{where}: {s} texts", pairs=text_pairs)
        values = {
            s: checked_label_list(y, f"{where}: {s} labels") for s, (_, y) in labelled.items()
        }
        for s, t in texts.items():
            if len(t) != len(values[s]):
                raise ProbtransError(f"{where}: {s}: {len(t)} texts but {len(values[s])} labels")
        for set_name, value in named_sets(ood, where).items():
            s = ood_split(set_name)
            ood_texts, ood_labels = (
                checked_pair(value, s, where) if isinstance(value, tuple) else (value, None)
            )
            texts[s] = checked_texts(ood_texts, f"{where}: {s} texts", pairs=text_pairs)
            if ood_labels is not None:
                values[s] = checked_label_list(ood_labels, f"{where}: {s} labels")
                if len(values[s]) != len(texts[s]):
                    raise ProbtransError(
                        f"{where}: {s}: {len(texts[s])} texts but {len(values[s])} labels"
                    )
        ys, names = class_indices(values, labels, where)
        rows = split_rows(
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
        description = split_description("in-memory texts", splits, rows, seed)
        description.update(max_len=spec.max_len, min_freq=spec.min_freq)
        return cls(
            name=name,
            **arranged_splits(splits),
            class_names=names,
            kind="tokens",
            vocab_size=tokenizer.get_vocab_size(),
            description=description,
            tokenizer=tokenizer,
            text_pairs=text_pairs,
        )
