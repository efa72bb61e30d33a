"""Per-head kernels of SGPA (Chen & Li, ICLR 2023, §3.1 and §4), as GPyTorch kernels.

Each head has its own kernel hyperparameters: the kernels carry ``batch_shape = (H,)`` and act on
per-head inputs of shape (..., H, T, d_head). The signal variance σ_f² is GPyTorch's
``ScaleKernel.outputscale``; the length scales ℓ_i are the base kernel's ARD ``lengthscale``.

- exponential (text):  K(x, y) = σ_f² exp(Σ_i x_i y_i / ℓ_i²)
- ARD-RBF (images):    K(x, y) = σ_f² exp(−½ Σ_i (x_i − y_i)² / ℓ_i²)   (GPyTorch's ``RBFKernel``)

Queries and keys share one projection (W_q = W_k), so both kernels are symmetric and positive
definite on the keys, which is what makes kernel attention the mean of a sparse GP.
"""

from __future__ import annotations

import torch
from gpytorch.kernels import Kernel, RBFKernel, ScaleKernel
from torch import Tensor

from probtrans.runtime.precision import autocast_off, full_precision
from probtrans.specs.attention import KernelName


class ExponentialKernel(Kernel):
    """k(x, y) = exp(Σ_i x_i y_i / ℓ_i²): the exponential (dot-product) kernel with ARD scales.

    exp(q · k / ℓ²) with one ℓ² = √d is the unnormalised softmax attention weight; the kernel is
    positive definite because exp of a positive-definite (linear) kernel is.
    """

    has_lengthscale = True

    def forward(self, x1: Tensor, x2: Tensor, diag: bool = False, **params) -> Tensor:
        """x1: (..., N, d), x2: (..., M, d) → (..., N, M), or (..., N) with ``diag``."""
        x1_ = x1.div(self.lengthscale)  # lengthscale: (*batch_shape, 1, d)
        x2_ = x2.div(self.lengthscale)
        if diag:
            return (x1_ * x2_).sum(-1).exp()
        return (x1_ @ x2_.transpose(-1, -2)).exp()


def head_kernel(
    name: KernelName,
    n_heads: int,
    d_head: int,
    lengthscale: float = 1.0,
    outputscale: float = 1.0,
) -> ScaleKernel:
    """σ_f² × base kernel with ARD length scales, one set of hyperparameters per head.

    ``name`` is ``"exponential"`` (:class:`ExponentialKernel`) or ``"ard"`` (GPyTorch's
    ``RBFKernel``); ``lengthscale`` and ``outputscale`` (σ_f²) are the initial values.
    """
    heads = torch.Size([n_heads])
    base_cls = ExponentialKernel if name == "exponential" else RBFKernel
    base = base_cls(ard_num_dims=d_head, batch_shape=heads)
    base.lengthscale = torch.full((n_heads, 1, d_head), float(lengthscale))
    kernel = ScaleKernel(base, batch_shape=heads)
    kernel.outputscale = torch.full((n_heads,), float(outputscale))
    return kernel


def gram(kernel: Kernel, x1: Tensor, x2: Tensor) -> Tensor:
    """Dense kernel matrix: x1 (..., H, N, d), x2 (..., H, M, d) → (..., H, N, M), in float32
    or float64 (that of the inputs, if wider), never in an autocast region's bfloat16."""
    with autocast_off(x1):
        return kernel(full_precision(x1), full_precision(x2)).to_dense()


def median_distance(features: Tensor) -> float:
    """The median Euclidean distance between distinct rows of ``features`` (N, D): the RBF
    length scale of the median heuristic, at which the kernel of a typical pair is e^(−½)."""
    distances = torch.cdist(features.double(), features.double())
    pairs = torch.triu_indices(len(features), len(features), offset=1)
    return float(distances[pairs[0], pairs[1]].median())
