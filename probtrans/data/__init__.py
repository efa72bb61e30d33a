"""Data sets: splits as tensors (:mod:`~probtrans.data.bundle`), the sources that load them and
their registry (:mod:`~probtrans.data.sources`)."""

from probtrans.data.bundle import DataBundle, DataSplit
from probtrans.data.sources import DATA_SOURCES, load_data

__all__ = ["DATA_SOURCES", "DataBundle", "DataSplit", "load_data"]
