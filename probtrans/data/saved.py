"""A data set saved in a run folder, so that the run is evaluated and asked about new inputs
with the folder alone: after the training files and the cache are gone, on another machine.

Files (:data:`DATA_FILES`):
    data.json       what the data are: kind, class names, image shape, vocabulary size, image
                    scaling, the splits and out-of-domain sets with their sizes, the description
    tokenizer.json  text data: the tokenizer learned on the training split (Hugging Face
                    ``tokenizers``' own format: ``Tokenizer.from_file`` reads it)
    data.pt         the splits the run is evaluated on (validation, test, every out-of-domain
                    set) and, when asked (a post-hoc Laplace is fitted on it), the training split:
                    token ids stored without padding, images as their 8-bit pixels where they
                    came from 8-bit pixels (a quarter of float32), else as float32; a
                    tensors-only checkpoint

Loading rebuilds tensors equal to the ones saved, padding included, so a run evaluates to the
same numbers from its folder as from its data files.

``data.json`` and ``data.pt`` both keep the SHA-256 of the run's ``checkpoint.pt`` they were
saved with (``checkpoint_sha256``): data copied from another run are :class:`ForeignData`, not
read as this run's. Files saved before they kept it are read as they are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from tokenizers import Tokenizer

from probtrans.analysis.summary import ood_sets
from probtrans.data.bundle import DataBundle, DataSplit, ImageScaling
from probtrans.errors import ProbtransError
from probtrans.specs.base import explain
from probtrans.storage.checkpoint import load_checkpoint, require, save_checkpoint
from probtrans.storage.io import (
    DamagedFile,
    check_is_file,
    checked_read,
    read_json,
    write_json,
    write_text,
)

DATA_FILES = ("data.json", "data.pt", "tokenizer.json")
FORMAT = 1


class _Checked(BaseModel):
    """A table of ``data.json``, checked when read: types not converted (an integer is a
    number), keys written by later versions ignored."""

    model_config = ConfigDict(strict=True, extra="ignore")


class SavedScaling(_Checked):
    eight_bit: bool
    mean: list[float] | None
    std: list[float] | None
    #: absent in runs written before it was kept
    pixel_range: Annotated[list[float], Field(min_length=2, max_length=2)] | None = None


class SavedData(_Checked):
    """What ``data.json`` must hold (:func:`save_bundle` writes it)."""

    format: Literal[1]
    name: str
    kind: Literal["image", "tokens"]
    class_names: list[str]
    image_shape: list[int] | None
    vocab_size: int | None
    tokenizer: bool
    #: whether the texts are pairs (absent in runs written before pairs were read: single texts)
    text_pairs: bool = False
    scaling: SavedScaling
    description: dict
    #: the SHA-256 of the checkpoint saved with them (absent in runs written before it was kept)
    checkpoint_sha256: str | None = None


class ForeignData(ProbtransError):
    """A run folder's saved data were saved with another checkpoint than the folder's."""


def save_bundle(
    folder: Path, bundle: DataBundle, checkpoint: str | None, with_train: bool = False
) -> None:
    """Write ``bundle`` into the run folder ``folder`` (the files of the module docstring);
    ``checkpoint``: the SHA-256 of the folder's ``checkpoint.pt``, kept by both files."""
    splits = bundle.splits() | ({"train": bundle.train} if with_train else {})
    packed: dict = {name: _pack(split, bundle.scaling) for name, split in splits.items()}
    save_checkpoint(folder / "data.pt", {**packed, "checkpoint_sha256": checkpoint})
    if bundle.tokenizer is not None:
        write_text(folder / "tokenizer.json", bundle.tokenizer.to_str(pretty=True))
    scaling = bundle.scaling
    write_json(
        folder / "data.json",
        {
            "format": FORMAT,
            "name": bundle.name,
            "kind": bundle.kind,
            "class_names": bundle.class_names,
            "image_shape": list(bundle.image_shape) if bundle.image_shape else None,
            "vocab_size": bundle.vocab_size,
            "tokenizer": bundle.tokenizer is not None,  # token ids given as such have none
            "text_pairs": bundle.text_pairs,
            "scaling": {
                "eight_bit": scaling.eight_bit,
                "mean": scaling.mean,
                "std": scaling.std,
                "pixel_range": bundle.pixel_range(),
            },
            "sizes": {name: len(split) for name, split in splits.items()},
            "train_saved": with_train,
            "description": bundle.description,
            "checkpoint_sha256": checkpoint,
        },
    )


def load_saved_bundle(folder: Path, checkpoint: str | None) -> DataBundle | None:
    """The data set saved in run folder ``folder``, or None if it has none (a run written
    before runs kept their data). Without a saved training split, ``train`` is empty.
    ``checkpoint``: the SHA-256 of the folder's ``checkpoint.pt``; data saved with another
    raise :class:`ForeignData`."""
    info_path = folder / "data.json"
    if not info_path.exists():
        return None
    info = read_saved_data(info_path)
    path = folder / "data.pt"
    packed = require(load_checkpoint(path), path, ["val", "test"])
    for file, kept in (
        (info_path, info.checkpoint_sha256),
        (path, packed.get("checkpoint_sha256")),
    ):
        if kept is not None and kept != checkpoint:
            raise ForeignData(
                f"{file} was not saved with this run's checkpoint.pt (copied from another run?)"
            )
    scaling = ImageScaling(
        info.scaling.eight_bit,
        tuple(info.scaling.mean) if info.scaling.mean else None,
        tuple(info.scaling.std) if info.scaling.std else None,
        tuple(info.scaling.pixel_range) if info.scaling.pixel_range else None,  # else from val
    )
    tokenizer = None
    if info.tokenizer:
        tokenizer_path = check_is_file(folder / "tokenizer.json", "file (the run's tokenizer)")
        with checked_read(tokenizer_path, "tokenizer"):
            tokenizer = Tokenizer.from_file(str(tokenizer_path))
        size = tokenizer.get_vocab_size()
        if info.vocab_size is not None and size != info.vocab_size:
            raise DamagedFile(
                tokenizer_path,
                f"not the run's tokenizer: {size} words, the run's has {info.vocab_size} "
                f"(data.json)",
            )
    with checked_read(path, "saved data"):
        splits = {
            name: _unpack(value, scaling)
            for name, value in packed.items()
            if isinstance(value, dict)
        }
        missing = [name for name in ("val", "test") if name not in splits]
        if missing:
            raise ValueError(f"no {' nor '.join(missing)} split")
        if "train" not in splits:  # kept only where needed: an empty split of the same kind
            splits["train"] = splits["val"][:0]
    return DataBundle(
        name=info.name,
        train=splits["train"],
        val=splits["val"],
        test=splits["test"],
        ood=ood_sets(splits),
        class_names=info.class_names,
        kind=info.kind,
        image_shape=tuple(info.image_shape) if info.image_shape else None,
        vocab_size=info.vocab_size,
        description=info.description,
        tokenizer=tokenizer,
        scaling=scaling,
        text_pairs=info.text_pairs,
    )


def saved_with(folder: Path) -> str | None:
    """The SHA-256 of the checkpoint that the data saved in run folder ``folder`` were saved
    with: None without saved data, or for data saved before it was kept."""
    path = folder / "data.json"
    return read_saved_data(path).checkpoint_sha256 if path.is_file() else None


def read_saved_data(path: Path) -> SavedData:
    """``data.json`` of a run folder, checked: a damaged file, or a field missing or of the
    wrong type, raises :class:`~probtrans.storage.io.DamagedFile` naming the file and the field."""
    try:
        return SavedData.model_validate(read_json(path, expect=dict))
    except ValidationError as err:
        problem = explain(SavedData, err)
        raise DamagedFile(path, f"damaged run data description: {problem}") from None


def _pack(split: DataSplit, scaling: ImageScaling) -> dict[str, torch.Tensor]:
    if split.mask is None:  # images: their 8-bit pixels where scaling them gives them back
        if scaling.eight_bit and len(split):
            pixels = _pixels(split.inputs, scaling)
            if torch.equal(scaling(pixels), split.inputs):
                return {"pixels": pixels, "labels": split.labels}
        return {"inputs": split.inputs, "labels": split.labels}
    lengths = split.mask.sum(1)
    dtype = torch.int16 if len(split) == 0 or int(split.inputs.max()) < 2**15 else torch.int32
    if not torch.equal(split.mask, _leading(lengths, split.inputs.shape[1])):  # inner padding
        return {"dense_ids": split.inputs.to(dtype), "mask": split.mask, "labels": split.labels}
    return {
        "ids": split.inputs[split.mask].to(dtype),  # every row's tokens, without padding
        "lengths": lengths,
        "width": torch.tensor(split.inputs.shape[1]),
        "labels": split.labels,
    }


def _unpack(packed: dict[str, torch.Tensor], scaling: ImageScaling) -> DataSplit:
    if "pixels" in packed:
        return DataSplit(scaling(packed["pixels"]), packed["labels"])
    if "inputs" in packed:
        return DataSplit(packed["inputs"], packed["labels"])
    if "dense_ids" in packed:
        ids = packed["dense_ids"].long()
        return DataSplit(ids, packed["labels"], packed.get("mask", ids != 0))
    mask = _leading(packed["lengths"], int(packed["width"]))
    ids = torch.zeros(mask.shape, dtype=torch.long)
    ids[mask] = packed["ids"].long()
    return DataSplit(ids, packed["labels"], mask)


def _pixels(inputs: torch.Tensor, scaling: ImageScaling) -> torch.Tensor:
    """The 8-bit pixels (N, C, H, W) that ``scaling`` maps to (about) ``inputs``."""
    return (scaling.unstandardised(inputs) * 255.0).round().clamp(0, 255).to(torch.uint8)


def _leading(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """The mask (N, width) of rows whose ``lengths`` tokens come first, then padding."""
    return torch.arange(width)[None, :] < lengths[:, None]
