"""Word-level tokenizer of text data, learned on a training split (Hugging Face ``tokenizers``).

Text is lower-cased (optionally with the ``<br />`` HTML line breaks of IMDB reviews replaced by
spaces) and split on whitespace and between word characters and punctuation; the ``vocab_size``
most frequent words seen at least ``min_freq`` times are kept. Id 0 is padding, id 1 unknown, so
words unseen in training map to the unknown id. Sequences are cut at ``max_len`` tokens and
padded to the longest of their batch.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, normalizers, pre_tokenizers
from tokenizers.models import WordLevel
from tokenizers.trainers import WordLevelTrainer

from probtrans.specs import DataSpec

PAD, UNK = "[PAD]", "[UNK]"  # ids 0 and 1


def train_tokenizer(texts: list[str], spec: DataSpec, strip_html: bool) -> Tokenizer:
    """A word-level tokenizer whose vocabulary is learned from ``texts`` (the training split)."""
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


def encode(tokenizer: Tokenizer, texts: list[str]) -> torch.Tensor:
    """Token ids (N, L) of ``texts``, L the longest (truncated) sequence; padding is id 0."""
    encodings = tokenizer.encode_batch(texts)
    return torch.tensor([e.ids for e in encodings], dtype=torch.int32)
