"""Attention kinds and their registry: ``kind`` in a model spec's ``[model.attention]`` table
names the options class (:mod:`probtrans.specs.attention`) and, here, the module built from it.

Each kind is a :class:`~probtrans.attention.base.MultiHeadAttention` subclass taking
``(d_model, n_heads, options)``.
"""

from __future__ import annotations

from typing import Any

from probtrans.attention.base import MultiHeadAttention, attention_sites, inducing_sites
from probtrans.attention.gaussian_mixture import GaussianMixtureAttention
from probtrans.attention.hierarchical import HierarchicalAttention
from probtrans.attention.sgpa import DecoupledSGPAttention, StandardSGPAttention
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
    """Build ``module`` for tables whose ``kind`` is that of the options class ``options``."""
    ATTENTION.register(kind_of(options), (options, module))


register_attention(SoftmaxOptions, SoftmaxAttention)
register_attention(StochasticOptions, StochasticAttention)
register_attention(HierarchicalOptions, HierarchicalAttention)
register_attention(SGPAOptions, DecoupledSGPAttention)
register_attention(StandardSGPAOptions, StandardSGPAttention)
register_attention(GaussianMixtureOptions, GaussianMixtureAttention)


def build_attention(options: Any, d_model: int, n_heads: int) -> MultiHeadAttention:
    """The attention module that ``options`` (an options instance) describes."""
    _, module = ATTENTION.get(options.kind, "model.attention.kind")
    return module(d_model, n_heads, options)


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
