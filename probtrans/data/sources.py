"""Data sources by name: ``[data] name`` of a model spec chooses one of :data:`DATA_SOURCES`.

A source is a function from the ``[data]`` table (:class:`~probtrans.specs.DataSpec`) and the
spec's folder (where relative paths start) to a :class:`~probtrans.data.bundle.DataBundle`. The
named out-of-domain sets of ``[[data.ood]]`` are added to the source's own.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from probtrans.data.bundle import DataBundle
from probtrans.data.digits import load_digits_bundle
from probtrans.data.file_bundle import add_ood_sets, load_file_bundle
from probtrans.data.text_bundle import load_text_bundle
from probtrans.registry import Registry
from probtrans.specs import DataSpec
from probtrans.specs.model import FILES

DataSource = Callable[[DataSpec, Path | None], DataBundle]

#: ``data.name`` → loader
DATA_SOURCES: Registry[DataSource] = Registry("data set")
DATA_SOURCES.register("digits", lambda spec, _: load_digits_bundle(spec))  # sklearn 8×8 digits
DATA_SOURCES.register("imdb", lambda spec, _: load_text_bundle(spec))  # IMDB reviews, CR as OOD
DATA_SOURCES.register("cola", lambda spec, _: load_text_bundle(spec))  # CoLA, its OOD dev set
DATA_SOURCES.register(FILES, load_file_bundle)  # your files: data.train (and the rest)


def load_data(spec: DataSpec, base: Path | None = None) -> DataBundle:
    """The data set of a model spec's ``[data]`` table with its ``[[data.ood]]`` sets; relative
    paths start at ``base`` (the spec file's folder; default the working folder)."""
    bundle = DATA_SOURCES.get(spec.name, "data.name")(spec, base)
    return add_ood_sets(bundle, spec.ood, spec, base)
