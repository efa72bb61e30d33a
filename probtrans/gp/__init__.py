"""Gaussian-process parts: SGPA's sparse GP on GPyTorch (Chen & Li, ICLR 2023) — kernels, the
decoupled and standard variational layers — and SNGP's random-feature head
(:mod:`probtrans.gp.sngp`). The guides of SGPA's inducing variables are in
:mod:`probtrans.guides.inducing`."""

from probtrans.gp.decoupled import (
    DecoupledConditional,
    decoupled_conditional,
    decoupled_conditional_reference,
)
from probtrans.gp.kernels import ExponentialKernel, gram, head_kernel
from probtrans.gp.linalg import decouple_padding, jittered_cholesky
from probtrans.gp.standard import StandardPosterior, standard_posterior

__all__ = [
    "DecoupledConditional",
    "ExponentialKernel",
    "StandardPosterior",
    "decouple_padding",
    "decoupled_conditional",
    "decoupled_conditional_reference",
    "gram",
    "head_kernel",
    "jittered_cholesky",
    "standard_posterior",
]
