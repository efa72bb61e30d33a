"""SGPA kernels against independent computations (DESIGN.md §3)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from probtrans.gp.kernels import gram, head_kernel, kernel_matmul

H, N, M, D = 3, 5, 4, 6


def random_kernel(name: str) -> torch.nn.Module:
    """Kernel with different, random hyperparameters per head and input dimension."""
    kernel = head_kernel(name, H, D).double()
    kernel.base_kernel.lengthscale = torch.rand(H, 1, D, dtype=torch.float64) + 0.5
    kernel.outputscale = torch.rand(H, dtype=torch.float64) + 0.5
    return kernel


def hyperparameters(kernel: torch.nn.Module) -> tuple[np.ndarray, np.ndarray]:
    """σ_f² (H,) and ℓ (H, D) as numpy arrays."""
    scale = kernel.outputscale.detach().numpy()
    return scale, kernel.base_kernel.lengthscale.detach().numpy()[:, 0]


@pytest.fixture
def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, H, N, D, generator=generator, dtype=torch.float64)
    y = torch.randn(2, H, M, D, generator=generator, dtype=torch.float64)
    return x, y


def test_exponential_kernel_matches_elementwise_formula(inputs):
    x, y = inputs
    kernel = random_kernel("exponential")
    scale, ell = hyperparameters(kernel)
    got = gram(kernel, x, y).detach().numpy()
    xs, ys = x.numpy(), y.numpy()
    for b in range(2):
        for h in range(H):
            for i in range(N):
                for j in range(M):
                    expected = scale[h] * math.exp(np.sum(xs[b, h, i] * ys[b, h, j] / ell[h] ** 2))
                    assert got[b, h, i, j] == pytest.approx(expected, rel=1e-10)


def test_ard_kernel_matches_elementwise_formula(inputs):
    x, y = inputs
    kernel = random_kernel("ard")
    scale, ell = hyperparameters(kernel)
    got = gram(kernel, x, y).detach().numpy()
    xs, ys = x.numpy(), y.numpy()
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
    kernel = head_kernel("exponential", H, D, lengthscale=D**0.25, outputscale=1.0).double()
    weights = gram(kernel, q, k)
    expected = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D), dim=-1)
    torch.testing.assert_close(weights / weights.sum(-1, keepdim=True), expected)


@pytest.mark.parametrize("name", ["exponential", "ard"])
def test_kernels_are_symmetric_positive_semidefinite_per_head(name, inputs):
    x, _ = inputs
    kernel = random_kernel(name)
    matrix = gram(kernel, x, x).detach()
    torch.testing.assert_close(matrix, matrix.transpose(-1, -2))
    assert torch.linalg.eigvalsh(matrix).min() > -1e-10
    diag = kernel(x, x, diag=True).detach()
    torch.testing.assert_close(diag, matrix.diagonal(dim1=-2, dim2=-1))


def test_global_keys_broadcast_over_the_batch(inputs):
    """K(k_g, q) with k_g (H, M, d) shared by all sequences equals the per-sequence computation."""
    x, y = inputs
    kernel = random_kernel("ard")
    shared = gram(kernel, y[0], x)  # (B, H, M, N)
    for b in range(2):
        torch.testing.assert_close(shared[b], gram(kernel, y[0], x[b]))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fused_exponential_kernel_attention_matches_the_dense_product(dtype):
    """K(x, x) v through the fused softmax kernel equals the dense Gram product, values and
    gradients (inputs, values, ℓ, σ_f²), with padding keys; entries spanning e^13."""
    g = torch.Generator().manual_seed(0)
    batch, tokens, d_v = 3, 7, 2
    key_mask = torch.ones(batch, tokens, dtype=torch.bool)
    key_mask[1, 4:] = False  # a padded sequence
    kernel = head_kernel("exponential", H, D).to(dtype)
    kernel.base_kernel.lengthscale = torch.rand(H, 1, D, generator=g).to(dtype) + 0.5
    kernel.outputscale = torch.rand(H, generator=g).to(dtype) + 0.5

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)

    x = 0.5 * draw(batch, H, tokens, D)
    v = draw(batch, H, tokens, d_v) * key_mask[:, None, :, None]
    weights = draw(batch, H, tokens, d_v)
    log_k = gram(kernel, x, x).log()
    assert log_k.max() - log_k.min() > 13
    x.requires_grad_(), v.requires_grad_()
    params = (x, v, kernel.base_kernel.raw_lengthscale, kernel.raw_outputscale)

    fused = kernel_matmul(kernel, x, v, key_mask)
    dense = gram(kernel, x, x) @ v
    grads_fused = torch.autograd.grad((fused * weights).sum(), params)
    grads_dense = torch.autograd.grad((dense * weights).sum(), params)
    tol = {"rtol": 1e-10, "atol": 1e-10} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-4}
    torch.testing.assert_close(fused, dense, **tol)
    real = key_mask[:, None, :, None].expand_as(v)
    names = ("x", "v", "ℓ", "σ_f²")
    for name, got, expected in zip(names, grads_fused, grads_dense, strict=True):
        if name == "v":  # padding keys are left out of the fused sum: no gradient to their values
            got, expected = got[real], expected[real]
        torch.testing.assert_close(got, expected, **tol, msg=f"gradient with respect to {name}")


def test_kernel_attention_of_other_kernels_is_the_dense_product(inputs):
    x, _ = inputs
    kernel = random_kernel("ard")
    v = torch.randn(*x.shape[:-1], 2, dtype=torch.float64)
    torch.testing.assert_close(kernel_matmul(kernel, x, v), gram(kernel, x, x) @ v)
