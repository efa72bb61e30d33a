"""SGPA: sparse Gaussian-process attention (Chen & Li, ICLR 2023).

Kernel attention F = K(q, k) v is the posterior mean of a sparse variational GP whose inducing
inputs are the keys; SGPA also uses its posterior covariance, so a transformer of SGPA layers is
a sparse deep GP with a deep kernel, and samples F = m + Σ^{1/2} ξ carry the uncertainty from
layer to layer. Per head, queries and keys share one projection W_qk (so the kernel is symmetric)
and values have their own W_v; the heads' outputs are concatenated and projected by W_F.

Two kinds:

``sgpa`` — :class:`SGPAttention`, decoupled SGPA, the paper's method (§3.3–3.4). Per layer and
head, M_g learnable global inducing locations Z_g give the global keys k_g = G(Z_g) W_qk. The
whitened global inducing variables are ONE global Pyro sample site per layer, ``{module}.u_g``
(e.g. ``encoder.layers.0.attn.u_g``), event shape (H, d_head, M_g), prior N(0, I); its guide is
chosen by name (``guide.inducing``: cholesky / diagonal / delta,
:mod:`probtrans.guides.inducing`).
Given u_g, the output is the local, self-guided site ``{module}.f`` (event (H, d_head, T)), the
conditional p(F | u_g) of :mod:`probtrans.gp.decoupled`: its guide is itself, as in any SVGP
where q(f, u) = p(f | u) q(u). The amortised part of the decoupled KL enters the ELBO through
the factor ``kl_term("{module}.kl_amortised", ½ Σ_{h,d} v_aᵀ (K_aa − K_ag K_gg⁻¹ K_ga) v_a)``
inside the data plate, once per sequence.

``sgpa_standard`` — :class:`StandardSGPAttention` (§3.2): the input keys are the inducing points,
with an amortised covariance; it has no global site, costs O(B T³), and exists for the
complexity comparison (``benchmarks/sgpa_complexity.py``).

The map G. The paper maps the previous layer's output F^{l−1} and the global locations Z_g by the
same non-linear map G before the shared projection W_qk. Here the attention module receives the
block's already-mapped input (pre-LN: the block's LayerNorm of the residual stream), so it
cannot call the block's own map on Z_g; G is a LayerNorm of the layer's own, which puts the global
locations on the same normalised manifold as the token inputs. (The authors' code applies the
previous block's MLP + residual + LayerNorm to Z_g.) Swapped into a pretrained backbone, G is
the identity (option ``inducing_map``): Z_g lives in the space of the block's input tokens and
starts at M_g of them (:meth:`SGPAttention.start_from`), so the global keys start at real keys.
A new LayerNorm would map them elsewhere: a post-LN block such as BERT's receives tokens
normalised with its predecessor's own scales and shifts, and on all-MiniLM-L6-v2's top two
blocks the LayerNorm moved them by 52–78 %, a typical key's nearest global key was then as far
as a random pair of keys, and the global inducing points explained 0.07–0.1 % of the prior
variance at the tokens of 300 CR sentences (median over heads and tokens), with the length scale
d_head^¼ = 2.4 a third of the keys' median distance. Then q(u_g) cannot change the predictive at
any real token: its variance is σ_f² wherever the data are. With G the identity and ℓ the keys'
median distance (``lengthscale = "keys"``) they explain 77–79 %.

Prior mean (option ``prior_mean``). The paper's GP has mean zero, so a layer's output is the
kernel part alone. Swapped into a pretrained block, that output is far from what the block
computed (on all-MiniLM-L6-v2's top two blocks: the exponential kernel over the keys reaches
exp(23.8), and with the ARD kernel the last hidden states still move by 53 %), and fine-tuning
from there gave a one-class predictor on CoLA. With ``prior_mean = "softmax"`` (the default in
a backbone) the GP's prior mean function is the block's own attention softmax(q kᵀ / √d_head) v,
so F = softmax attention + a zero-mean decoupled sparse GP over the keys: the mean of F | u_g
shifts by it (:attr:`~probtrans.gp.decoupled.DecoupledConditional.prior_mean`), the covariances
and both KL terms are as for a zero-mean GP. The GP then models corrections, and its amortised
values are their own: v_a = v R_h, R_h (d_head × d_head per head, ``correction``) starting at
zero, so the layer's mean starts at the pretrained block's output with no amortised KL, and the
KL, which prices the corrections, never pulls on the pretrained values that the softmax mean
uses. (With v_a = v itself, the paper's choice, the amortised KL of MiniLM's top blocks was 22
nats per sentence against a likelihood of 0.6, and the fit still learned one class.)

KL weights (see :class:`probtrans.specs.ElboSpec`). The per-dataset ELBO (``kl_weight = 1``)
is E[log p(y | ·)] summed over the data − KL(q(u_g) ‖ p(u_g)) − Σ_n KL_amortised,n, minus
KL(q(W) ‖ p(W)) where the model spec puts priors on weights (all three SGPA model specs put a
Normal prior on the classification head). The authors minimise mean NLL + KL(q(u_g) ‖ p(u_g)) +
mean_batch KL_amortised (KL not divided by the data-set size; their weights have no prior);
times N this is Σ NLL + N·KL(q(u_g) ‖ p(u_g)) + Σ_n KL_amortised,n. ``elbo.kl_scale =
"authors"`` makes the KL of the ``u_g`` sites, and only those, N_train times stronger: the
amortised term, an average over the batch, is already a per-sequence term and keeps weight 1,
and weight priors keep the ELBO's weight 1 (1/N_train in the authors' per-example units). KL
annealing scales all of them, as in the authors' code.
``inference/sgpa.toml`` trains the per-dataset ELBO, ``inference/sgpa_authors.toml`` the authors'
weighting with their linear annealing over half of the epochs.

Mixed precision. In a bfloat16 autocast region only the output projection W_F runs in
bfloat16; everything before it runs with autocast off, in float32 (float64 for the low-rank
parts of :func:`~probtrans.gp.decoupled.decoupled_conditional`): the kernel matrices, their Cholesky
factors, the GP conditional and the draw of F, and also the kernel's inputs, the projections
W_qk and W_v (and standard SGPA's σ) and the global keys. The exponential kernel
exp(q·k / ℓ²) would multiply the rounding error of bfloat16 queries (2⁻⁸ relative) by
|q·k| / ℓ²: at ℓ = 1 the layer's output was up to 4 % off the float32 one (30 random layers,
d_head = 4), against 0.4 % (W_F's rounding) with float32 queries. The projections cost
O(T d²), the kernel part O(T² d) in float32 and O(T M_g (d + M_g)) in float64.
"""

from __future__ import annotations

from typing import Any

import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.nn import PyroSample
from torch import Tensor, nn

from probtrans.attention.kinds import register_attention
from probtrans.attention.multihead import MultiHeadAttention, check_tokens
from probtrans.contract import kl_term, sample_attention
from probtrans.gp.decoupled import CONDITIONALS
from probtrans.gp.kernels import head_kernel, median_distance
from probtrans.gp.standard import standard_posterior
from probtrans.runtime.paths import paths_for
from probtrans.runtime.precision import autocast_off, full_precision
from probtrans.specs.attention import SGPAOptions, StandardSGPAOptions

#: the most tokens whose keys measure a ``lengthscale = "keys"`` (their pairwise distances)
KEY_SAMPLE = 2048


def whitened_prior(layer: SGPAttention) -> dist.Distribution:
    """p(ε) = N(0, I) for every head and output dimension: event shape (H, d_head, M_g)."""
    eye = layer.prior_scale_tril  # (M_g, M_g)
    # a full-shape (not expanded) mean: guides initialised at it get writable parameters
    loc = eye.new_zeros(layer.n_heads, layer.d_head, len(eye))
    return dist.MultivariateNormal(loc, scale_tril=eye).to_event(2)


class KernelAttention(MultiHeadAttention):
    """Shared projection W_qk for queries and keys, W_v for values, a per-head kernel (the
    options' ``kernel``, ``lengthscale``, ``outputscale``)."""

    fused_qkv = False  # W_q = W_k instead

    def __init__(self, d_model: int, n_heads: int, **options: Any) -> None:
        super().__init__(d_model, n_heads, **options)
        opts = self.options
        if self.projections:
            self.qk = nn.Linear(d_model, d_model, bias=False)
            self.value = nn.Linear(d_model, d_model, bias=False)
        # lengthscale "keys" is measured in start_from; until then, the backbone's logit scale
        lengthscale = self.d_head**0.25 if opts.lengthscale == "keys" else opts.lengthscale
        self.kernel = head_kernel(opts.kernel, n_heads, self.d_head, lengthscale, opts.outputscale)

    def split_heads(self, x: Tensor) -> Tensor:
        """(*S, B, T, H·d) → (*S, B, H, T, d)."""
        return x.unflatten(-1, (self.n_heads, self.d_head)).transpose(-2, -3)

    def project(self, x: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """x (*S, B, T, D), mask (B, T) → queries = amortised keys (*S, B, H, T, d) and values
        (*S, B, H, T, d), zero at padding."""
        check_tokens(self, x, mask)
        q, v = self.split_heads(self.qk(x)), self.split_heads(self.value(x))
        if mask is not None:
            v = v * mask[..., None, :, None].to(v.dtype)
        return q, v

    def merge_heads(self, f: Tensor) -> Tensor:
        """Per-head outputs (*S, B, H, d, T) → W_F concat(F_1, …, F_H): (*S, B, T, D)."""
        return self.out(f.movedim(-1, -3).flatten(-2))


class SGPAttention(KernelAttention):
    """Decoupled SGPA layer (§3.3–3.4): global site ``u_g`` (H, d_head, M_g), local self-guided
    site ``f`` (H, d_head, T), and the KL factor ``kl_amortised``.

    ``SGPAttention(d_model, n_heads, **options)``, options by name (defaults and bounds:
    :class:`~probtrans.specs.attention.SGPAOptions`): ``kernel`` (``"exponential"`` or ``"ard"``),
    ``n_inducing`` (M_g), ``lengthscale`` (ℓ_i, initial; ``"keys"``: measured by
    :meth:`start_from`), ``outputscale`` (σ_f², initial), ``jitter`` (on K_gg's diagonal),
    ``inducing_map`` (G: ``"layernorm"`` or ``"identity"``), ``sampling`` (``"marginal"`` or
    ``"full"``), ``prior_mean``.

    ``u_g`` is global: a model draws it outside its data plate by reading ``layer.u_g`` once
    before the plate (the ``PyroSample`` keeps the draw for the rest of the call), as
    :meth:`probtrans.classifier.Classifier.sample_globals` does. Inside a vectorised plate of size S
    (at dim −2, the data plate at −1) it is drawn with shape (S, 1, H, d_head, M_g), and the
    layer's output gets that sample dimension: (S, B, T, D).
    """

    options_class = SGPAOptions
    sample_sites = ("f",)
    inducing_sites = ("u_g",)

    def __init__(self, d_model: int, n_heads: int, **options: Any) -> None:
        super().__init__(d_model, n_heads, **options)
        opts = self.options
        self.jitter = opts.jitter
        self.sampling = opts.sampling
        self.prior_mean = opts.prior_mean or "zero"
        if self.prior_mean == "softmax":  # R_h: the amortised values of the corrections, v R_h
            self.correction = nn.Parameter(torch.zeros(n_heads, self.d_head, self.d_head))
        self.z_g = nn.Parameter(torch.randn(n_heads, opts.n_inducing, d_model))  # Z_g
        # G (see the module docstring)
        self.inducing_map = (
            nn.LayerNorm(d_model) if opts.inducing_map == "layernorm" else nn.Identity()
        )
        self.register_buffer("prior_scale_tril", torch.eye(opts.n_inducing), persistent=False)
        self.u_g = PyroSample(whitened_prior)

    def start_from(self, tokens: Tensor, key_map: nn.Module) -> None:
        """Inducing locations Z_g from the pretrained tokens (N, D): M_g tokens drawn at random
        per head, so that the global keys start among the keys of real tokens (with
        ``inducing_map = "identity"``, at exactly their keys). With ``lengthscale = "keys"``,
        each head's length scales are the median distance between its keys of (at most
        :data:`KEY_SAMPLE` of) the tokens: the median heuristic."""
        rows = torch.randint(len(tokens), self.z_g.shape[:2], device=tokens.device)
        self.z_g.data.copy_(tokens[rows])
        if self.options.lengthscale == "keys":
            sample = tokens[torch.randperm(len(tokens), device=tokens.device)[:KEY_SAMPLE]]
            keys = key_map(sample).unflatten(-1, (self.n_heads, self.d_head))  # (N, H, d)
            scales = [median_distance(keys[:, h]) for h in range(self.n_heads)]
            lengthscale = torch.tensor(scales, dtype=self.kernel.base_kernel.lengthscale.dtype)
            self.kernel.base_kernel.lengthscale = lengthscale[:, None, None].expand(
                self.kernel.base_kernel.lengthscale.shape
            )

    def global_keys(self, key_map: nn.Module | None = None) -> Tensor:
        """k_g = G(Z_g) W_qk^h for every head: (H, M_g, d_head); in a pretrained block
        W_qk is its key projection ``key_map`` (with its bias)."""
        if key_map is not None:  # (H, M_g, D) → (H, M_g, H, d) → head h of row h
            keys = key_map(self.inducing_map(self.z_g)).unflatten(-1, (self.n_heads, -1))
            return keys.diagonal(dim1=0, dim2=2).permute(2, 0, 1)
        w_qk = self.qk.weight.view(self.n_heads, self.d_head, -1)  # (H, d, D)
        return torch.einsum("hmi,hdi->hmd", self.inducing_map(self.z_g), w_qk)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """x: (*S, B, T, D); mask: (B, T) bool, True for real tokens → (*S', B, T, D), *S' the
        sample dimensions of x broadcast with those of u_g and f."""
        with autocast_off(x):  # see "Mixed precision" in the module docstring
            q, v = self.project(full_precision(x), mask)
            f = self.sample_output(
                q, v, self.global_keys(), mask, self.mean_function(q, q, v, mask)
            )
        return self.merge_heads(f)

    def mean_function(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor | None:
        """The GP's prior mean at the tokens (option ``prior_mean``): None for zero, or the
        softmax attention softmax(q kᵀ / √d_head) v, (*S, B, H, T, d), padding keys left out."""
        if self.prior_mean == "zero":
            return None
        keep = None if mask is None else mask[..., None, None, :]  # (B, 1, 1, T)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)

    def attend_projected(
        self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, key_map: nn.Module
    ) -> Tensor:
        """In a pretrained block the shared W_qk is the block's key projection: the kernel
        is K(k_i, k_j) over its keys, the global keys are ``key_map(G(Z_g))`` and the values
        its own; its queries enter through the prior mean alone (``prior_mean = "softmax"``,
        the default here: the block's own softmax(q kᵀ / √d_head) v)."""
        with autocast_off(k):
            k, v = full_precision(k), full_precision(v)
            if key_mask is not None:
                v = v * key_mask[..., None, :, None].to(v.dtype)
            mean = self.mean_function(full_precision(q), k, v, key_mask)
            f = self.sample_output(k, v, self.global_keys(key_map), key_mask, mean)
        return f.transpose(-1, -2)  # (*S, B, H, d, T) → (*S, B, H, T, d)

    def sample_output(
        self, q: Tensor, v: Tensor, keys: Tensor, mask: Tensor | None, mean: Tensor | None
    ) -> Tensor:
        """The sites of the layer given amortised keys q and values v (*S, B, H, T, d), global
        keys (H, M_g, d) and the prior mean at the tokens (*S, B, H, T, d; None: zero): the
        amortised KL factor, u_g, and the draw of F (*S', B, H, d, T).

        u_g is (H, d, M_g), or (*S, 1, H, d, M_g) inside vectorised plates; one with the data
        plate's dimension (B ≠ 1 at dim −4) was drawn inside the data plate, and is refused."""
        if mean is not None:  # a GP of corrections to ``mean``: amortised values v R_h
            v = v @ self.correction  # (*S, B, H, T, d) @ (H, d, d)
        on_path = CONDITIONALS[paths_for(q.device).sgpa_conditional]
        conditional = on_path(self.kernel, q, keys, v, self.jitter, mask)
        if mean is not None:
            conditional.prior_mean = mean.transpose(-1, -2)
        kl_term(self.site("kl_amortised"), conditional.amortised_kl)
        u_g = self.u_g
        if u_g.dim() > 3 and u_g.shape[-4] != 1:
            raise ValueError(
                f"{type(self).__name__}: the global site {self.site('u_g')!r} was drawn with "
                f"shape {tuple(u_g.shape)}, not (H, d_head, M_g), nor (*S, 1, H, d_head, M_g) "
                f"in vectorised plates: draw it outside the data plate (read the layer's u_g "
                f"once before entering the plate; the draw is kept for the rest of the call), "
                f"and give Predictive(parallel=True) a guide's draws with the data plate's "
                f"dimension (README, 'Vectorised sampling')"
            )
        return sample_attention(self.site("f"), conditional.distribution(u_g, self.sampling))


class StandardSGPAttention(KernelAttention):
    """Standard SGPA layer (§3.2): local self-guided site ``u_a`` (H, d_head, T), the whitened
    inducing values at the keys, drawn from their amortised posterior q(ε | x), and the KL factor
    ``kl_amortised``.

    ``StandardSGPAttention(d_model, n_heads, **options)``, options by name (defaults and bounds:
    :class:`~probtrans.specs.attention.StandardSGPAOptions`): ``kernel``, ``lengthscale``,
    ``outputscale``, ``jitter`` (on K_aa's diagonal).
    """

    options_class = StandardSGPAOptions
    sample_sites = ("u_a",)
    backbone_refusal = (
        "it maps each token to its amortised posterior scale, and a pretrained block gives its "
        "attention only queries, keys and values; use kind = 'sgpa'"
    )

    def __init__(self, d_model: int, n_heads: int, **options: Any) -> None:
        super().__init__(d_model, n_heads, **options)
        self.jitter = self.options.jitter
        self.scale = nn.Linear(d_model, d_model)  # amortised posterior std σ (after softplus)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """x: (*S, B, T, D); mask: (B, T) bool, True for real tokens → (*S', B, T, D), *S' the
        sample dimensions of x broadcast with those of the site u_a."""
        with autocast_off(x):  # see "Mixed precision" in the module docstring
            x = full_precision(x)
            q, v = self.project(x, mask)
            sigma = F.softplus(self.split_heads(self.scale(x)))
            posterior = standard_posterior(self.kernel, q, v, sigma, self.jitter, mask)
            kl_term(self.site("kl_amortised"), posterior.kl)
            eps = sample_attention(self.site("u_a"), posterior.distribution())
            f = posterior.output(eps)
        return self.merge_heads(f)


register_attention(SGPAttention)
register_attention(StandardSGPAttention)
