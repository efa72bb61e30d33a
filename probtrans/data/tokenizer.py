"""Word-level tokenizer of text data, learned on a training split (Hugging Face ``tokenizers``).

Text is lower-cased (optionally with the ``<br />`` HTML line breaks of IMDB reviews replaced by
spaces) and split on whitespace and between word characters and punctuation; the ``vocab_size``
most frequent words seen at least ``min_freq`` times are kept. Id 0 is padding, id 1 unknown, so
words unseen in training map to the unknown id. Sequences are cut at ``max_len`` tokens and
padded to the longest of their batch.

:func:`encoder` and :func:`decoder` are what a :class:`~probtrans.data.bundle.DataBundle` of text
keeps (``encode``, ``decode``) to turn new texts into token ids and ids back into words.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tokenizers import Tokenizer, normalizers, pre_tokenizers
from tokenizers.models import WordLevel
from tokenizers.trainers import WordLevelTrainer

from probtrans.errors import ProbtransError
from probtrans.hub import backbone_folder, backbone_tokenizer
from probtrans.specs import DataSpec

PAD, UNK = "[PAD]", "[UNK]"  # ids 0 and 1


def pad_id(tokenizer: Tokenizer) -> int:
    """The id that pads the token ids of ``tokenizer`` (0 for a word-level one learned here)."""
    padding = tokenizer.padding
    return 0 if padding is None else int(padding["pad_id"])


def pretrained_tokenizer(spec: DataSpec) -> Tokenizer:
    """The pretrained tokenizer of ``data.tokenizer``, cutting at ``max_len`` tokens."""
    tokenizer = backbone_tokenizer(backbone_folder(spec.tokenizer, None, "data.tokenizer"))
    tokenizer.enable_truncation(spec.max_len)
    return tokenizer


def train_tokenizer(texts: list[str], spec: DataSpec, strip_html: bool) -> Tokenizer:
    """A word-level tokenizer whose vocabulary is learned from ``texts`` (the training split),
    or the pretrained one of ``data.tokenizer``."""
    if spec.tokenizer is not None:
        return pretrained_tokenizer(spec)
    steps = [normalizers.Replace("<br />", " ")] if strip_html else []
    tokenizer = Tokenizer(WordLevel(unk_token=UNK))
    tokenizer.normalizer = normalizers.Sequence([*steps, normalizers.Lowercase()])
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = WordLevelTrainer(
        vocab_size=spec.vocab_size, min_frequency=spec.min_freq, special_tokens=[PAD, UNK]
    )
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.enable_truncation(spec.max_len)
    tokenizer.enable_padding(pad_id=0, pad_token=PAD)  # to the longest sequence of a batch
    return tokenizer


def filling_max_len(mask: torch.Tensor, max_len: int) -> int:
    """How many rows of a token mask (N, L) fill all ``max_len`` tokens: the texts the
    tokenizer cut to them (without a word), and any exactly that long."""
    return int((mask.sum(1) >= max_len).sum())


def encode(tokenizer: Tokenizer, texts: list[str]) -> torch.Tensor:
    """Token ids (N, L) of ``texts``, L the longest (truncated) sequence, padded with
    :func:`pad_id`."""
    encodings = tokenizer.encode_batch(texts)
    if not encodings:
        return torch.zeros((0, 0), dtype=torch.int32)
    return torch.tensor([e.ids for e in encodings], dtype=torch.int32)


def encoder(tokenizer: Tokenizer) -> Callable[[list[str]], tuple[torch.Tensor, torch.Tensor]]:
    """texts → (token ids (N, L) long, mask (N, L) bool, true where ids are not padding) with
    ``tokenizer``;
    a text without a single word (empty or only white space) raises ProbtransError naming it."""

    def encode_texts(texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(texts, str):
            raise ProbtransError("encode: give a list of texts, not one string")
        texts = list(texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise ProbtransError(f"encode: text {i} is a {type(text).__name__}, not a string")
        ids = encode(tokenizer, texts).long()
        mask = ids != pad_id(tokenizer)
        empty = (~mask.any(1)).nonzero().flatten().tolist() if len(ids) else []
        if empty:
            raise ProbtransError(f"encode: text {empty[0]} ({texts[empty[0]]!r}) has no words")
        return ids, mask

    return encode_texts


def decoder(tokenizer: Tokenizer) -> Callable[[list[int]], str]:
    """token ids → the words the model sees (lower-cased, unknown words as ``[UNK]``), padding
    left out."""

    padding = pad_id(tokenizer)

    def decode_ids(ids: list[int]) -> str:
        return tokenizer.decode([int(i) for i in ids if i != padding], skip_special_tokens=False)

    return decode_ids
