"""Attention layers and a transformer encoder to put in your own Pyro model.

Every attention kind is a ``PyroModule`` built by keywords; the options, their defaults and
bounds are those of the kind's options class in :mod:`probtrans.specs.attention` (the same
options as a model spec's ``[model.attention]`` table), and a wrong name or value raises a
``TypeError`` or ``ValueError`` naming the layer and the option::

    from probtrans.nn import Encoder, HierarchicalStochasticAttention, StochasticAttention

    attn = StochasticAttention(d_model=64, n_heads=4, tau=0.5)
    y = attn(x, mask)  # x (B, L, 64), mask (B, L) bool, True for real tokens → (B, L, 64)
    encoder = Encoder(64, 4, n_layers=2, d_ff=128, attention="h_sto", tau2=20.0)

A layer's random attention weights are Pyro sample sites named after where the layer sits:
held as ``self.attn1`` of your ``PyroModule`` its site is ``attn1.a_v``; an :class:`Encoder`
held as ``self.encoder`` has ``encoder.layers.0.attn.a_v``, … Hold them in a ``PyroModule``
(lists in ``PyroModule[nn.ModuleList]``), so that the names follow the module path, and call
them inside your model's data plate. These sites are self-guided (their guide is their own
distribution, the training objective of Pei et al. 2022 and Chen & Li 2023): build the guide on
``probtrans.self_guided(model)`` (:func:`probtrans.inference.objective.self_guided`), e.g.
``AutoNormal(probtrans.self_guided(model))``, and train with that same model; an autoguide
built on the model itself refuses. SGPA layers also have a global site ``u_g`` (inducing
variables, e.g. ``encoder.layers.0.attn.u_g``) for the guide: draw it outside the data plate
by reading ``layer.u_g`` once before entering the plate. Under Pyro's vectorised plates
(``Predictive(..., parallel=True)``) layers and encoders take sample dimensions on the left,
x (*S, B, L, d_model) with the mask (B, L) (:mod:`probtrans.attention.multihead`).

Kinds (equations in their modules' docstrings): :class:`SoftmaxAttention` (deterministic),
:class:`StochasticAttention` (STO-TRANS), :class:`HierarchicalStochasticAttention`
(H-STO-TRANS), :class:`SGPAttention` (decoupled SGPA), :class:`StandardSGPAttention` (standard
SGPA), :class:`GaussianMixtureAttention` (Probabilistic Transformers). :class:`EncoderBlock`
and :class:`Encoder` map (B, L, d_model) → (B, L, d_model) with any of them.
"""

from __future__ import annotations

from probtrans.attention import ATTENTION, MultiHeadAttention
from probtrans.attention.encoder import Encoder, EncoderBlock


def attention_classes() -> dict[str, type[MultiHeadAttention]]:
    """The class of every registered attention kind (a plugin's too), by class name."""
    return {module.__name__: module for module in ATTENTION.entries()}


def __getattr__(name: str) -> type[MultiHeadAttention]:
    """``probtrans.nn.StochasticAttention``, …: the attention classes, from the registry."""
    classes = attention_classes()
    if name not in classes:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return classes[name]


def __dir__() -> list[str]:
    return sorted([*globals(), *attention_classes()])


#: the layers (for ``from probtrans.nn import *``: the kinds registered when it is imported)
__all__ = ["Encoder", "EncoderBlock", *attention_classes()]
