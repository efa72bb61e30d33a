"""The Pyro classifier: p(y | x, W, â) = Categorical(softmax(head(pool(encoder(embed(x)))))).

The whole network is here: embeddings of images (patches) or token ids, an optional [CLS]
token, the transformer :class:`~probtrans.attention.encoder.Encoder` (its blocks and attention
layers are the public :mod:`probtrans.nn`), pooling, and the head.

Random variables of the model:
- attention weights â of stochastic attention kinds, local sites inside the ``data`` plate;
- optionally the network weights W, with Normal(0, s²) priors on all weights or on the last
  layer only (``[model.prior]``), so that weight guides (MAP, mean-field, low-rank) mean something.
  Without priors the weights are ordinary parameters (maximum likelihood).
Minibatches enter through ``pyro.plate("data", N, subsample=index)``, so the ELBO is a
per-data-set objective with the likelihood scaled by N / B.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule, PyroSample
from pyro.nn.module import to_pyro_module_
from pyro.poutine.runtime import am_i_wrapped, get_plates
from torch import Tensor, nn

from probtrans.attention import MultiHeadAttention
from probtrans.attention.encoder import Encoder
from probtrans.backbone.families import lora_targets, max_positions
from probtrans.backbone.lora import RANDOM_FACTORS, LoRALinear, add_lora
from probtrans.backbone.replicas import once_below_randomness
from probtrans.backbone.swap import (
    attends_causally,
    sampled_blocks,
    start_from_pretrained,
    swap_blocks,
)
from probtrans.contract import outputs_recorded
from probtrans.data import DataBundle
from probtrans.data.tokenizer import pair_segments, segment_ids
from probtrans.errors import ConfigError, ProbtransError
from probtrans.gp.kernels import median_distance
from probtrans.gp.sngp import RandomFeatures, spectral_normalise
from probtrans.hub import Backbone, first_line, load_backbone, resolve_backbone
from probtrans.internals.pyro import DeepPyroModule, pyro_sample_names
from probtrans.resolve import spec_folder
from probtrans.runtime.caller_state import local_params
from probtrans.runtime.paths import use_paths
from probtrans.runtime.precision import full_precision
from probtrans.specs import ModelSpec, NetworkSpec


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
        """images (B, C, H, W), or (B, H, W) with one channel → (B, L, D)."""
        if images.dim() == 3:
            images = images.unsqueeze(1)
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


@dataclass(frozen=True)
class WeightPrior:
    """The prior Normal(0, scale²) of a weight of ``shape``, as the ``PyroSample`` of the module
    holding the weight: built on each draw from that module's ``prior_loc`` buffer (a scalar 0),
    so that it is on the module's device and dtype after ``classifier.to(device)``."""

    shape: torch.Size
    scale: float

    def __call__(self, module: nn.Module) -> dist.Distribution:
        # a full-shape (not expanded) mean: guides initialised at it get writable parameters
        loc = module.prior_loc.expand(self.shape).clone()
        return dist.Normal(loc, self.scale).to_event(len(self.shape))


class PyroClassifier(PyroModule):
    """What every probtrans classifier shares: the Pyro model p(y | x, W, â) around its
    :meth:`encode` (B, width), the head, weight priors and the draw of global sites.

    Call as ``model(inputs, mask, labels, index=..., n_data=...)``; ``labels=None`` samples them.
    Sites: weight priors (if any), attention sites, the deterministic ``features`` (B, D) (the
    linear head's input), ``probs`` (B, C) and ``energy`` (B,) (not in the training objective:
    :func:`probtrans.contract.outputs_unrecorded`), and the likelihood ``obs``.

    It is built under :func:`probtrans.runtime.caller_state.local_params`, so it can be called with
    Pyro's parameters module-local or in the param store. A classifier whose weights carry priors
    is a model, not a network: called outside any Pyro handler (no guide, no ``Predictive``, no
    ``condition``) it would draw its weights from the prior, so it refuses; ``Run.predict`` and
    ``Run.module`` are the trained network.
    """

    def __init__(self) -> None:
        with local_params():  # its Pyro context (shared by its submodules) then works in both
            super().__init__()
        #: the sites of the weights that carry priors → their initial values (guides start there)
        self.prior_sites: dict[str, Tensor] = {}
        #: the same sites → their prior's standard deviation
        self.prior_scales: dict[str, float] = {}
        #: refuse a call outside any Pyro handler, which would draw the weights from their
        #: priors (off once the weights are fixed, as in ``Run.module``)
        self.refuses_prior_draws = False
        #: the paths its calls take where an inference spec's ``[paths]`` overrides the device's
        #: (:mod:`probtrans.runtime.paths`); set by ``train_classifier`` and ``Run``
        self.paths: dict[str, Any] = {}

    def pretrained_parameters(self) -> list[nn.Parameter]:
        """The parameters that start from pretrained values and train (none: every weight of a
        network trained here is new)."""
        return []

    def attention_options(self) -> dict[str, dict]:
        """Module path → the options of each attention layer whose unset options were resolved
        from context when it was built (JSON values; none in a network trained here): a
        checkpoint keeps them, so that a network rebuilt from its spec under other defaults is
        not taken for the one trained."""
        return {}

    def replicas_shared(self, replicas: int) -> AbstractContextManager[None]:
        """Inside it, a batch of ``replicas`` equal copies may compute what the copies share
        once (nothing here: a network trained here samples from its first block on)."""
        return nullcontext()

    def head_modules(
        self, net: NetworkSpec, width: int, n_classes: int
    ) -> tuple[nn.Module, nn.Module]:
        """(feature map, head): the identity or SNGP's random Fourier features, and a linear
        map to the C logits."""
        if net.head.kind == "random_features":
            lengthscale = 1.0 if net.head.lengthscale is None else net.head.lengthscale
            feature_map = RandomFeatures(width, net.head.features, lengthscale)
            width = net.head.features
        else:
            feature_map = nn.Identity()
        return feature_map, nn.Linear(width, n_classes)

    def put_priors(self, root: nn.Module, prefix: str, scale: float) -> None:
        """Normal(0, scale²) priors on every parameter of ``root`` (a ``PyroModule``) and its
        submodules, their sites named ``prefix`` + their path."""
        for module_name, module in list(root.named_modules()):
            for name, _ in list(module.named_parameters(recurse=False)):
                site = f"{prefix}{module_name}.{name}" if module_name else f"{prefix}{name}"
                self.put_prior(module, name, site, scale)

    def put_prior(self, module: nn.Module, name: str, site: str, scale: float) -> None:
        """A Normal(0, scale²) prior on the parameter ``name`` of ``module`` (a
        ``PyroModule`` whose sites are named as ``site``); its value now is where guides
        start."""
        param = getattr(module, name)
        self.prior_sites[site] = param.detach().clone()
        self.prior_scales[site] = scale
        delattr(module, name)
        if not hasattr(module, "prior_loc"):
            module.register_buffer("prior_loc", param.new_zeros(()), persistent=False)
        setattr(module, name, PyroSample(WeightPrior(param.shape, scale)))
        self.refuses_prior_draws = True

    def sample_globals(self) -> None:
        """Draw every global site (``PyroSample`` attributes: weight priors, inducing variables)
        once, outside the data plate; PyroModule caches the draws for the rest of the call.
        The inducing variables come first, as in the guide
        (:func:`probtrans.inference.guide_builder.build_guide` puts their guide first):
        ``TraceMeanField_ELBO`` checks that the model and the guide draw their common sites in one
        order, and warns with every site name if not."""
        inducing = [
            (module, name)
            for module in self.modules()
            if isinstance(module, MultiHeadAttention)
            for name in module.inducing_sites
        ]
        weights = [
            (module, name)
            for module in self.modules()
            for name in pyro_sample_names(module)
            if (module, name) not in inducing
        ]
        for module, name in inducing + weights:
            getattr(module, name)

    def encode(self, inputs: Tensor, mask: Tensor | None = None) -> Tensor:
        """inputs (B, ...), mask (B, L) bool, True for real tokens → the pooled representation
        (B, width)."""
        raise NotImplementedError

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
        if self.refuses_prior_draws and not am_i_wrapped():
            raise ProbtransError(
                "this classifier's weights carry priors, so calling it outside Pyro draws them "
                "from the prior; use Run.predict(...) or Run.module() for the trained network, "
                "or pyro.infer.Predictive(classifier, guide=...)"
            )
        outer = [frame.name for frame in get_plates() if frame.vectorized]
        if outer:
            raise ProbtransError(
                f"this classifier takes one draw of its weights per call, so it cannot run "
                f"inside the vectorised plates {outer} (Predictive(parallel=True), vectorised "
                f"ELBO particles): its torch.nn layers apply one weight matrix, not S draws of "
                f"shape (S, 1, ...); use Predictive(..., parallel=False), or "
                f"probtrans.inference.predictive.sample_predictive and Run.predict, which batch "
                f"the samples themselves"
            )
        with use_paths(**self.paths):  # the spec's [paths], where it names any
            self.sample_globals()
            size = len(inputs) if n_data is None else n_data
            if index is None and size == len(inputs):  # the batch is the whole data set
                index = torch.arange(size, device=inputs.device)
            with pyro.plate("data", size, subsample_size=len(inputs), subsample=index):
                features = self.feature_map(self.encode(inputs, mask))  # (B, D)
                logits = full_precision(self.head(features))  # float32 in an autocast region
                if outputs_recorded():  # not in the training objective
                    probs, energy = head_outputs(logits)
                    pyro.deterministic("features", features, event_dim=1)
                    pyro.deterministic("probs", probs, event_dim=1)
                    pyro.deterministic("energy", energy)
                pyro.sample("obs", dist.Categorical(logits=logits), obs=labels)
            return logits


def head_outputs(logits: Tensor) -> tuple[Tensor, Tensor]:
    """The class probabilities (..., C) and the free energy −log Σ_c exp(logit_c) (...) (Liu
    et al. 2020) of the head's ``logits`` (..., C): the ``probs`` and ``energy`` sites."""
    return logits.softmax(-1), -logits.logsumexp(-1)


def trains_backbone(net: NetworkSpec) -> bool:
    """Whether a backbone's pretrained weights train: ``model.train_backbone``, or unset, all
    but under ``prior.weights = "lora"`` (adapters alone)."""
    if net.train_backbone is not None:
        return net.train_backbone
    return net.prior.weights != "lora"


def pooled(x: Tensor, mask: Tensor | None, pooling: str) -> Tensor:
    """Token representations x (B, L, D) → (B, D): the first token (``first``, ``cls``), the
    last real token (``last``; padding on either side) or the mean over real tokens (mask
    (B, L) True; all tokens if None)."""
    if pooling in ("first", "cls"):
        return x[:, 0]
    if pooling == "last":
        if mask is None:
            return x[:, -1]
        positions = torch.arange(x.shape[1], device=x.device)
        last = (mask.long() * positions).argmax(dim=1)  # (B,): the last True of each row
        return x[torch.arange(len(x), device=x.device), last]
    if mask is None:
        return x.mean(1)
    weights = mask.unsqueeze(-1).to(x.dtype)
    return (x * weights).sum(1) / weights.sum(1).clamp_min(1.0)


class Classifier(PyroClassifier):
    """The network of a ``[model]`` table trained here, as a Pyro model: logits =
    head(feature_map(pool(encoder(drop([CLS] + embedding(x)))))), ``head`` linear and
    ``feature_map`` the identity or SNGP's random Fourier features (:mod:`probtrans.gp.sngp`).

    Args:
        net: the ``[model]`` table (:class:`~probtrans.specs.NetworkSpec`).
        embedding: inputs → tokens (B, L, d_model): a :class:`PatchEmbedding` or
            :class:`TokenEmbedding`.
        n_classes: number of classes C.

    Attention sites are ``encoder.layers.{i}.attn.*``; the rest is :class:`PyroClassifier`.
    :meth:`encode` is the pooled representation (B, d_model).
    """

    def __init__(self, net: NetworkSpec, embedding: nn.Module, n_classes: int) -> None:
        super().__init__()
        d = net.d_model
        self.embedding = embedding
        self.pooling = net.pooling  # "mean" over real tokens, or a learned [CLS] token first
        self.cls = nn.Parameter(torch.zeros(1, 1, d)) if net.pooling != "mean" else None
        self.drop = nn.Dropout(net.dropout)
        self.encoder = Encoder(
            d,
            net.n_heads,
            net.n_layers,
            d_ff=net.d_ff,
            dropout=net.dropout,
            norm=net.norm,
            attention=net.attention,
        )
        if net.spectral_norm:
            spectral_normalise(self.encoder.layers, net.spectral_norm)
        self.feature_map, self.head = self.head_modules(net, d, n_classes)
        to_pyro_module_(self)
        self.register_load_state_dict_pre_hook(_moved_out_of_the_encoder)
        prior = net.prior
        if prior.weights != "none":
            root = self.head if prior.weights == "last_layer" else self
            prefix = "head." if prior.weights == "last_layer" else ""
            self.put_priors(root, prefix, prior.scale)

    def encode(self, inputs: Tensor, mask: Tensor | None = None) -> Tensor:
        """inputs: images (B, C, H, W) or token ids (B, L); mask: (B, L) bool, True for real
        tokens → the pooled representation (B, d_model)."""
        x = self.embedding(inputs)
        if self.cls is not None:
            x = torch.cat([self.cls.expand(len(x), -1, -1), x], dim=1)
            if mask is not None:
                mask = torch.cat([mask.new_ones(len(x), 1), mask], dim=1)
        return pooled(self.encoder(self.drop(x), mask), mask, self.pooling)


class BackboneClassifier(PyroClassifier, DeepPyroModule):
    """A pretrained Hugging Face transformer (``[model] backbone``, :mod:`probtrans.backbone`)
    as a Pyro model: logits = head(feature_map(drop(pool(backbone(x))))).

    ``[model.swap]`` gives some of its self-attention blocks a probtrans attention kind over
    their pretrained projections (:func:`~probtrans.backbone.swap.swap_blocks`): their sites
    are named after the block, ``backbone.encoder.layer.1.attention.self.attn.a_v``.
    ``[model.prior] weights = "lora"`` freezes the backbone, adds low-rank adapters to the
    linear maps of ``lora.targets`` (unset: its family's query and value maps;
    :mod:`probtrans.backbone.lora`) and puts Normal(0, scale²)
    priors on their A factors (sites ``backbone.….query.lora_a``; B too with ``lora.random =
    "ab"``, else B is a point estimate trained at ``[optim] lr``) and on the head; the swapped
    layers' own parameters (centroids, inducing locations, kernel) still train. Without it the
    whole backbone is fine-tuned (``last_layer``: with a prior on the head).

    Args:
        net: the ``[model]`` table.
        backbone: the ``transformers`` model without a task head (``AutoModel``).
        n_classes: number of classes C.
        image: whether its inputs are images (``pixel_values``) rather than token ids.
        separator: for pairs of texts and a backbone that takes segment ids, the token id
            after whose first occurrence the second text's segment starts
            (:func:`segment_separator`).
    """

    def __init__(
        self,
        net: NetworkSpec,
        backbone: nn.Module,
        n_classes: int,
        image: bool,
        separator: int | None = None,
    ) -> None:
        super().__init__()
        self.image = image
        self.separator = separator  # pairs of texts: the token after which segment 1 starts
        self.pooling = net.pooling
        if net.pooling == "pooler" and getattr(backbone, "pooler", None) is None:
            instead = "'last' or 'mean'" if attends_causally(backbone) else "'mean' or 'cls'"
            raise ConfigError(
                f"model.pooling = 'pooler': model.backbone = {net.backbone!r} has no pooler "
                f"layer; use {instead}"
            )
        self.backbone = backbone
        self.drop = nn.Dropout(net.dropout)
        if net.swap is not None:
            swap_blocks(backbone, net.swap.layers, net.swap.attention)
        if net.pooling in ("first", "cls") and attends_causally(backbone):
            raise ConfigError(
                f"model.pooling = {net.pooling!r}: model.backbone = {net.backbone!r} attends "
                f"causally (a decoder), so its first token sees no other; use 'last' (its last "
                f"real token, as transformers' sequence classifiers of decoders read) or 'mean'"
            )
        prior = net.prior
        adapters = {}
        if not trains_backbone(net):
            backbone.requires_grad_(False)
            for module in backbone.modules():  # the swapped layers are new: they train
                if isinstance(module, MultiHeadAttention):
                    module.requires_grad_(True)
        if prior.weights == "lora":
            lora = prior.lora
            targets = lora.targets or lora_targets(backbone)  # unset: query and value
            adapters = add_lora(backbone, targets, lora.r, lora.alpha)
        feature_map, head = self.head_modules(net, backbone.config.hidden_size, n_classes)
        to_pyro_module_(feature_map)
        to_pyro_module_(head)
        self.feature_map, self.head = feature_map, head
        self.attach_deep()
        for path, adapter in adapters.items():
            for name in RANDOM_FACTORS[prior.lora.random]:
                self.put_prior(adapter, name, f"backbone.{path}.{name}", prior.scale)
        if prior.weights in ("lora", "last_layer"):
            self.put_priors(self.head, "head.", prior.scale)

    def attention_options(self) -> dict[str, dict]:
        """The swapped layers' options, their unset ones taken from the backbone's head size
        (:func:`probtrans.specs.attention.in_backbone`)."""
        return {
            path: module.options.model_dump(mode="json")
            for path, module in self.named_modules()
            if isinstance(module, MultiHeadAttention)
        }

    def pretrained_parameters(self) -> list[nn.Parameter]:
        """The backbone's own weights that train (``[optim] backbone_lr`` applies to them): not
        the swapped layers, the adapters nor the head, which are new."""
        new = set()
        for module in self.backbone.modules():
            if isinstance(module, MultiHeadAttention):
                new.update(id(parameter) for parameter in module.parameters())
            elif isinstance(module, LoRALinear):  # its factors without a prior (B, under BLoB)
                new.update(id(parameter) for parameter in module.parameters(recurse=False))
        return [p for p in self.backbone.parameters() if p.requires_grad and id(p) not in new]

    @contextmanager
    def sampled_attention(self, layers: list[int] | str, tau: float) -> Iterator[None]:
        """Inside the block, the backbone's blocks ``layers`` sample their weights (STO at
        ``tau`` × √d_head over their trained logits, :func:`~probtrans.backbone.swap.
        sampled_blocks`), their sites named as those of swapped blocks: the post-hoc
        stochastic-attention predictive."""
        with sampled_blocks(self.backbone, layers, tau):
            self.attach_deep()
            yield

    def replicas_shared(self, replicas: int) -> AbstractContextManager[None]:
        """Inside it, a batch of ``replicas`` equal copies runs the backbone's deterministic
        lower blocks once (:func:`~probtrans.backbone.replicas.once_below_randomness`)."""
        return once_below_randomness(self.backbone, replicas)

    def encode(self, inputs: Tensor, mask: Tensor | None = None) -> Tensor:
        """inputs: images (B, C, H, W), resized (bilinear) to the backbone's image size, or
        token ids (B, L); mask: (B, L) bool, True for real tokens → the pooled representation
        (B, hidden size)."""
        given = backbone_inputs(self.backbone, self.image, inputs, mask, self.separator)
        output = self.backbone(**given)
        return self.drop(backbone_pooled(output, given.get("attention_mask"), self.pooling))


def backbone_inputs(
    backbone: nn.Module,
    image: bool,
    inputs: Tensor,
    mask: Tensor | None,
    separator: int | None = None,
) -> dict[str, Tensor]:
    """The keyword inputs of a Hugging Face ``backbone``: images (B, C, H, W) or (B, H, W) as
    ``pixel_values``, resized (bilinear) to its image size; token ids (B, L) with their
    ``attention_mask`` (B, L) and, given the ``separator`` of pairs of texts, their
    ``token_type_ids`` (B, L) (:func:`~probtrans.data.tokenizer.segment_ids`)."""
    if not image:
        given = {"input_ids": inputs, "attention_mask": mask}
        if separator is not None:
            given["token_type_ids"] = segment_ids(inputs, separator)
        return given
    inputs = inputs.unsqueeze(1) if inputs.dim() == 3 else inputs  # one channel
    size = backbone.config.image_size
    size = (size, size) if isinstance(size, int) else tuple(size)
    if tuple(inputs.shape[-2:]) != size:  # resized to the backbone's images
        inputs = nn.functional.interpolate(inputs, size=size, mode="bilinear")
    return {"pixel_values": inputs}


def backbone_pooled(output: object, mask: Tensor | None, pooling: str) -> Tensor:
    """A backbone's output (``last_hidden_state`` (B, L, D), ``pooler_output`` (B, D)) → the
    pooled representation (B, D): the backbone's own pooler, or :func:`pooled`."""
    if pooling == "pooler":
        return output.pooler_output
    return pooled(output.last_hidden_state, mask, pooling)


#: state-dict keys of checkpoints written when the embedding and the [CLS] token were inside the
#: encoder → their keys now
MOVED_KEYS = {"encoder.embedding.": "embedding.", "encoder.cls": "cls"}


def _moved_out_of_the_encoder(module: nn.Module, state: dict, prefix: str, *_: object) -> None:
    """Load such checkpoints (their weights are the same)."""
    for key in list(state):
        for old, new in MOVED_KEYS.items():
            if key.startswith(prefix + old):
                state[prefix + new + key[len(prefix + old) :]] = state.pop(key)


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


def build_classifier(
    spec: ModelSpec, data: DataBundle, backbone: Backbone | None = None
) -> PyroClassifier:
    """The classifier a model spec describes, sized for ``data``; refuses one that cannot be
    trained in this machine's memory (:func:`check_size`). A ``model.backbone`` is ``backbone``
    where the caller resolved it (:func:`probtrans.resolve.with_local_backbone`; the folder a
    run keeps: its config alone, the checkpoint holding every weight), else resolved here."""
    if spec.network.backbone is not None:
        if backbone is None:
            backbone = resolve_backbone(spec.network.backbone, spec_folder(spec))
        return build_backbone_classifier(spec, data, backbone)
    check_size(spec, data)
    net = spec.network
    if data.kind == "image":
        embedding = PatchEmbedding(data.image_shape, spec.data.patch_size, net.d_model)
    else:
        embedding = TokenEmbedding(data.vocab_size, net.max_positions, net.d_model)
    return Classifier(net, embedding, data.n_classes)


#: the training examples whose pretrained tokens start the swapped layers' own parameters
START_EXAMPLES = 64
#: a median distance below this fraction of the largest feature norm counts as zero: the
#: training features do not differ
DISTINCT_FEATURES = 1e-5


def build_backbone_classifier(
    spec: ModelSpec, data: DataBundle, resolved: Backbone
) -> BackboneClassifier:
    """The :class:`BackboneClassifier` of the ``resolved`` ``model.backbone`` for ``data`` (see
    :func:`build_classifier`)."""
    check_backbone_data(resolved.config, spec, data)
    backbone = load_backbone(resolved)
    net, image = spec.network, data.kind == "image"
    separator = segment_separator(backbone, data)
    if resolved.pretrained and len(data.train):
        check_backbone_runs(backbone, image, data, resolved.ref, separator)
    measured = net.head.kind == "random_features" and net.head.lengthscale is None
    start = {}
    if resolved.pretrained and (net.swap is not None or measured) and len(data.train):
        _, inputs, mask, _ = data.train.batch(torch.randperm(len(data.train))[:START_EXAMPLES])
        start = backbone_inputs(backbone, image, inputs, mask, separator)
    lengthscale = None
    if measured and start:  # SNGP's ℓ at the scale of the pretrained features
        features = pretrained_features(backbone, start, net.pooling)  # (N, D)
        lengthscale = median_distance(features)
        # one training row, or rows whose features coincide up to float32 rounding (a batched
        # forward pass can give identical rows features a few ulps apart)
        if not lengthscale > DISTINCT_FEATURES * float(features.norm(dim=-1).max()):
            raise ConfigError(
                f"model.head.lengthscale: unset, and the median distance between the pretrained "
                f"features of {len(next(iter(start.values())))} training "
                f"examples of {data.name} is {lengthscale}; the median heuristic needs two "
                f"examples whose features differ: set model.head.lengthscale"
            )
    classifier = BackboneClassifier(net, backbone, data.n_classes, image, separator)
    if lengthscale is not None:
        classifier.feature_map.lengthscale.fill_(lengthscale)
    if net.swap is not None and start:
        start_from_pretrained(backbone, **start)
    return classifier


#: the training examples the untouched backbone is first run on
PROBE_EXAMPLES = 2


def segment_separator(backbone: nn.Module, data: DataBundle) -> int | None:
    """For ``data`` of pairs of texts and a ``backbone`` with segment embeddings (BERT's
    ``token_type_ids``, of two segments or more), the separator token of the data's tokenizer
    after which the second segment starts; else None (single texts, a backbone without segment
    ids as RoBERTa's or DistilBERT's, a tokenizer whose pairs are one segment)."""
    if not data.text_pairs or data.tokenizer is None:
        return None
    takes = "token_type_ids" in inspect.signature(backbone.forward).parameters
    if not takes or getattr(backbone.config, "type_vocab_size", 0) < 2:
        return None
    return pair_segments(data.tokenizer)


def check_backbone_runs(
    backbone: nn.Module, image: bool, data: DataBundle, ref: str, separator: int | None = None
) -> None:
    """Run the untouched pretrained ``backbone`` on the first training examples of ``data``
    (pairs of texts with the segment ids of ``separator``) before anything of probtrans is put
    in it: a model that fails on them (one that needs inputs probtrans does not give, as
    X-MOD's language) is one error naming it, before training rather than in its first step."""
    _, inputs, mask, _ = data.train.batch(torch.arange(min(PROBE_EXAMPLES, len(data.train))))
    given = backbone_inputs(backbone, image, inputs, mask, separator)
    try:
        pretrained_features(backbone, given, "mean")
    except ProbtransError:
        raise
    except Exception as err:  # the model's own code: its message says what it needs
        raise ConfigError(
            f"model.backbone = {ref!r}: {type(backbone).__name__} fails on the inputs of "
            f"{data.name} ({type(err).__name__}: {first_line(err)})"
        ) from None


@torch.no_grad()
def pretrained_features(backbone: nn.Module, inputs: dict[str, Tensor], pooling: str) -> Tensor:
    """The pooled features (B, D) of the untouched pretrained ``backbone`` for ``inputs``, in
    evaluation mode (no dropout)."""
    mode = backbone.training
    backbone.eval()
    try:
        output = backbone(**inputs)
    finally:
        backbone.train(mode)
    return backbone_pooled(output, inputs.get("attention_mask"), pooling)


def check_backbone_data(config: object, spec: ModelSpec, data: DataBundle) -> None:
    """Refuse data the backbone cannot read: texts for an image model or the reverse, token
    ids beyond its vocabulary or its positions, images of another shape."""
    name = f"model.backbone = {spec.network.backbone!r}"
    vocabulary = getattr(config, "vocab_size", None)
    image_size = getattr(config, "image_size", None)
    if data.kind == "image":
        if image_size is None:
            raise ConfigError(f"{name}: a text model; the data are images")
        channels = getattr(config, "num_channels", 3)
        if (data.image_shape or (0,))[0] != channels:
            plural = "" if channels == 1 else "s"
            raise ConfigError(
                f"data: images of shape {tuple(data.image_shape or ())}: {name} takes images "
                f"of {channels} channel{plural}, (N, {channels}, H, W)"
            )
        return
    if vocabulary is None:
        raise ConfigError(f"{name}: an image model; the data are texts")
    if (data.vocab_size or 0) > vocabulary:
        raise ConfigError(
            f"data.tokenizer: {data.vocab_size} tokens, more than the {vocabulary} of {name}: "
            f"not the backbone's tokenizer"
        )
    positions = max_positions(config)
    if spec.data.max_len > positions:
        raise ConfigError(
            f"data.max_len = {spec.data.max_len}: must be at most the {positions} positions "
            f"of {name}"
        )
