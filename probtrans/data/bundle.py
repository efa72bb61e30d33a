"""Data sets as tensors: splits for training, validation, in-domain test and out-of-domain test.

Every data source (:mod:`probtrans.data.sources`) returns a :class:`DataBundle`; models only see
:class:`DataSplit` tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor

#: batches per pool of length-grouped shuffling (``DataSplit.batches(by_length=True)``)
POOL_BATCHES = 50


@dataclass
class DataSplit:
    """inputs: images (N, C, H, W) or token ids (N, L); mask: (N, L) bool or None; labels: (N,)."""

    inputs: Tensor
    labels: Tensor
    mask: Tensor | None = None

    def __len__(self) -> int:
        return len(self.labels)

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
        for index in self._batch_indices(batch_size, shuffle, generator, by_length):
            inputs, mask = self.inputs[index], None
            if self.mask is not None and trim:
                real = self.mask[index].any(0).nonzero()
                length = int(real.max()) + 1 if len(real) else 1
                inputs, mask = inputs[:, :length], self.mask[index, :length]
            yield index, inputs, mask, self.labels[index]

    def _batch_indices(
        self, batch_size: int, shuffle: bool, generator: torch.Generator | None, by_length: bool
    ) -> list[Tensor]:
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


@dataclass
class DataBundle:
    """The four splits of a task and what a model needs to know about its inputs."""

    name: str
    train: DataSplit
    val: DataSplit
    test: DataSplit
    ood: DataSplit
    class_names: list[str]
    kind: str  # "image" or "tokens"
    image_shape: tuple[int, int, int] | None = None
    vocab_size: int | None = None
    description: dict = field(default_factory=dict)
    #: text data: token ids → the words the model sees (lower-cased, unknown words as [UNK])
    decode: Callable[[list[int]], str] | None = None

    @property
    def n_classes(self) -> int:
        return len(self.class_names)
