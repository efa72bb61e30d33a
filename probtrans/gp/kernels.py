"""Per-head kernels of SGPA (Chen & Li 2023, §4; DESIGN.md §3), as GPyTorch kernels.

Each head has its own kernel hyperparameters: the kernels carry ``batch_shape = (H,)`` and act on
per-head inputs of shape (..., H, T, d_head). The signal variance σ_f² is GPyTorch's
``ScaleKernel.outputscale``; the length scales ℓ_i are the base kernel's ARD ``lengthscale``.

- exponential (text):  K(x, y) = σ_f² exp(Σ_i x_i y_i / ℓ_i²)
- ARD-RBF (images):    K(x, y) = σ_f² exp(−½ Σ_i (x_i − y_i)² / ℓ_i²)   (GPyTorch's ``RBFKernel``)

Queries and keys share one projection (W_q = W_k), so both kernels are symmetric and positive
definite on the keys, which is what makes kernel attention the mean of a sparse GP.

Kernel attention K(x, x) v is the one T × T product of a decoupled SGPA layer
(:func:`kernel_matmul`). For the exponential kernel it goes through PyTorch's fused
``scaled_dot_product_attention``, which never stores the T × T matrix: on IMDB (T ≤ 512) the
dense product and its backward pass were most of an SGPA training step.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from gpytorch.kernels import Kernel, RBFKernel, ScaleKernel
from torch import Tensor


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


KernelName = Literal["exponential", "ard"]


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
    """Dense kernel matrix: x1 (..., H, N, d), x2 (..., H, M, d) → (..., H, N, M)."""
    return kernel(x1, x2).to_dense()


def kernel_matmul(
    kernel: ScaleKernel, x: Tensor, v: Tensor, key_mask: Tensor | None = None
) -> Tensor:
    """Kernel attention K(x, x) v per head: x (B, H, T, d_k), v (B, H, T, d_v) → (B, H, T, d_v).

    key_mask: (B, T), True for real tokens. Padding keys must carry zero values, so that they add
    nothing to the sum. Exponential kernel: :func:`exponential_kernel_matmul`, which also leaves
    them out of its normaliser; other kernels: the dense Gram matrix.
    """
    if isinstance(kernel.base_kernel, ExponentialKernel):
        return exponential_kernel_matmul(kernel, x, v, key_mask)
    return gram(kernel, x, x) @ v


def exponential_kernel_matmul(
    kernel: ScaleKernel, x: Tensor, v: Tensor, key_mask: Tensor | None = None
) -> Tensor:
    """σ_f² exp(x̃ x̃ᵀ) v with x̃ = x / ℓ, through the fused softmax attention kernel.

    The kernel rows are softmax attention's unnormalised weights exp(s_ij), with logits
    s_ij = x̃_i · x̃_j + log σ_f² (log σ_f² is a key feature paired with a constant query feature
    1). One more key, the sink, has logit 0 and value e (a new last output column, 0 for every
    other key), so with Z_i = Σ_j exp(s_ij) softmax attention returns

        o_i = [Σ_j exp(s_ij) v_j, 1] / (1 + Z_i),

    and the ratio of o_i's first columns to its last is exactly Σ_j K_ij v_j, whatever Z_i (the
    sink also keeps every row's softmax defined when all its keys are padding). Forward and
    backward cost O(B H T² d) time and O(B H T d) memory.
    """
    scaled = x / kernel.base_kernel.lengthscale  # x̃, (B, H, T, d_k); ℓ: (H, 1, d_k)
    log_scale = kernel.outputscale.log()[:, None, None].expand(*x.shape[:-1], 1)  # (B, H, T, 1)
    queries = torch.cat([scaled, torch.ones_like(log_scale)], -1)  # (B, H, T, d_k + 1)
    keys = F.pad(torch.cat([scaled, log_scale], -1), (0, 0, 0, 1))  # sink key 0: (B, H, T + 1, ·)
    sink_value = v.new_zeros(*v.shape[:-2], 1, v.shape[-1] + 1)
    sink_value[..., -1] = 1.0
    values = torch.cat([F.pad(v, (0, 1)), sink_value], -2)  # (B, H, T + 1, d_v + 1)
    mask = None if key_mask is None else F.pad(key_mask, (0, 1), value=True)[:, None, None, :]
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=1.0)
    return out[..., :-1] / out[..., -1:]
