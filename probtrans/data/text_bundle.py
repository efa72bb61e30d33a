"""The tokenised data bundle of a text task, cached on disk.

The rows of the task (:mod:`probtrans.data.text`) are tokenised with a vocabulary learned on its
training split (:mod:`probtrans.data.tokenizer`). Bundles are cached in ``$PROBTRANS_CACHE_DIR``
(default ``~/.cache/probtrans``) under a hash of the source files' sizes and modification times,
the protocol, the seed and the tokenisation settings, so a second load neither re-reads nor
re-tokenises the text. Cache files are checkpoints: tensors and strings, loaded safely. A cache
file that cannot be read, or lacks part of the bundle, is set aside as ``NAME.pt.unreadable``
(replacing an older one) and rebuilt, with a note saying so.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from tokenizers import Tokenizer

from probtrans.checkpoint import load_cached, save_checkpoint
from probtrans.data.bundle import DataBundle, DataSplit
from probtrans.data.text import (
    TASK_SOURCES,
    TextTask,
    load_text_task,
    source_description,
    source_fingerprint,
)
from probtrans.data.tokenizer import encode, train_tokenizer
from probtrans.errors import ProbtransError
from probtrans.specs import DataSpec

CACHE_DIR_ENV = "PROBTRANS_CACHE_DIR"
CACHE_FORMAT = 2  # bump when the cached content changes meaning
SPLITS = ("train", "val", "test", "ood")
#: the name of each data set's out-of-domain set
OOD_NAMES = {"imdb": "cr", "cola": "cola_ood"}
#: what a cache file holds (:func:`tokenise`)
PAYLOAD_KEYS = ["tokenizer", "class_names"] + [
    f"{s}_{k}" for s in SPLITS for k in ("ids", "labels")
]


def cache_dir() -> Path:
    """``$PROBTRANS_CACHE_DIR``, or ``~/.cache/probtrans`` when unset."""
    value = os.environ.get(CACHE_DIR_ENV)
    return Path(value) if value else Path.home() / ".cache" / "probtrans"


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


def tokenise(task: TextTask, spec: DataSpec) -> dict:
    """The cache payload: the tokenizer as JSON, class names, token ids and labels per split."""
    tokenizer = train_tokenizer(task.train["text"], spec, strip_html=task.normalise_html)
    payload: dict = {"tokenizer": tokenizer.to_str(), "class_names": task.class_names}
    for split in SPLITS:
        rows = getattr(task, split)
        payload[f"{split}_ids"] = encode(tokenizer, rows["text"])
        payload[f"{split}_labels"] = torch.tensor(rows["label"], dtype=torch.long)
    return payload


def load_text_bundle(spec: DataSpec) -> DataBundle:
    """The tokenised :class:`DataBundle` of ``spec`` (IMDB or CoLA), from the cache if there."""
    key = cache_key(spec, TASK_SOURCES[spec.name])
    path = cache_dir() / f"{spec.name}-{spec.protocol}-{key}.pt"
    payload = load_cached(path, PAYLOAD_KEYS)
    cached = payload is not None
    if payload is None:
        payload = tokenise(load_text_task(spec.name, spec.protocol, spec.split_seed), spec)
        try:
            save_checkpoint(path, payload)
        except OSError as err:
            raise ProbtransError(
                f"cache {path}: cannot be written ({err.strerror}); set ${CACHE_DIR_ENV} to a "
                f"writable folder"
            ) from None
    tokenizer = Tokenizer.from_str(payload["tokenizer"])

    def split(name: str) -> DataSplit:
        ids = payload[f"{name}_ids"].long()
        return DataSplit(ids, payload[f"{name}_labels"], ids != 0)

    return DataBundle(
        name=spec.name,
        train=split("train"),
        val=split("val"),
        test=split("test"),
        ood={OOD_NAMES[spec.name]: split("ood")},
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
        tokenizer=tokenizer,
    )
