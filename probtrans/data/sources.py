"""Data sources by name: ``[data] name`` of a model spec chooses one of :data:`DATA_SOURCES`.

A source is a :class:`DataSource`: a loader from the ``[data]`` table
(:class:`~probtrans.specs.DataSpec`) and the spec's folder (where relative paths start) to a
:class:`~probtrans.data.bundle.DataBundle`, and whether its inputs are images. The named
out-of-domain sets of ``[[data.ood]]`` are added to the source's own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from probtrans.data.bundle import DataBundle
from probtrans.data.digits import held_out_name, load_digits_bundle
from probtrans.data.file_bundle import add_ood_sets, load_file_bundle
from probtrans.data.text_bundle import OOD_NAMES, load_text_bundle
from probtrans.registry import Registry
from probtrans.specs import DataSpec
from probtrans.specs.model import FILES


@dataclass(frozen=True)
class DataSource:
    """A registered data set: its loader, whether its inputs are images (positions are
    patches, so ``data.max_len`` does not apply; your files say it with ``data.kind``), and the
    names of the out-of-domain sets it brings itself (the ``[[data.ood]]`` sets come on top)."""

    load: Callable[[DataSpec, Path | None], DataBundle]
    image: bool = False
    ood_names: Callable[[DataSpec], list[str]] = lambda spec: []


#: ``data.name`` → source
DATA_SOURCES: Registry[DataSource] = Registry("data set")
DATA_SOURCES.register(
    "digits",
    DataSource(
        lambda spec, _: load_digits_bundle(spec),
        image=True,
        ood_names=lambda spec: [held_out_name(spec.ood_classes)],
    ),
)
TEXT_TASK = DataSource(
    lambda spec, _: load_text_bundle(spec), ood_names=lambda spec: [OOD_NAMES[spec.name]]
)
DATA_SOURCES.register("imdb", TEXT_TASK)  # CR as OOD
DATA_SOURCES.register("cola", TEXT_TASK)  # its out-of-domain dev
DATA_SOURCES.register("cr", TEXT_TASK)  # CoLA's out-of-domain dev
DATA_SOURCES.register(FILES, DataSource(load_file_bundle))  # your files: data.train (and the rest)


def is_image(spec: DataSpec) -> bool:
    """Whether the data of ``spec`` are images: your files of ``kind = "image"``, or an image
    data source."""
    return spec.kind == "image" or DATA_SOURCES.get(spec.name, "data.name").image


def ood_set_names(spec: DataSpec) -> list[str]:
    """The out-of-domain sets the data of ``spec`` will have, known without loading them."""
    return DATA_SOURCES.get(spec.name, "data.name").ood_names(spec) + [o.name for o in spec.ood]


def load_data(spec: DataSpec, base: Path | None = None) -> DataBundle:
    """The data set of a model spec's ``[data]`` table with its ``[[data.ood]]`` sets; relative
    paths start at ``base`` (the spec file's folder; default the working folder)."""
    bundle = DATA_SOURCES.get(spec.name, "data.name").load(spec, base)
    return add_ood_sets(bundle, spec.ood, spec, base)
