"""Attention kinds, chosen by ``kind`` in the ``[model.attention]`` table of a model spec.

Each kind is a :class:`~probtrans.attention.base.MultiHeadAttention` subclass with an options
dataclass; :func:`register_attention` adds a new one.
"""

from __future__ import annotations

from typing import Any

from probtrans.attention.base import SELF_GUIDED, MultiHeadAttention, sample_attention
from probtrans.attention.gaussian_mixture import GaussianMixtureAttention, GaussianMixtureOptions
from probtrans.attention.hierarchical import HierarchicalAttention, HierarchicalOptions
from probtrans.attention.sgpa import (
    DecoupledSGPAttention,
    SGPAOptions,
    StandardSGPAOptions,
    StandardSGPAttention,
)
from probtrans.attention.softmax import SoftmaxAttention, SoftmaxOptions
from probtrans.attention.stochastic import StochasticAttention, StochasticOptions
from probtrans.errors import ConfigError

#: kind → (module class, options dataclass)
ATTENTION: dict[str, tuple[type[MultiHeadAttention], type]] = {}


def register_attention(kind: str, module: type[MultiHeadAttention], options: type) -> None:
    """Make ``kind = "<kind>"`` available in model specs."""
    ATTENTION[kind] = (module, options)


register_attention("softmax", SoftmaxAttention, SoftmaxOptions)
register_attention("sto", StochasticAttention, StochasticOptions)
register_attention("h_sto", HierarchicalAttention, HierarchicalOptions)
register_attention("sgpa", DecoupledSGPAttention, SGPAOptions)
register_attention("sgpa_standard", StandardSGPAttention, StandardSGPAOptions)
register_attention("gaussian_mixture", GaussianMixtureAttention, GaussianMixtureOptions)


def attention_options(table: dict, file: str = "<spec>", prefix: str = "model.attention") -> Any:
    """Options dataclass of the kind named in ``table["kind"]`` (default ``softmax``), validated."""
    from probtrans.config import build_dataclass

    kind = table.get("kind", "softmax")
    if kind not in ATTENTION:
        raise ConfigError(
            f"{file}: {prefix}.kind = {kind!r}: unknown attention (known: {', '.join(ATTENTION)})"
        )
    options = build_dataclass(ATTENTION[kind][1], table, file, prefix)
    for name in getattr(options, "positive", ()):
        value = getattr(options, name)
        if value is not None and not value > 0:
            raise ConfigError(f"{file}: {prefix}.{name} = {value!r}: must be > 0")
    if not 0.0 <= getattr(options, "dropout", 0.0) < 1.0:
        raise ConfigError(f"{file}: {prefix}.dropout = {options.dropout!r}: must be in [0, 1)")
    return options


def build_attention(
    options: Any, d_model: int, n_heads: int, site_prefix: str
) -> MultiHeadAttention:
    """Instantiate the attention module described by ``options``."""
    module, _ = ATTENTION[options.kind]
    return module(d_model, n_heads, options, site_prefix)


def default_options(kind: str = "softmax", **overrides: Any) -> Any:
    """Options of ``kind`` with its defaults and ``overrides`` (for use from Python)."""
    return ATTENTION[kind][1](**overrides)


__all__ = [
    "ATTENTION",
    "SELF_GUIDED",
    "MultiHeadAttention",
    "attention_options",
    "build_attention",
    "default_options",
    "register_attention",
    "sample_attention",
]
