"""Data sets: splits as tensors (:mod:`~probtrans.data.bundle`), the sources that load them and
their registry (:mod:`~probtrans.data.sources`), the file formats they are read from
(:mod:`~probtrans.data.formats`). The names below are imported on first use, so the table of
file formats loads without torch."""

from __future__ import annotations

import importlib
from typing import Any

#: name → the module that defines it
_EXPORTS = {
    "DATA_SOURCES": "probtrans.data.sources",
    "load_data": "probtrans.data.sources",
    "NO_LABEL": "probtrans.data.in_memory",
    "DataBundle": "probtrans.data.bundle",
    "DataSplit": "probtrans.data.bundle",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
