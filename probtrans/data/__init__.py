"""Data sets as tensors: splits for training, validation, in-domain test and out-of-domain test.

Every loader returns a :class:`DataBundle`; models only see :class:`DataSplit` tensors, so a new
data set needs a loader and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor

from probtrans.config import DataSpec
from probtrans.errors import ConfigError


@dataclass
class DataSplit:
    """inputs: images (N, C, H, W) or token ids (N, L); mask: (N, L) bool or None; labels: (N,)."""

    inputs: Tensor
    labels: Tensor
    mask: Tensor | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def batches(
        self,
        batch_size: int,
        shuffle: bool = False,
        generator: torch.Generator | None = None,
        trim: bool = True,
    ) -> Iterator[tuple[Tensor, Tensor, Tensor | None, Tensor]]:
        """Yield (index, inputs, mask, labels) minibatches; ``index`` locates them in the split.

        With ``trim``, token batches drop the trailing columns that are padding in every row:
        padding gets exactly zero attention weight and no pooling weight, so dropping it cannot
        change any output (keep them when per-token outputs of batches are concatenated).
        """
        order = (
            torch.randperm(len(self), generator=generator) if shuffle else torch.arange(len(self))
        )
        for index in order.split(batch_size):
            inputs, mask = self.inputs[index], None
            if self.mask is not None and trim:
                real = self.mask[index].any(0).nonzero()
                length = int(real.max()) + 1 if len(real) else 1
                inputs, mask = inputs[:, :length], self.mask[index, :length]
            yield index, inputs, mask, self.labels[index]


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


def load_data(spec: DataSpec) -> DataBundle:
    """Load the data set named in a model spec's ``[data]`` table."""
    if spec.name == "digits":
        from probtrans.data.digits import load_digits_bundle

        return load_digits_bundle(spec)
    if spec.name in ("imdb", "cola"):
        from probtrans.data.tokenize import load_text_bundle

        return load_text_bundle(spec)
    raise ConfigError(f"data.name = {spec.name!r}: unknown data set")
