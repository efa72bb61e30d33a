"""Data sources by name: ``[data] name`` of a model spec chooses one of :data:`DATA_SOURCES`.

A source is a function from the ``[data]`` table (:class:`~probtrans.specs.DataSpec`) to a
:class:`~probtrans.data.bundle.DataBundle`.
"""

from __future__ import annotations

from collections.abc import Callable

from probtrans.data.bundle import DataBundle
from probtrans.data.digits import load_digits_bundle
from probtrans.data.text_bundle import load_text_bundle
from probtrans.registry import Registry
from probtrans.specs import DataSpec

DataSource = Callable[[DataSpec], DataBundle]

#: ``data.name`` → loader
DATA_SOURCES: Registry[DataSource] = Registry("data set")
DATA_SOURCES.register("digits", load_digits_bundle)  # scikit-learn's 8×8 digits (embedded)
DATA_SOURCES.register("imdb", load_text_bundle)  # IMDB reviews, CR as out-of-domain
DATA_SOURCES.register("cola", load_text_bundle)  # CoLA, its out-of-domain dev set as OOD


def load_data(spec: DataSpec) -> DataBundle:
    """The data set of a model spec's ``[data]`` table."""
    return DATA_SOURCES.get(spec.name, "data.name")(spec)
