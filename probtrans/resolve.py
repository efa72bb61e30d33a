"""Name resolution: the names a spec uses (a data set, a guide, an inducing-variable guide, the
post-hoc predictives, an uncertainty score, the monitored metric) are checked against their
registries, one layer above them.

:func:`load_model_spec` and :func:`load_inference_spec` read a spec file, check it against its
schema (:mod:`probtrans.specs`) and then check every registry name in it, so a typo stops a run
before any data is read, with one line naming the file and the field. :func:`json_schema` gives
the schema of a spec kind with those names filled in as choices, for editors.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from probtrans.analysis.metrics import METRICS, UNCERTAINTY_SCORES, ranked_metric
from probtrans.analysis.results import PLAIN
from probtrans.data import DataBundle
from probtrans.data.sources import DATA_SOURCES, is_image, load_data
from probtrans.errors import ConfigError
from probtrans.guides.inducing import INDUCING_GUIDES
from probtrans.guides.weights import GUIDES
from probtrans.hub import (
    Backbone,
    backbone_folder,
    check_reads_texts,
    image_statistics,
    resolve_backbone,
)
from probtrans.registry import Registry
from probtrans.specs import (
    Comparison,
    InferenceSpec,
    ModelSpec,
    read_inference_spec,
    read_model_spec,
)
from probtrans.specs.base import SpecFile, updated
from probtrans.specs.inference import POSTHOC

#: (dotted field, registry) of every registry name a spec file holds (a name, or a list of
#: names), per spec class (the fields' TOML names are their attribute names)
NAMES: dict[type[SpecFile], list[tuple[str, Registry]]] = {
    ModelSpec: [("data.name", DATA_SOURCES)],
    InferenceSpec: [
        ("guide.name", GUIDES),
        ("guide.inducing", INDUCING_GUIDES),
        ("predictive.posthoc", POSTHOC),
        ("predictive.ood_score", UNCERTAINTY_SCORES),
        ("train.monitor", METRICS),
    ],
}


def check_names(spec: SpecFile) -> None:
    """Raise ConfigError naming the file and field of the first unknown registry name (or
    ``train.monitor`` naming a metric that is neither better higher nor lower)."""
    for dotted, registry in NAMES.get(type(spec), []):
        value = functools.reduce(getattr, dotted.split("."), spec)
        if isinstance(value, list):
            for index, name in enumerate(value):
                registry.get(name, f"{spec.file}: {dotted}[{index}]")
        else:
            registry.get(value, f"{spec.file}: {dotted}")
    if isinstance(spec, InferenceSpec):
        ranked_metric(spec.train.monitor, f"{spec.file}: train.monitor")


def load_model_spec(path: str | os.PathLike[str], text: str | None = None) -> ModelSpec:
    """Read a model spec (e.g. ``models/digits/h_sto.toml``; ``text``: its content, if given)
    and check its names."""
    spec = read_model_spec(path, text)
    check_names(spec)
    check_positions(spec)
    return spec


def check_positions(spec: ModelSpec) -> None:
    """Raise ConfigError naming the file when the tokens of a text (``data.max_len``) exceed
    the network's positions; images (patches) are not checked, nor a backbone's positions
    (:func:`probtrans.classifier.check_backbone_data` does, once it is loaded)."""
    if spec.network.backbone is not None:
        return
    if not is_image(spec.data) and spec.data.max_len > spec.network.max_positions:
        raise ConfigError(
            f"{spec.file}: data.max_len = {spec.data.max_len}: must be at most "
            f"model.max_positions = {spec.network.max_positions}"
        )


def load_inference_spec(path: str | os.PathLike[str], text: str | None = None) -> InferenceSpec:
    """Read an inference spec (e.g. ``inference/mfvi.toml``; ``text``: its content, if given)
    and check its names."""
    spec = read_inference_spec(path, text)
    check_names(spec)
    return spec


def with_local_backbone(spec: ModelSpec) -> tuple[ModelSpec, Backbone | None]:
    """``spec`` with ``data.tokenizer`` as a local folder (a hub id fetched into the Hugging
    Face cache once) and text data read by the ``model.backbone``'s tokenizer unless
    ``data.tokenizer`` names another; and the ``model.backbone`` resolved once (fetched here,
    so that its errors come before any data is read; None without one), to be carried to
    :func:`as_backbone_reads` and :func:`probtrans.classifier.build_classifier`."""
    changes = {}
    base = spec_folder(spec)
    backbone = None
    if spec.network.backbone is not None:
        label = f"{spec.file}: model.backbone"
        backbone = resolve_backbone(spec.network.backbone, base, label)
        if spec.data.tokenizer is None and not is_image(spec.data):
            check_reads_texts(backbone.config, f"{label} = {spec.network.backbone!r}")
            changes["data.tokenizer"] = str(backbone.folder)
    if spec.data.tokenizer is not None and "data.tokenizer" not in changes:
        field = f"{spec.file}: data.tokenizer"
        changes["data.tokenizer"] = str(backbone_folder(spec.data.tokenizer, base, field))
    return (updated(spec, changes, spec.file) if changes else spec), backbone


def as_backbone_reads(data: DataBundle, backbone: Backbone | None) -> DataBundle:
    """``data`` as the ``backbone`` reads them: images standardised with the statistics of its
    image processor (instead of ``data.normalize``'s), where it has one for their channels;
    texts as they are (``data.tokenizer`` already read them)."""
    if backbone is None or data.kind != "image":
        return data
    statistics = image_statistics(backbone.folder)
    if statistics is None or len(statistics[0]) != (data.image_shape or (0,))[0]:
        return data
    return data.standardised(*statistics, f"the image processor of {backbone.ref}")


def read_as_backbone(spec: ModelSpec) -> tuple[DataBundle, Backbone | None]:
    """The data of ``spec``'s ``[data]`` as :func:`probtrans.runs.fitting.fit` reads them
    (:func:`with_local_backbone`, then :func:`as_backbone_reads`), and the resolved backbone."""
    read_as, backbone = with_local_backbone(spec)
    return as_backbone_reads(load_data(read_as.data, spec_folder(spec)), backbone), backbone


def spec_folder(spec: SpecFile) -> Path | None:
    """Where the relative paths of a spec read from a file start: the file's folder (None for a
    spec made in Python: the working folder)."""
    file = Path(spec.file)
    return file.parent if file.is_file() else None


def json_schema(cls: type[SpecFile]) -> dict:
    """JSON Schema of the spec class ``cls`` (TOML names), registry names as ``enum``s."""
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **cls.model_json_schema(by_alias=True, mode="validation"),
    }
    for dotted, registry in NAMES.get(cls, []):
        table, key = dotted.split(".")
        definition = schema["$defs"][schema["properties"][table]["$ref"].rsplit("/", 1)[-1]]
        field = definition["properties"][key]
        (field["items"] if field.get("type") == "array" else field)["enum"] = registry.names()
    if cls is Comparison:  # a method reads the plain predictive or a post-hoc one
        variant = schema["$defs"]["Method"]["properties"]["variant"]
        variant["enum"] = [PLAIN, *POSTHOC.names()]
    return schema
