"""Attention kinds and their registry: ``kind`` in a model spec's ``[model.attention]`` table
names the options class (:mod:`probtrans.specs.attention`) and, here, the module built from it.

Each kind is a :class:`~probtrans.attention.base.MultiHeadAttention` subclass built by keywords,
``(d_model, n_heads, **options)``, whose ``options_class`` is its options class; users import
them from :mod:`probtrans.nn`.
"""

from __future__ import annotations

from typing import Any

from probtrans.attention.base import MultiHeadAttention, attention_sites, inducing_sites
from probtrans.attention.gaussian_mixture import GaussianMixtureAttention
from probtrans.attention.hierarchical import HierarchicalStochasticAttention
from probtrans.attention.sgpa import SGPAttention, StandardSGPAttention
from probtrans.attention.softmax import SoftmaxAttention
from probtrans.attention.stochastic import StochasticAttention
from probtrans.registry import Registry
from probtrans.specs import (
    GaussianMixtureOptions,
    HierarchicalOptions,
    SGPAOptions,
    SoftmaxOptions,
    StandardSGPAOptions,
    StochasticOptions,
)
from probtrans.specs.attention import kind_of

#: kind → (options class, module class)
ATTENTION: Registry[tuple[type, type[MultiHeadAttention]]] = Registry("attention kind")


def register_attention(options: type, module: type[MultiHeadAttention]) -> None:
    """Build ``module`` for tables whose ``kind`` is that of the options class ``options`` (the
    module's ``options_class``)."""
    if getattr(module, "options_class", None) is not options:
        raise TypeError(f"{module.__name__}.options_class is not {options.__name__}")
    ATTENTION.register(kind_of(options), (options, module))


register_attention(SoftmaxOptions, SoftmaxAttention)
register_attention(StochasticOptions, StochasticAttention)
register_attention(HierarchicalOptions, HierarchicalStochasticAttention)
register_attention(SGPAOptions, SGPAttention)
register_attention(StandardSGPAOptions, StandardSGPAttention)
register_attention(GaussianMixtureOptions, GaussianMixtureAttention)


def build_attention(options: Any, d_model: int, n_heads: int) -> MultiHeadAttention:
    """The attention module that ``options`` (an options instance) describes."""
    _, module = ATTENTION.get(options.kind, "model.attention.kind")
    return module(d_model, n_heads, **options.model_dump(exclude={"kind"}))


def default_options(kind: str = "softmax", **overrides: Any) -> Any:
    """Options of ``kind`` with its defaults and ``overrides`` (for use from Python)."""
    options, _ = ATTENTION.get(kind, "kind")
    return options(**overrides)


__all__ = [
    "ATTENTION",
    "MultiHeadAttention",
    "attention_sites",
    "build_attention",
    "default_options",
    "inducing_sites",
    "register_attention",
]
