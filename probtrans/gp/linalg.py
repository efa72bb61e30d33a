"""Small linear-algebra helpers of the sparse-GP attention layers."""

from __future__ import annotations

import torch
from linear_operator.utils.errors import NotPSDError
from torch import Tensor

from probtrans.runtime.precision import autocast_off, full_precision


def jittered_cholesky(matrix: Tensor, jitter: float, max_tries: int = 10) -> Tensor:
    """Lower Cholesky factor of ``matrix + j I`` for the first j in jitter, 10·jitter, 100·jitter…

    As in the SGPA authors' code, a failed factorisation is retried with ten times the jitter;
    the whole batch shares one jitter. matrix: (..., N, N) → (..., N, N), factored in float32 or
    float64 (that of ``matrix``, if wider), never in an autocast region's bfloat16.
    Raises ``NotPSDError`` after ``max_tries`` failures (e.g. non-finite entries).
    """
    matrix = full_precision(matrix)
    eye = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
    with autocast_off(matrix):
        for _ in range(max_tries):
            factor, info = torch.linalg.cholesky_ex(matrix + jitter * eye)
            if not info.any():
                return factor
            jitter *= 10.0
    raise NotPSDError(
        f"matrix not positive definite even with jitter {jitter / 10.0:.1e} on the diagonal"
    )


def decouple_padding(matrix: Tensor, key_mask: Tensor | None) -> Tensor:
    """Covariance over tokens with padding tokens made independent unit-variance dummies.

    matrix: (*S, B, H, T, T); key_mask: (B, T), True for real tokens. Rows and columns of
    padding tokens become those of the identity, so factorisations never mix them with real
    tokens.
    """
    if key_mask is None:
        return matrix
    real = key_mask[..., None, :, None] & key_mask[..., None, None, :]  # (B, 1, T, T)
    eye = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
    return torch.where(real, matrix, eye)
