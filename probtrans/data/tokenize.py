"""Word-level token ids for text data, learned on the training split and cached on disk.

The vocabulary is a Hugging Face ``tokenizers`` WordLevel model trained on the training split only
(so validation, test and out-of-domain words unseen in training map to the unknown id): text is
lower-cased (IMDB reviews also have their ``<br />`` HTML line breaks replaced by spaces), split on
whitespace and between word characters and punctuation, and the ``data.vocab_size`` most frequent
words seen at least ``data.min_freq`` times are kept. Id 0 is padding, id 1 unknown. Sequences are
truncated to ``data.max_len`` tokens and padded to the longest sequence of their split.

Bundles are cached in ``$PROBTRANS_CACHE_DIR`` (default ``~/.cache/probtrans``) under a hash of the
source files' sizes and modification times, the protocol, the seed and the tokenisation settings,
so a second load neither re-reads nor re-tokenises the text.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from tokenizers import Tokenizer, normalizers, pre_tokenizers
from tokenizers.models import WordLevel
from tokenizers.trainers import WordLevelTrainer

from probtrans.checkpoint import atomic_write
from probtrans.config import DataSpec
from probtrans.data import DataBundle, DataSplit
from probtrans.data.text import (
    TASK_SOURCES,
    TextTask,
    load_text_task,
    source_description,
    source_fingerprint,
)

CACHE_DIR_ENV = "PROBTRANS_CACHE_DIR"
CACHE_FORMAT = 1  # bump when the cached content changes meaning
PAD, UNK = "[PAD]", "[UNK]"  # ids 0 and 1


def cache_dir() -> Path:
    """``$PROBTRANS_CACHE_DIR``, or ``~/.cache/probtrans`` when unset."""
    value = os.environ.get(CACHE_DIR_ENV)
    return Path(value) if value else Path.home() / ".cache" / "probtrans"


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


def cache_key(spec: DataSpec, sources: list[str]) -> str:
    """Hash of everything the cached bundle depends on."""
    settings = {
        "format": CACHE_FORMAT,
        "name": spec.name,
        "protocol": spec.protocol,
        "seed": spec.split_seed,
        "vocab_size": spec.vocab_size,
        "min_freq": spec.min_freq,
        "max_len": spec.max_len,
        "sources": [source_fingerprint(key) for key in sources],
    }
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:24]


def _tokenise(task: TextTask, spec: DataSpec) -> dict:
    tokenizer = train_tokenizer(task.train["text"], spec, strip_html=task.normalise_html)
    payload: dict = {
        "format": CACHE_FORMAT,
        "tokenizer": tokenizer.to_str(),
        "class_names": task.class_names,
    }
    for split in ("train", "val", "test", "ood"):
        rows = getattr(task, split)
        payload[f"{split}_ids"] = encode(tokenizer, rows["text"])
        payload[f"{split}_labels"] = torch.tensor(rows["label"], dtype=torch.long)
    return payload


def load_text_bundle(spec: DataSpec) -> DataBundle:
    """The tokenised :class:`DataBundle` of ``spec`` (IMDB or CoLA), from the cache if there."""
    key = cache_key(spec, TASK_SOURCES[spec.name])
    path = cache_dir() / f"{spec.name}-{spec.protocol}-{key}.pt"
    cached = path.is_file()
    if cached:
        payload = torch.load(path, weights_only=True)
    else:
        task = load_text_task(spec.name, spec.protocol, spec.split_seed)
        payload = _tokenise(task, spec)
        atomic_write(path, lambda tmp: torch.save(payload, tmp))
    tokenizer = Tokenizer.from_str(payload["tokenizer"])

    def split(name: str) -> DataSplit:
        ids = payload[f"{name}_ids"].long()
        return DataSplit(ids, payload[f"{name}_labels"], ids != 0)

    return DataBundle(
        name=spec.name,
        train=split("train"),
        val=split("val"),
        test=split("test"),
        ood=split("ood"),
        class_names=list(payload["class_names"]),
        kind="tokens",
        vocab_size=tokenizer.get_vocab_size(),
        description={
            "protocol": spec.protocol,
            "split_seed": spec.split_seed,
            "sources": {key: source_description(key) for key in TASK_SOURCES[spec.name]},
            "ood": "CR test sentences" if spec.name == "imdb" else "CoLA out-of-domain dev",
            "max_len": spec.max_len,
            "cache": str(path),
            "from_cache": cached,
        },
        decode=lambda ids: tokenizer.decode([i for i in ids if i != 0], skip_special_tokens=False),
    )
