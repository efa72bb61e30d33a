"""Spec schemas (pydantic), near the bottom of probtrans: no torch, no Pyro.

:func:`read_model_spec` and :func:`read_inference_spec` check a file against its schema;
:func:`probtrans.resolve.load_model_spec` and ``load_inference_spec`` also check the registry
names it uses.
"""

from __future__ import annotations

import os

from probtrans.specs.attention import AttentionOptions
from probtrans.specs.base import (
    Spec,
    SpecFile,
    parse,
    read_spec,
    read_spec_text,
    read_toml,
    updated,
)
from probtrans.specs.comparison import Comparison, Method
from probtrans.specs.inference import (
    ElboSpec,
    GuideSpec,
    InferenceSpec,
    OptimSpec,
    PathsSpec,
    PredictiveSpec,
    TrainSpec,
)
from probtrans.specs.model import DataSpec, HeadSpec, ModelSpec, NetworkSpec, PriorSpec


def read_model_spec(path: str | os.PathLike[str], text: str | None = None) -> ModelSpec:
    """A model spec file checked against its schema (e.g. ``models/digits/h_sto.toml``);
    ``text``, if given, is its content."""
    return read_spec(ModelSpec, path, text)


def read_inference_spec(path: str | os.PathLike[str], text: str | None = None) -> InferenceSpec:
    """An inference spec file checked against its schema (e.g. ``inference/mfvi.toml``);
    ``text``, if given, is its content."""
    return read_spec(InferenceSpec, path, text)


__all__ = [
    "AttentionOptions",
    "Comparison",
    "DataSpec",
    "ElboSpec",
    "GuideSpec",
    "HeadSpec",
    "InferenceSpec",
    "Method",
    "ModelSpec",
    "NetworkSpec",
    "OptimSpec",
    "PathsSpec",
    "PredictiveSpec",
    "PriorSpec",
    "Spec",
    "SpecFile",
    "TrainSpec",
    "parse",
    "read_inference_spec",
    "read_model_spec",
    "read_spec",
    "read_spec_text",
    "read_toml",
    "updated",
]
