"""Attention kinds and their registry: ``kind`` in a model spec's ``[model.attention]`` table
names the options class (:mod:`probtrans.specs.attention`) and the module built from it
(:data:`ATTENTION`, :mod:`probtrans.attention.kinds`).

Each kind is a :class:`~probtrans.attention.multihead.MultiHeadAttention` subclass built by
keywords, ``(d_model, n_heads, **options)``, whose ``options_class`` is its options class; its
module registers it (``register_attention(SoftmaxAttention)``), and users import it from
:mod:`probtrans.nn`. Importing this package imports every kind module, so that each registers.

Built on the kinds: :mod:`~probtrans.attention.encoder` (encoder blocks and the encoder, attention
by kind name) and :mod:`~probtrans.attention.em_adaptation` (inference-time EM of
Gaussian-mixture layers, Movellan & Gabbur 2020).
"""

from __future__ import annotations

# each kind module registers its kind
from probtrans.attention import gaussian_mixture, hierarchical, sgpa, softmax, stochastic  # noqa: F401
from probtrans.attention.kinds import ATTENTION, register_attention
from probtrans.attention.multihead import MultiHeadAttention, attention_sites, inducing_sites

__all__ = [
    "ATTENTION",
    "MultiHeadAttention",
    "attention_sites",
    "inducing_sites",
    "register_attention",
]
