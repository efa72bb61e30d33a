"""The registry of attention kinds: ``kind`` → the :class:`MultiHeadAttention` subclass built
for a ``[model.attention]`` table of that kind.

Each kind's module registers its class with one line, ``register_attention(SoftmaxAttention)``;
the class's ``options_class`` is the kind's options class. The options of the kinds that
probtrans defines are registered without torch in :mod:`probtrans.specs.attention`; a plugin's
options class is registered there by the same call, so the kind joins the spec union, the JSON
Schema, ``describe`` and :mod:`probtrans.nn` at once.
"""

from __future__ import annotations

from probtrans.attention.multihead import MultiHeadAttention
from probtrans.registry import Registry
from probtrans.specs.attention import ATTENTION_OPTIONS, attention_kind, kind_of

#: ``[model.attention] kind`` → its attention class
ATTENTION: Registry[type[MultiHeadAttention]] = Registry("attention kind")


def register_attention(module: type[MultiHeadAttention]) -> type[MultiHeadAttention]:
    """Build ``module`` for attention tables of the kind of its ``options_class``, registering
    that options class under its kind if it is not yet (a plugin's); returns ``module``."""
    if not (isinstance(module, type) and issubclass(module, MultiHeadAttention)):
        raise TypeError(f"{module!r}: not a MultiHeadAttention subclass")
    options = module.options_class
    kind = kind_of(options)
    if kind not in ATTENTION_OPTIONS:
        attention_kind(options)
    elif ATTENTION_OPTIONS.get(kind, "kind") is not options:
        raise TypeError(
            f"{module.__name__}.options_class = {options.__name__}, but the kind {kind!r} has "
            f"the options {ATTENTION_OPTIONS.get(kind, 'kind').__name__}"
        )
    return ATTENTION.register(kind, module)
