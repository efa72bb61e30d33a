"""Transformer encoder: embeddings, N blocks (pre- or post-LayerNorm), pooling.

Written as plain ``torch.nn`` so it reads in one sitting; :class:`probtrans.model.Classifier`
turns it into a ``PyroModule`` tree so any weight can carry a prior. Attention is pluggable: every
block gets a module from :func:`probtrans.attention.build_attention`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from probtrans.attention import build_attention
from probtrans.errors import ConfigError, ProbtransError


class PatchEmbedding(nn.Module):
    """Small images (B, C, H, W) → non-overlapping patch tokens (B, L, D) + learned positions."""

    def __init__(self, image_shape: tuple[int, int, int], patch_size: int, d_model: int) -> None:
        super().__init__()
        channels, height, width = image_shape
        if height % patch_size or width % patch_size:
            raise ConfigError(
                f"data.patch_size = {patch_size}: must divide the image size {height}×{width}"
            )
        self.patch_size = patch_size
        n_patches = (height // patch_size) * (width // patch_size)
        self.proj = nn.Linear(channels * patch_size**2, d_model)
        self.position = nn.Parameter(torch.randn(n_patches, d_model) * 0.02)

    def forward(self, images: Tensor) -> Tensor:
        p = self.patch_size
        patches = nn.functional.unfold(images, kernel_size=p, stride=p)  # (B, C·p·p, L)
        return self.proj(patches.transpose(1, 2)) + self.position


class TokenEmbedding(nn.Module):
    """Token ids (B, L) → token + learned position embeddings (B, L, D); id 0 is padding."""

    def __init__(self, vocab_size: int, max_positions: int, d_model: int) -> None:
        super().__init__()
        self.token = nn.Embedding(vocab_size, d_model, padding_idx=0)
        self.position = nn.Parameter(torch.randn(max_positions, d_model) * 0.02)

    def forward(self, ids: Tensor) -> Tensor:
        if ids.shape[1] > self.position.shape[0]:
            raise ProbtransError(
                f"token ids of shape {tuple(ids.shape)}: sequence length exceeds "
                f"model.max_positions = {self.position.shape[0]}"
            )
        return self.token(ids) + self.position[: ids.shape[1]]


class Block(nn.Module):
    """Self-attention and MLP sub-layers with residual connections and LayerNorm."""

    def __init__(self, d_model: int, d_ff: int, dropout: float, norm: str, attention: nn.Module):
        super().__init__()
        self.pre_norm = norm == "pre"
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = attention
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, d_ff), nn.GELU(), nn.Dropout(dropout), nn.Linear(d_ff, d_model)
        )
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        if self.pre_norm:
            x = x + self.drop(self.attn(self.ln1(x), mask))
            return x + self.drop(self.mlp(self.ln2(x)))
        x = self.ln1(x + self.drop(self.attn(x, mask)))
        return self.ln2(x + self.drop(self.mlp(x)))


class Encoder(nn.Module):
    """Embedding → blocks → (final LayerNorm if pre-LN) → pooled representation (B, D).

    Args:
        embedding: a :class:`PatchEmbedding` or :class:`TokenEmbedding`.
        attention: options dataclass of the attention kind used in every block.
        pooling: ``"mean"`` over real tokens, or ``"first"`` (a learned [CLS] token is prepended).
    """

    def __init__(
        self,
        embedding: nn.Module,
        attention: Any,
        d_model: int,
        n_heads: int,
        n_layers: int,
        d_ff: int,
        dropout: float = 0.1,
        norm: str = "pre",
        pooling: str = "mean",
    ) -> None:
        super().__init__()
        self.embedding = embedding
        self.pooling = pooling
        self.cls = nn.Parameter(torch.zeros(1, 1, d_model)) if pooling == "first" else None
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            Block(
                d_model,
                d_ff,
                dropout,
                norm,
                build_attention(attention, d_model, n_heads),
            )
            for _ in range(n_layers)
        )
        self.ln_f = nn.LayerNorm(d_model) if norm == "pre" else nn.Identity()

    def forward(self, inputs: Tensor, mask: Tensor | None = None) -> Tensor:
        """inputs: images (B, C, H, W) or token ids (B, L); mask: (B, L) bool → (B, D)."""
        x = self.embedding(inputs)
        if self.cls is not None:
            x = torch.cat([self.cls.expand(len(x), -1, -1), x], dim=1)
            if mask is not None:
                mask = torch.cat([mask.new_ones(len(x), 1), mask], dim=1)
        x = self.drop(x)
        for layer in self.layers:
            x = layer(x, mask)
        x = self.ln_f(x)
        if self.pooling == "first":
            return x[:, 0]
        if mask is None:
            return x.mean(1)
        weights = mask.unsqueeze(-1).to(x.dtype)
        return (x * weights).sum(1) / weights.sum(1).clamp_min(1.0)
