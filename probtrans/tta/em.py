"""``em``: Probabilistic Transformers' inference-time adaptation (Movellan & Gabbur 2020,
Eq. 29–30), for models with Gaussian-mixture attention.

In every Gaussian-mixture attention layer the units' keys ξ adapt to the queries by EM under a
Gaussian prior N(ξ⁰, θ_ξ⁻¹ I) centred on the trained keys
(:func:`probtrans.attention.em_adaptation.em_keys`), then, with ``precision=True``, the query
precisions α under a Gamma prior whose mode is the trained α
(:func:`probtrans.attention.em_adaptation.em_precision`), then the layer infers its values. A
layer's units are the tokens of one input, so each input adapts its own units to its own queries:
nothing is shared between the inputs of a batch or between batches, and the predictions do not
depend on how the inputs are batched. Every forward pass adapts while the adaptation is open (the
layers' ``adaptation`` hooks, restored when it ends).
"""

from __future__ import annotations

import contextlib
from typing import Annotated, Literal

from pydantic import Field
from torch import Tensor, nn

from probtrans.attention import MultiHeadAttention
from probtrans.attention.em_adaptation import adapting, em_keys, em_precision, mixture_layers
from probtrans.attention.gaussian_mixture import Mixture
from probtrans.errors import ProbtransError
from probtrans.specs.base import Positive, PositiveInt, Spec
from probtrans.tta.method import AdaptationMethod, register_adaptation


class EmOptions(Spec):
    """EM adaptation of Gaussian-mixture attention (Eq. 29–30), in every mixture layer.

    The defaults are those that ``benchmarks/adaptation.py --tune`` chose on the digits
    validation split (never the test split) under the digits-C corruptions: the best accuracy
    averaged over severities 3–5, losing at most 0.5 points of clean accuracy. Weak adaptation
    won: one EM step of the keys with a strong prior (θ_ξ = 10), and no precision step (Eq. 30
    lowered validation accuracy in every setting tried; ``precision=True`` turns it on, with the
    best of its priors tried, θ_α1 = 100).
    """

    method: Literal["em"] = "em"
    n_iter: PositiveInt = 1
    """EM steps of the keys (Eq. 29), then as many of the precisions (Eq. 30)."""
    theta_xi: Positive = 10.0
    """Precision θ_ξ of the keys' Gaussian prior around the trained keys: small follows the
    queries, large keeps the trained keys."""
    anchor: Literal["trained", "previous"] = "trained"
    """Centre of the keys' prior: the trained keys (the paper) or the previous iterate."""
    precision: bool = False
    """Also adapt the query precisions α (Eq. 30) after the keys."""
    theta_alpha1: Annotated[float, Field(gt=1)] = 100.0
    """Shape θ_α1 > 1 of the precisions' Gamma prior: large keeps the trained α."""
    theta_alpha2: Positive | None = None
    """Rate θ_α2 of the Gamma prior; None puts its mode (θ_α1 − 1)/θ_α2 on the trained α."""


def attention_kinds(classifier: nn.Module) -> list[str]:
    """The attention kinds of the layers of ``classifier``, sorted."""
    return sorted(
        {
            getattr(layer.options, "kind", type(layer).__name__)
            for layer in classifier.modules()
            if isinstance(layer, MultiHeadAttention)
        }
    )


@register_adaptation
class EmAdaptation(AdaptationMethod):
    """The mixture layers' units adapted to each forward pass's queries (:meth:`update`)."""

    name = "em"
    options_class = EmOptions

    def check(self) -> None:
        self.layers = mixture_layers(self.classifier)
        if not self.layers:
            kinds = ", ".join(repr(kind) for kind in attention_kinds(self.classifier)) or "none"
            raise ProbtransError(
                f"test-time adaptation 'em' adapts Gaussian-mixture attention and this "
                f"model's attention is {kinds}: use 'tent' (entropy minimisation over the "
                f"LayerNorm parameters), which adapts any model"
            )

    def enter(self, stack: contextlib.ExitStack) -> None:
        stack.enter_context(adapting(self.classifier, self.update, self.layers))

    def update(self, q: Tensor, mix: Mixture) -> Mixture:
        """One layer's units adapted to its queries q (B, H, L, d): keys, then precisions."""
        o = self.options
        mix = em_keys(q, mix, o.n_iter, o.theta_xi, o.anchor, query_mask=mix.mask)
        if o.precision:
            mix = em_precision(
                q, mix, o.n_iter, o.theta_alpha1, o.theta_alpha2, query_mask=mix.mask
            )
        return mix
