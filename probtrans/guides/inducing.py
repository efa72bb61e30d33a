"""Guides for the whitened SGPA inducing variables u_g, chosen by ``guide.inducing``.

Each decoupled SGPA layer has one global site ``{module}.u_g`` with prior N(0, I) and event shape
(H, d_head, M_g): one whitened inducing vector ε_hd ∈ R^{M_g} per head h and output dimension d
(Chen & Li 2023, §3.3, in the authors' whitened parameterisation). Every guide starts at the
prior's mean, 0; the Gaussian ones with standard deviation ``guide.inducing_init_scale``
(default 0.1). Starting at the prior's scale (1) makes every SGPA output as noisy as the prior
from the first step, and on the digits task the layers then collapse to the prior (the KL wins
before the likelihood has any signal to follow).

============ =================================================================================
``cholesky`` q(ε_hd) = N(μ_hd, L_hd L_hdᵀ), L_hd lower triangular with exp'd diagonal: the
             authors' full-rank parameterisation (:class:`AutoInducingCholesky`)
``diagonal`` mean-field N(μ, diag σ²) (``AutoNormal``)
``delta``    point mass (MAP) (``AutoDelta``)
============ =================================================================================
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.infer.autoguide import AutoGuide, AutoNormal
from pyro.infer.autoguide.utils import deep_setattr
from pyro.nn import PyroModule, PyroParam
from torch import Tensor, nn

from probtrans.guides.weights import NamedGuide, delta_guide, start_at
from probtrans.registry import Registry
from probtrans.specs import GuideSpec


def deep_getattr(obj: nn.Module, name: str) -> Tensor:
    """``obj.a.b.c`` for ``name = "a.b.c"`` (the inverse of Pyro's ``deep_setattr``)."""
    return functools.reduce(getattr, name.split("."), obj)


class AutoInducingCholesky(AutoGuide):
    """Full-rank Gaussian per (head, output dim) on sites with event shape (H, d, M).

    Parameters per site: ``locs.<site>`` (H, d, M) and ``scale_trils.<site>`` (H, d, M, M), the
    latter constrained to lower-triangular with positive (exponentiated) diagonal.
    """

    def __init__(self, model: Callable, init_scale: float = 0.1) -> None:
        self.init_scale = init_scale
        super().__init__(model)

    def _setup_prototype(self, *args, **kwargs) -> None:
        super()._setup_prototype(*args, **kwargs)
        self.locs = PyroModule()
        self.scale_trils = PyroModule()
        for name, site in self.prototype_trace.iter_stochastic_nodes():
            value = site["value"].detach()  # (H, d, M)
            eye = torch.eye(value.shape[-1], dtype=value.dtype, device=value.device)
            scale_tril = (self.init_scale * eye).expand(*value.shape, -1).clone()
            deep_setattr(self.locs, name, PyroParam(torch.zeros_like(value)))
            deep_setattr(
                self.scale_trils, name, PyroParam(scale_tril, constraint=constraints.lower_cholesky)
            )

    def distribution(self, name: str) -> dist.Distribution:
        """q of site ``name``: event shape (H, d, M)."""
        loc = deep_getattr(self.locs, name)
        scale_tril = deep_getattr(self.scale_trils, name)
        return dist.MultivariateNormal(loc, scale_tril=scale_tril).to_event(2)

    def forward(self, *args, **kwargs) -> dict[str, Tensor]:
        if self.prototype_trace is None:
            self._setup_prototype(*args, **kwargs)
        return {
            name: pyro.sample(name, self.distribution(name))
            for name, _ in self.prototype_trace.iter_stochastic_nodes()
        }

    @torch.no_grad()
    def median(self, *args, **kwargs) -> dict[str, Tensor]:
        if self.prototype_trace is None:
            self._setup_prototype(*args, **kwargs)
        return {
            name: deep_getattr(self.locs, name).detach()
            for name, _ in self.prototype_trace.iter_stochastic_nodes()
        }


#: ``guide.inducing`` → the guide of the inducing variables, built on the model restricted to
#: the u_g sites (which ``initial`` does not hold: they start at the prior's mean)
INDUCING_GUIDES: Registry[NamedGuide] = Registry("inducing guide")


def cholesky_guide(model: Callable, initial: dict[str, Tensor], spec: GuideSpec) -> AutoGuide:
    return AutoInducingCholesky(model, init_scale=spec.inducing_init_scale)


def diagonal_guide(model: Callable, initial: dict[str, Tensor], spec: GuideSpec) -> AutoGuide:
    return AutoNormal(model, init_loc_fn=start_at(initial), init_scale=spec.inducing_init_scale)


INDUCING_GUIDES.register("cholesky", NamedGuide(cholesky_guide, "full-rank normal"))
INDUCING_GUIDES.register("diagonal", NamedGuide(diagonal_guide, "mean-field normal"))
INDUCING_GUIDES.register("delta", NamedGuide(delta_guide, "MAP (point mass)"))
