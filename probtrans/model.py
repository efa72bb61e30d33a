"""The Pyro classifier: p(y | x, W, â) = Categorical(softmax(head(encoder(x)))).

Random variables of the model:
- attention weights â of stochastic attention kinds, local sites inside the ``data`` plate;
- optionally the network weights W, with Normal(0, s²) priors on all weights or on the last
  layer only (``[model.prior]``), so that weight guides (MAP, mean-field, low-rank) mean something.
  Without priors the weights are ordinary parameters (maximum likelihood).
Minibatches enter through ``pyro.plate("data", N, subsample=index)``, so the ELBO is a
per-data-set objective with the likelihood scaled by N / B.
"""

from __future__ import annotations

import os

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule, PyroSample
from pyro.nn.module import to_pyro_module_
from pyro.poutine.runtime import am_i_wrapped
from torch import Tensor, nn

from probtrans.contract import local_params
from probtrans.data import DataBundle
from probtrans.encoder import Encoder, PatchEmbedding, TokenEmbedding
from probtrans.errors import ConfigError, ProbtransError
from probtrans.sngp import RandomFeatures, spectral_normalise
from probtrans.specs import ModelSpec, NetworkSpec, PriorSpec


class Classifier(PyroModule):
    """Encoder + head as a Pyro model: logits = head(feature_map(encoder(x))), ``head`` linear and
    ``feature_map`` the identity or SNGP's random Fourier features (:mod:`probtrans.sngp`).

    Call as ``model(inputs, mask, labels, index=..., n_data=...)``; ``labels=None`` samples them.
    Sites: weight priors (if any), attention sites ``encoder.layers.{i}.attn.*``, the deterministic
    ``features`` (B, D) (the linear head's input) and ``probs`` (B, C), and the likelihood ``obs``.

    It is built under :func:`probtrans.contract.local_params`, so it can be called with Pyro's
    parameters module-local or in the param store. A classifier whose weights carry priors is a
    model, not a network: called outside any Pyro handler (no guide, no ``Predictive``, no
    ``condition``) it would draw its weights from the prior, so it refuses; ``Run.predict`` and
    ``Run.module`` are the trained network.
    """

    def __init__(
        self,
        encoder: nn.Module,
        d_model: int,
        n_classes: int,
        prior: PriorSpec,
        feature_map: nn.Module | None = None,
    ) -> None:
        with local_params():  # its Pyro context (shared by its submodules) then works in both
            super().__init__()
        self.encoder = encoder
        self.feature_map = nn.Identity() if feature_map is None else feature_map
        self.head = nn.Linear(d_model, n_classes)  # d_model: the feature map's output width
        to_pyro_module_(self)
        #: initial values of the weights that carry priors (guides start from them)
        self.initial_weights: dict[str, Tensor] = {}
        if prior.weights != "none":
            root = self.head if prior.weights == "last_layer" else self
            prefix = "head." if prior.weights == "last_layer" else ""
            self._put_priors(root, prefix, prior.scale)

    def _put_priors(self, root: nn.Module, prefix: str, scale: float) -> None:
        for module_name, module in list(root.named_modules()):
            for name, param in list(module.named_parameters(recurse=False)):
                site = f"{prefix}{module_name}.{name}" if module_name else f"{prefix}{name}"
                self.initial_weights[site.removesuffix(".")] = param.detach().clone()
                delattr(module, name)
                setattr(
                    module,
                    name,
                    PyroSample(dist.Normal(torch.zeros_like(param), scale).to_event(param.dim())),
                )

    def sample_globals(self) -> None:
        """Draw every global site (``PyroSample`` attributes: weight priors, inducing variables)
        once, outside the data plate; PyroModule caches the draws for the rest of the call."""
        for module in self.modules():
            for name in getattr(module, "_pyro_samples", {}):
                getattr(module, name)

    def forward(
        self,
        inputs: Tensor,
        mask: Tensor | None = None,
        labels: Tensor | None = None,
        index: Tensor | None = None,
        n_data: int | None = None,
    ) -> Tensor:
        """inputs (B, ...), mask (B, L), labels (B,), index (B,) positions in a data set of size
        n_data (default: the batch is the whole data set) → logits (B, C)."""
        if self.initial_weights and not am_i_wrapped():
            raise ProbtransError(
                "this classifier's weights carry priors, so calling it outside Pyro draws them "
                "from the prior; use Run.predict(...) or Run.module() for the trained network, "
                "or pyro.infer.Predictive(classifier, guide=...)"
            )
        self.sample_globals()
        size = len(inputs) if n_data is None else n_data
        subsample = (
            index if index is not None else (torch.arange(size) if size == len(inputs) else None)
        )
        with pyro.plate("data", size, subsample_size=len(inputs), subsample=subsample):
            features = self.feature_map(self.encoder(inputs, mask))  # (B, D), pooled
            pyro.deterministic("features", features, event_dim=1)
            logits = self.head(features)
            pyro.deterministic("probs", logits.softmax(-1), event_dim=1)
            pyro.sample("obs", dist.Categorical(logits=logits), obs=labels)
        return logits


def build_encoder(net: NetworkSpec, embedding: nn.Module) -> Encoder:
    """The encoder a ``[model]`` table describes, on top of ``embedding``."""
    return Encoder(
        embedding,
        net.attention,
        net.d_model,
        net.n_heads,
        net.n_layers,
        net.d_ff,
        dropout=net.dropout,
        norm=net.norm,
        pooling=net.pooling,
    )


#: bytes per parameter in training: float32 weight, gradient and Adam's two moments
TRAINING_BYTES_PER_PARAMETER = 16


def minimum_parameters(spec: ModelSpec, data: DataBundle) -> int:
    """A lower bound on the parameter count of the network ``spec`` describes for ``data``:
    embeddings, and per block the query/key/value/output maps (at least 3 d², as SGPA shares
    W_q = W_k) and the MLP (2 d d_ff), and the head."""
    net, d = spec.network, spec.network.d_model
    if data.kind == "image":
        channels, height, width = data.image_shape
        embedding = channels * spec.data.patch_size**2 * d + (height * width) * d
    else:
        embedding = (data.vocab_size + net.max_positions) * d
    return embedding + net.n_layers * (3 * d * d + 2 * d * net.d_ff) + d * data.n_classes


def check_size(spec: ModelSpec, data: DataBundle) -> None:
    """Refuse a network whose training state cannot fit in this machine's memory."""
    count = minimum_parameters(spec, data)
    needed = count * TRAINING_BYTES_PER_PARAMETER
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if needed > memory:
        net = spec.network
        raise ConfigError(
            f"{spec.file}: model: at least {count:.3g} parameters ({needed / 2**30:,.0f} GiB to "
            f"train), more than this machine's {memory / 2**30:.0f} GiB of memory "
            f"(model.d_model = {net.d_model}, model.d_ff = {net.d_ff}, "
            f"model.n_layers = {net.n_layers})"
        )


def build_classifier(spec: ModelSpec, data: DataBundle) -> Classifier:
    """The classifier a model spec describes, sized for ``data``; refuses one that cannot be
    trained in this machine's memory (:func:`check_size`)."""
    check_size(spec, data)
    net = spec.network
    if data.kind == "image":
        embedding = PatchEmbedding(data.image_shape, spec.data.patch_size, net.d_model)
    else:
        embedding = TokenEmbedding(data.vocab_size, net.max_positions, net.d_model)
    encoder = build_encoder(net, embedding)
    if net.spectral_norm:
        spectral_normalise(encoder.layers, net.spectral_norm)
    if net.head.kind == "random_features":
        feature_map = RandomFeatures(net.d_model, net.head.features, net.head.lengthscale)
        return Classifier(encoder, net.head.features, data.n_classes, net.prior, feature_map)
    return Classifier(encoder, net.d_model, data.n_classes, net.prior)
