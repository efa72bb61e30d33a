"""A mean-field head's variances at the ELBO's fixed point for its means
(``[guide] head_scales = "fixed_point"``).

The linear head θ = [W b] ∈ R^{C×(D+1)} over the features φ(x) (the ``features`` site), a
mean-field Gaussian guide q(θ) = Π_i N(μ_i, σ_i²) and a Normal(0, s²) prior on each entry. With the
expected log-likelihood taken to second order about the means, whose Hessian is the Gauss–Newton
matrix H of :func:`probtrans.inference.laplace.hessian` (the head is linear), the ELBO
E_q[Σ_n log p(y_n | θ, φ_n)] − β KL(q ‖ p) is stationary in each σ_i² where

    1/σ_i² = 1/s² + H_ii / β,        H_(c,j)(c,j) = Σ_n p_nc (1 − p_nc) φ̃_nj²,

the fixed point of Gaussian variational inference, Σ⁻¹ = Σ_prior⁻¹ + E_q[−∇²_θ log p(y | θ)]
(Opper & Archambeau 2009, Neural Computation 21(3), §2), restricted to a diagonal Σ and read at
the means. β is ``elbo.kl_weight``.

Why it is needed: SVI trains the means well, but Adam moves each (softplus-unconstrained) scale by
about its learning rate per step, so after a fine-tuning's few hundred steps at 1e-3 the head's
scales are still near ``guide.init_scale`` (0.01), far below where the ELBO puts them (on
all-MiniLM-L6-v2 fine-tuned with BLoB: 0.04–0.2 on CoLA and CR), and the predictive is that of
the means. The step runs once, after training, at the kept state: the means, the features and
every other site stay as SVI left them.
"""

from __future__ import annotations

import torch
from pyro.infer.autoguide import AutoNormal
from pyro.nn.module import PyroParam
from torch import Tensor, nn

from probtrans.classifier import Classifier
from probtrans.data import DataSplit
from probtrans.errors import ConfigError
from probtrans.inference.laplace import head_matrix, hessian_diagonal
from probtrans.inference.predictive import HEAD_SITES, global_sites, sample_predictive


def fixed_point_scales(
    features: Tensor, weight: Tensor, bias: Tensor, prior_scale: float, kl_weight: float = 1.0
) -> tuple[Tensor, Tensor]:
    """σ = (1/s² + diag H / β)^(−1/2) of the head's weight (C, D) and bias (C,) from the training
    features (N, D) and the head's means ``weight``, ``bias``."""
    head = head_matrix(weight, bias, features.device)
    precision = prior_scale**-2 + hessian_diagonal(features, head) / kl_weight  # (C, D+1)
    scales = precision.rsqrt().to(weight.dtype)
    return scales[:, :-1], scales[:, -1]


def head_guide(classifier: Classifier, guide: object, setting: str) -> AutoNormal:
    """The ``AutoNormal`` (the normal guide, or a part of an ``AutoGuideList``) over the head's
    sites, which draws the head independently of every other site; a ``ConfigError`` that
    starts with ``setting`` (the field and its value) where there is none."""
    if not HEAD_SITES <= set(classifier.prior_sites):
        raise ConfigError(
            f"{setting}: the head has no prior (model.prior.weights = 'none'), so it has no "
            f"posterior"
        )
    modules = guide.modules() if isinstance(guide, nn.Module) and hasattr(guide, "median") else []
    for module in modules:
        if isinstance(module, AutoNormal) and "head" in dict(module.locs.named_children()):
            return module
    raise ConfigError(
        f"{setting}: needs a mean-field Gaussian guide over the head (guide.name = 'normal'); "
        f"this guide has none ({type(guide).__name__})"
    )


def fixed_point_guide(
    classifier: Classifier, guide: object, kl_weight: float, field: str
) -> AutoNormal:
    """:func:`head_guide` for ``guide.head_scales = "fixed_point"`` (``field``), which also
    needs a KL term: a ``ConfigError`` naming ``field`` where the KL has no weight."""
    setting = f"{field} = 'fixed_point'"
    if kl_weight == 0:
        raise ConfigError(
            f"{setting}: with elbo.kl_weight = 0 the ELBO puts every scale at 0 (a point "
            f"estimate); use 'learned', or a positive kl_weight"
        )
    return head_guide(classifier, guide, f"{setting} (else use 'learned')")


@torch.no_grad()
def head_fixed_point(
    classifier: Classifier,
    guide: nn.Module,
    train: DataSplit,
    kl_weight: float,
    batch_size: int,
    device: str = "cpu",
) -> tuple[Tensor, Tensor]:
    """The fixed-point scales (:func:`fixed_point_scales`) of the head's weight (C, D) and bias
    (C,), from the training features with every global site at ``guide``'s median (one pass over
    ``train``, the network in evaluation mode). The head has one prior scale
    (``PyroClassifier.put_priors``)."""
    medians = guide.median()
    means = {site: medians[site][None] for site in global_sites(classifier)}  # (1, ...)
    features = sample_predictive(
        classifier, None, train, 1, batch_size, device, extra_sites=("features",), draws=means
    )["features"][0]
    return fixed_point_scales(
        torch.as_tensor(features),
        means["head.weight"][0].cpu(),
        means["head.bias"][0].cpu(),
        classifier.prior_scales["head.weight"],
        kl_weight,
    )


def put_head_scales(part: AutoNormal, weight: Tensor, bias: Tensor) -> tuple[float, float]:
    """Set the head scales of ``part`` (:func:`head_guide`) to ``weight`` and ``bias``; returns
    the median head scale before and after."""
    owner = part.scales.get_submodule("head")
    before = torch.cat([owner.weight.flatten(), owner.bias.flatten()]).median().item()
    on = owner.weight.device
    owner.weight = PyroParam(weight.to(on), part.scale_constraint)
    owner.bias = PyroParam(bias.to(on), part.scale_constraint)
    return before, torch.cat([weight.flatten(), bias.flatten()]).median().item()
