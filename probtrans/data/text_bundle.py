"""The tokenised data bundle of a text task, cached on disk.

The rows of the task (:mod:`probtrans.data.text`) are tokenised with a vocabulary learned on its
training split (:mod:`probtrans.data.tokenizer`). Bundles are cached in ``$PROBTRANS_CACHE_DIR``
(default ``~/.cache/probtrans``) under a hash of the source files' sizes and modification times,
the protocol, the seed and the tokenisation settings, so a second load neither re-reads nor
re-tokenises the text. Cache files are checkpoints: tensors and strings, loaded safely, and every
part is checked when read (:func:`unpacked`). A cache file that cannot be read, lacks part of the
bundle or holds a damaged part (a tokenizer that does not parse, tensors of another type or
length) is set aside as ``NAME.pt.unreadable`` (replacing an older one) and rebuilt, with a note
saying so.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from tokenizers import Tokenizer

from probtrans.data.bundle import DataBundle, DataSplit
from probtrans.data.in_memory import NO_LABEL
from probtrans.data.text import (
    TASK_SOURCES,
    TextTask,
    load_text_task,
    source_description,
    source_fingerprint,
)
from probtrans.data.tokenizer import encode, pad_id, pretrained_tokenizer, train_tokenizer
from probtrans.errors import ProbtransError
from probtrans.specs import DataSpec
from probtrans.storage.checkpoint import load_cached, save_checkpoint

CACHE_DIR_ENV = "PROBTRANS_CACHE_DIR"
CACHE_FORMAT = 2  # bump when the cached content changes meaning
SPLITS = ("train", "val", "test", "ood")
#: the name and description of each data set's out-of-domain set
OOD_NAMES = {"imdb": "cr", "cola": "cola_ood", "cr": "cola_ood"}
OOD_DESCRIPTIONS = {"cr": "CR test sentences", "cola_ood": "CoLA out-of-domain dev"}
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
        "tokenizer": spec.tokenizer
        and hashlib.sha256(pretrained_tokenizer(spec).to_str().encode()).hexdigest(),
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


def unpacked(payload: dict) -> tuple[Tokenizer, list[str], dict[str, DataSplit]]:
    """The tokenizer, class names and splits of a cache payload (:func:`tokenise`), each part
    checked: a part that is not what :func:`tokenise` writes raises an error saying which."""
    try:
        tokenizer = Tokenizer.from_str(payload["tokenizer"])
    except Exception as err:  # the tokenizers library's own error: a damaged part
        raise ValueError(f"tokenizer: {err}") from None
    names = payload["class_names"]
    if not isinstance(names, list) or len(names) < 2 or not all(isinstance(n, str) for n in names):
        raise ValueError(f"class_names is not a list of class names: {names!r:.80}")
    vocab = tokenizer.get_vocab_size()
    splits = {}
    for name in SPLITS:
        ids, labels = payload[f"{name}_ids"], payload[f"{name}_labels"]
        if not isinstance(ids, torch.Tensor) or ids.ndim != 2 or ids.is_floating_point():
            raise ValueError(f"{name}_ids is not a tensor of token ids (N, L)")
        if not isinstance(labels, torch.Tensor) or labels.shape != (len(ids),):
            raise ValueError(f"{name}_labels is not a tensor of {len(ids)} labels (N,)")
        if labels.dtype != torch.long:
            raise ValueError(f"{name}_labels has dtype {labels.dtype}, not int64")
        if ids.numel() and not (0 <= int(ids.min()) and int(ids.max()) < vocab):
            raise ValueError(f"{name}_ids holds ids outside the tokenizer's {vocab} words")
        if len(labels) and not (NO_LABEL <= int(labels.min()) and int(labels.max()) < len(names)):
            raise ValueError(f"{name}_labels holds labels outside the {len(names)} classes")
        ids = ids.long()
        splits[name] = DataSplit(ids, labels, ids != pad_id(tokenizer))
    return tokenizer, list(names), splits


def load_text_bundle(spec: DataSpec) -> DataBundle:
    """The tokenised :class:`DataBundle` of ``spec`` (IMDB, CoLA or CR), from the cache if
    there."""
    key = cache_key(spec, TASK_SOURCES[spec.name])
    path = cache_dir() / f"{spec.name}-{spec.protocol}-{key}.pt"
    cached = load_cached(path, PAYLOAD_KEYS, unpacked)
    if cached is None:
        payload = tokenise(load_text_task(spec.name, spec.protocol, spec.split_seed), spec)
        try:
            save_checkpoint(path, payload)
        except OSError as err:
            raise ProbtransError(
                f"cache {path}: cannot be written ({err.strerror}); set ${CACHE_DIR_ENV} to a "
                f"writable folder"
            ) from None
    tokenizer, class_names, splits = unpacked(payload) if cached is None else cached
    return DataBundle(
        name=spec.name,
        train=splits["train"],
        val=splits["val"],
        test=splits["test"],
        ood={OOD_NAMES[spec.name]: splits["ood"]},
        class_names=class_names,
        kind="tokens",
        vocab_size=tokenizer.get_vocab_size(),
        description={
            "protocol": spec.protocol,
            "split_seed": spec.split_seed,
            "sources": {key: source_description(key) for key in TASK_SOURCES[spec.name]},
            "ood": OOD_DESCRIPTIONS[OOD_NAMES[spec.name]],
            "max_len": spec.max_len,
            "cache": str(path),
            "from_cache": cached is not None,
        },
        tokenizer=tokenizer,
    )
