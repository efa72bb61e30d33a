"""Data sets: splits as tensors (:mod:`~probtrans.data.bundle`), the sources that load them and
their registry (:mod:`~probtrans.data.sources`)."""

from probtrans.data.bundle import NO_LABEL, DataBundle, DataSplit
from probtrans.data.sources import DATA_SOURCES, load_data

__all__ = ["DATA_SOURCES", "NO_LABEL", "DataBundle", "DataSplit", "load_data"]
