"""Sparse Gaussian-process parts of SGPA (Chen & Li, ICLR 2023) on GPyTorch: kernels, the
decoupled and standard variational layers, and guides for the whitened inducing variables."""

from probtrans.gp.decoupled import (
    DecoupledConditional,
    decoupled_conditional,
    decoupled_conditional_reference,
)
from probtrans.gp.inducing_guides import INDUCING_GUIDES, AutoInducingCholesky
from probtrans.gp.kernels import ExponentialKernel, gram, head_kernel
from probtrans.gp.linalg import decouple_padding, jittered_cholesky
from probtrans.gp.standard import StandardPosterior, standard_posterior

__all__ = [
    "INDUCING_GUIDES",
    "AutoInducingCholesky",
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
