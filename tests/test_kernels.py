"""SGPA kernels (Chen & Li 2023, §3.1 and §4) against independent computations, on the
``--device`` of the test run."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from probtrans.gp.kernels import gram, head_kernel

H, N, M, D = 3, 5, 4, 6


def random_kernel(name: str, device: torch.device) -> torch.nn.Module:
    """Kernel with different, random hyperparameters per head and input dimension."""
    kernel = head_kernel(name, H, D).double()
    kernel.base_kernel.lengthscale = torch.rand(H, 1, D, dtype=torch.float64) + 0.5
    kernel.outputscale = torch.rand(H, dtype=torch.float64) + 0.5
    return kernel.to(device)


def hyperparameters(kernel: torch.nn.Module) -> tuple[np.ndarray, np.ndarray]:
    """σ_f² (H,) and ℓ (H, D) as numpy arrays."""
    scale = kernel.outputscale.detach().cpu().numpy()
    return scale, kernel.base_kernel.lengthscale.detach().cpu().numpy()[:, 0]


@pytest.fixture
def inputs(device) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, H, N, D, generator=generator, dtype=torch.float64)
    y = torch.randn(2, H, M, D, generator=generator, dtype=torch.float64)
    return x.to(device), y.to(device)


def test_exponential_kernel_matches_elementwise_formula(inputs):
    x, y = inputs
    kernel = random_kernel("exponential", x.device)
    scale, ell = hyperparameters(kernel)
    got = gram(kernel, x, y).detach().cpu().numpy()
    xs, ys = x.cpu().numpy(), y.cpu().numpy()
    for b in range(2):
        for h in range(H):
            for i in range(N):
                for j in range(M):
                    expected = scale[h] * math.exp(np.sum(xs[b, h, i] * ys[b, h, j] / ell[h] ** 2))
                    assert got[b, h, i, j] == pytest.approx(expected, rel=1e-10)


def test_ard_kernel_matches_elementwise_formula(inputs):
    x, y = inputs
    kernel = random_kernel("ard", x.device)
    scale, ell = hyperparameters(kernel)
    got = gram(kernel, x, y).detach().cpu().numpy()
    xs, ys = x.cpu().numpy(), y.cpu().numpy()
    for b in range(2):
        for h in range(H):
            for i in range(N):
                for j in range(M):
                    sq = np.sum((xs[b, h, i] - ys[b, h, j]) ** 2 / ell[h] ** 2)
                    expected = scale[h] * math.exp(-0.5 * sq)
                    assert got[b, h, i, j] == pytest.approx(expected, rel=1e-8)


def test_exponential_kernel_is_unnormalised_softmax_attention(inputs):
    """With ℓ² = √d and σ_f² = 1, normalising the kernel rows gives softmax(q kᵀ / √d)."""
    q, k = inputs
    kernel = head_kernel("exponential", H, D, lengthscale=D**0.25, outputscale=1.0)
    kernel.to(q.device, torch.float64)
    weights = gram(kernel, q, k)
    expected = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D), dim=-1)
    torch.testing.assert_close(weights / weights.sum(-1, keepdim=True), expected)


@pytest.mark.parametrize("name", ["exponential", "ard"])
def test_kernels_are_symmetric_positive_semidefinite_per_head(name, inputs):
    x, _ = inputs
    kernel = random_kernel(name, x.device)
    matrix = gram(kernel, x, x).detach()
    torch.testing.assert_close(matrix, matrix.transpose(-1, -2))
    assert torch.linalg.eigvalsh(matrix).min() > -1e-10
    diag = kernel(x, x, diag=True).detach()
    torch.testing.assert_close(diag, matrix.diagonal(dim1=-2, dim2=-1))


def test_global_keys_broadcast_over_the_batch(inputs):
    """K(k_g, q) with k_g (H, M, d) shared by all sequences equals the per-sequence computation."""
    x, y = inputs
    kernel = random_kernel("ard", x.device)
    shared = gram(kernel, y[0], x)  # (B, H, M, N)
    for b in range(2):
        torch.testing.assert_close(shared[b], gram(kernel, y[0], x[b]))
