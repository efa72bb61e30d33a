"""probtrans attention inside a pretrained Hugging Face transformer.

The self-attention modules of ``transformers``' encoders (BERT, RoBERTa, DistilBERT, ViT,
ModernBERT and others written the same way) project the tokens to per-head queries, keys and
values with their own linear maps (or one map giving the three stacked), then call the
attention function that their config names in Hugging Face's registry (``AttentionInterface``;
the private names involved are wrapped in :mod:`probtrans.internals.transformers`).
:func:`swap_blocks` registers one function,
``"probtrans"`` (with the padding mask of ``"sdpa"``), and sets it on the model: in a block
given a probtrans attention layer (held as the block's attribute ``attn``) that layer forms the
weights from the block's pretrained queries, keys and values
(:meth:`~probtrans.attention.multihead.MultiHeadAttention.attend_projected`), and every other block
runs PyTorch's scaled dot-product attention as before. The pretrained query, key, value and
output projections are kept, so softmax attention swapped in gives the model's own outputs.

Registering the function adds one name to ``transformers``' registry when a model is first
swapped (never on import); models that do not name it are unchanged. The attention dropout of
a swapped block is the probtrans layer's own option (the block's ``attention_probs_dropout_prob``
is not applied).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from probtrans.attention import ATTENTION
from probtrans.attention.encoder import make_attention
from probtrans.backbone.families import (
    FAMILIES,
    StackedPart,
    adapted_linear,
    attention_heads,
    module_family,
)
from probtrans.errors import ConfigError, ProbtransError
from probtrans.internals.pyro import DeepPyroModule, frozen_parameters_unwarned
from probtrans.internals.transformers import (
    attention_implementation,
    calls_attention_registry,
    register_attention,
    sdpa_attention,
)
from probtrans.runtime.precision import full_precision
from probtrans.specs import Spec
from probtrans.specs.attention import ATTENTION_OPTIONS, in_backbone

#: the name of probtrans's attention function in Hugging Face's registry
IMPLEMENTATION = "probtrans"
#: the attribute of a swapped self-attention module that holds its probtrans layer
LAYER = "attn"
#: what a block may ask of Hugging Face's attention functions that changes its weights and that
#: probtrans attention does not apply (a swapped block asking for one is refused)
UNHONOURED = ("is_causal", "sliding_window", "softcap", "position_bias", "s_aux", "sinks")
#: an additive attention mask's masked entries: −∞, the dtype's minimum, or BERT's old −10⁴
MASKED = -1e4


def known_projections() -> list[str]:
    """``query, key, value`` (or the stacked map) per family, for messages (each set once)."""
    return list(dict.fromkeys(", ".join(f.projections) for f in FAMILIES.entries()))


@dataclass(frozen=True)
class Block:
    """A self-attention module of a backbone: its path, the module, its key projection (a
    fused family's: the keys' part of its stacked map) and that projection's width."""

    path: str
    module: nn.Module
    key_map: nn.Module

    @property
    def width(self) -> int:
        if isinstance(self.key_map, StackedPart):  # the keys' part of a stacked map
            return self.key_map.out_features
        return adapted_linear(self.key_map).out_features

    @property
    def token_width(self) -> int:
        """The size of the tokens the block projects (its hidden size)."""
        return adapted_linear(getattr(self.key_map, "stacked", self.key_map)).in_features


def key_map(module: nn.Module) -> nn.Module | None:
    """The key projection of a self-attention module: one with the query, key and value
    projections of a family (:meth:`~probtrans.backbone.families.Family.key_map`); None for any
    other module."""
    family = module_family(module)
    return None if family is None else family.key_map(module)


def attention_blocks(model: nn.Module) -> list[Block]:
    """The self-attention modules of ``model``, bottom to top."""
    blocks = []
    for path, module in model.named_modules():
        keys = key_map(module)
        if keys is not None:
            blocks.append(Block(path, module, keys))
    return blocks


def key_padding(mask: Tensor | None) -> Tensor | None:
    """The keys (B, L) that a Hugging Face attention mask (B, 1|H, L_q, L) lets the queries see:
    a boolean mask (True: attend) or an additive one (0: attend, at most −10⁴: masked).
    probtrans attention masks keys only, so a mask that differs between queries (causal, a
    sliding window) raises, and so does an additive mask with other values: a bias on the logits
    (BEiT's relative positions), which would otherwise be dropped."""
    if mask is None:
        return None
    allowed = mask
    if mask.dtype.is_floating_point:
        allowed = mask == 0
        if not (allowed | (mask <= MASKED)).all():
            raise ProbtransError(
                "a block swapped to probtrans attention was given an additive attention mask "
                "with values other than 0 and −∞, a bias on its logits (a relative position "
                "bias, as BEiT's); probtrans attention adds none"
            )
    keys = allowed.any(dim=1).any(dim=1)
    seen = allowed.any(dim=-1, keepdim=True)  # queries with a key to see (not padding rows)
    if not torch.equal(allowed & seen, keys[:, None, None, :].expand_as(allowed) & seen):
        raise ProbtransError(
            "a block swapped to probtrans attention was given an attention mask that differs "
            "between queries (causal or a sliding window); probtrans attention lets every "
            "query see every unpadded key"
        )
    return keys


def probtrans_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """Hugging Face's attention-function signature: q, k, v (B, H, L, d) → ((B, L, H, d), no
    weights). A block holding a probtrans layer uses it; any other runs scaled dot-product
    attention."""
    layer = module._modules.get(LAYER)
    if layer is None:
        return sdpa_attention(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    changed = {
        k: f"a tensor of shape {tuple(v.shape)}" if isinstance(v, Tensor) else repr(v)
        for k, v in kwargs.items()
        if k in UNHONOURED and v is not None and v is not False  # a tensor too (T5's bias)
    }
    if changed:
        raise ProbtransError(
            f"{getattr(layer, '_pyro_name', LAYER)}: the block asks its attention function for "
            f"{', '.join(f'{k}={v}' for k, v in changed.items())}, which probtrans attention "
            f"does not apply; its weights would not be the block's"
        )
    scale = block_scale(scaling, query.shape[-1])
    if not math.isclose(scale, 1.0):
        query = query * scale
    block_dtype, dtype = query.dtype, layer_dtype(layer, query)  # a float32 layer in a bf16 model
    query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
    keys = CastMap(key_map(module), block_dtype, dtype)
    h = layer.attend_projected(query, key, value, key_padding(attention_mask), keys).to(block_dtype)
    if h.shape != query.shape:  # sample dimensions: vectorised plates around the model
        raise ProbtransError(
            f"{getattr(layer, '_pyro_name', LAYER)}: a layer swapped into a Hugging Face block "
            f"takes one draw per call, and under vectorised plates (Predictive(..., "
            f"parallel=True), vectorised ELBO particles) it gives {tuple(h.shape)} where the "
            f"block wants {tuple(query.shape)}; use parallel=False"
        )
    return h.transpose(1, 2).contiguous(), None


def layer_dtype(layer: nn.Module, query: Tensor) -> torch.dtype:
    """The dtype a swapped ``layer`` computes in: that of its parameters (float32 as built,
    also inside a model loaded in bfloat16 or float16, whose queries are cast up to it), or, for
    a layer without any, ``query``'s made :func:`~probtrans.runtime.precision.full_precision`."""
    dtypes = [p.dtype for p in layer.parameters() if p.is_floating_point()]
    return dtypes[0] if dtypes else full_precision(query).dtype


class CastMap(nn.Module):
    """A block's map ``inner`` (its key projection) read by a layer that computes in another
    dtype: its input cast to the block's ``block_dtype``, its output to the layer's ``dtype``.
    Not a submodule of the model: the block holds the map."""

    def __init__(self, inner: nn.Module, block_dtype: torch.dtype, dtype: torch.dtype) -> None:
        super().__init__()
        self.__dict__["inner"] = inner  # not registered: the block holds it
        self.block_dtype, self.dtype = block_dtype, dtype

    def forward(self, x: Tensor) -> Tensor:
        return self.inner(x.to(self.block_dtype)).to(self.dtype)


def block_scale(scaling: float | None, d_head: int) -> float:
    """The factor that makes a block's queries ones whose q·k / √d_head are its logits, the
    scale every probtrans kind reads them at: 1 for a block that scales by 1/√d_head (BERT;
    ``scaling`` None is Hugging Face's default, the same), √d_head for one that scales its
    queries itself and passes ``scaling`` = 1 (ESM, whose rotary positions need it so)."""
    return 1.0 if scaling is None else scaling * math.sqrt(d_head)


def register_implementation() -> None:
    """Add :func:`probtrans_attention` to Hugging Face's registries (again is harmless)."""
    register_attention(IMPLEMENTATION, probtrans_attention)


def chosen_blocks(blocks: list[Block], layers: list[int] | str, field: str) -> list[Block]:
    """The blocks that ``layers`` names (indices, negative from the top, or ``"all"``)."""
    if layers == "all":
        return blocks
    chosen = []
    for index in layers:
        if not -len(blocks) <= index < len(blocks):
            raise ConfigError(
                f"{field} = {list(layers)}: index {index} is out of range: the backbone has "
                f"{len(blocks)} self-attention blocks (0 … {len(blocks) - 1}, or −1 … "
                f"−{len(blocks)} from the top)"
            )
        block = blocks[index]
        if block in chosen:
            raise ConfigError(f"{field} = {list(layers)}: block {block.path} is named twice")
        chosen.append(block)
    return sorted(chosen, key=blocks.index)


def swap_blocks(
    model: nn.Module,
    layers: list[int] | str = (-1,),
    attention: str | Spec = "softmax",
    field: str = "model.swap",
    **options: Any,
) -> list[Block]:
    """Give the self-attention blocks ``layers`` of the Hugging Face ``model`` (in place) a
    probtrans ``attention`` kind (a kind name with ``options``, or an options object) that forms
    their weights from the pretrained queries, keys and values; returns the swapped blocks.

    The new layers are ``PyroModule``\\ s held as ``{block}.attn``; :class:`PyroBackbone`
    (what :func:`swap_attention` returns) names their sample sites after their path.
    """
    config = getattr(model, "config", None)
    blocks = attention_blocks(model)
    if config is None or not blocks:
        raise ConfigError(
            f"{field}: {type(model).__name__} has no self-attention blocks of a known shape "
            f"(modules with linear maps {' / '.join(known_projections())})"
        )
    check_one_block_per_layer(model, blocks, field)
    check_not_encoder_decoder(model, field)
    chosen = chosen_blocks(blocks, list(layers) if layers != "all" else "all", f"{field}.layers")
    kind = attention if isinstance(attention, str) else attention.kind
    refusal = ATTENTION.get(kind, f"{field}.attention.kind").backbone_refusal
    if refusal is not None:
        raise ConfigError(
            f"{field}.attention.kind = {kind!r}: cannot be placed in a backbone: {refusal}"
        )
    heads = attention_heads(config, field)
    width = chosen[0].width
    given = {} if isinstance(attention, str) else attention.model_dump(exclude_unset=True)
    options_class = ATTENTION_OPTIONS.get(kind, f"{field}.attention.kind")
    chosen_options = options_class.model_validate({**given, **options, "kind": kind})
    attention = in_backbone(chosen_options, width // heads)  # unset: the backbone's scales
    check_swappable(chosen, field)  # every block, before the model changes
    for block in chosen:
        if LAYER in block.module._modules:
            raise ConfigError(f"{field}: {block.path} already holds a probtrans layer")
    use_implementation(model, chosen, field)
    for block in chosen:
        layer = make_attention(attention, block.width, heads, projections=False)
        block.module.add_module(LAYER, layer)
    return chosen


def check_one_block_per_layer(model: nn.Module, blocks: list[Block], field: str) -> None:
    """Raise ConfigError naming ``field`` for a model with fewer self-attention modules than its
    config has layers: one module runs in several layers (ALBERT shares its weights across
    them), and a layer swapped into it would run in all of them, its sites named once."""
    layers = getattr(model.config, "num_hidden_layers", None)
    if isinstance(layers, int) and len(blocks) < layers:
        raise ConfigError(
            f"{field}: {type(model).__name__} runs {len(blocks)} self-attention module(s) in "
            f"its {layers} layers (weights shared across layers, as in ALBERT), and probtrans "
            f'swaps attention one layer at a time; adapters (weights = "lora") and the head '
            f"apply without a swap"
        )


def check_not_encoder_decoder(model: nn.Module, field: str) -> None:
    """Raise ConfigError naming ``field`` for a whole encoder-decoder model (T5, BART, ...): its
    decoder's blocks attend causally or to the encoder's tokens (cross-attention), and probtrans
    attention attends within one sequence; its encoder (``model.get_encoder()``, what a
    probtrans classifier loads) can be swapped."""
    if getattr(model.config, "is_encoder_decoder", False) and model.get_encoder() is not model:
        raise ConfigError(
            f"{field}: {type(model).__name__} is an encoder-decoder model, whose decoder attends "
            f"causally and to the encoder's tokens; probtrans attention attends within one "
            f"sequence: swap the blocks of its encoder, model.get_encoder()"
        )


def attends_causally(model: nn.Module) -> bool:
    """Whether ``model`` has an attention module that attends causally (``is_causal``: a
    decoder's, GPT-2's or Llama's): each token sees only those before it."""
    return any(getattr(module, "is_causal", False) is True for module in model.modules())


def check_swappable(blocks: list[Block], field: str) -> None:
    """Raise ConfigError naming ``field`` for a block whose attention probtrans cannot take
    over: one that does not call the attention registry, attends causally (a decoder's), or
    within a sliding window."""
    for block in blocks:
        module, name = block.module, f"{block.path} ({type(block.module).__name__})"
        if not calls_attention_registry(module):
            raise ConfigError(
                f"{field}: {name} does not call Hugging Face's attention-function registry, so "
                f"its attention cannot be swapped"
            )
        if getattr(module, "is_causal", True):  # transformers' default where unset
            raise ConfigError(
                f"{field}: {name} attends causally (a decoder's block), and probtrans attention "
                f"attends in both directions"
            )
        if block.token_width != block.width:
            raise ConfigError(
                f"{field}: {name} projects tokens of size {block.token_width} to keys of size "
                f"{block.width}, and probtrans attention takes blocks whose heads together are "
                f"as wide as its tokens"
            )
        if getattr(module, "sliding_window", None) is not None:
            raise ConfigError(
                f"{field}: {name} attends within a sliding window of {module.sliding_window} "
                f"tokens, and probtrans attention to every token; choose blocks of global "
                f"attention"
            )


def use_implementation(model: nn.Module, blocks: list[Block], field: str) -> None:
    """Switch ``model`` to probtrans's attention function; raise ConfigError, the model left as
    it was, where ``transformers`` declines the switch for a block (it does so, with a logged
    warning only, for a model class whose source does not read the attention registry its
    way)."""
    register_implementation()
    before = attention_implementation(model.config)
    model.set_attn_implementation(IMPLEMENTATION)
    for block in blocks:
        config = getattr(block.module, "config", model.config)
        if attention_implementation(config) != IMPLEMENTATION:
            model.set_attn_implementation(before)
            raise ConfigError(
                f"{field}: {type(model).__name__} keeps the attention function "
                f"{attention_implementation(config)!r} in {block.path}: transformers does not "
                f"let this model change it (its attention modules must call "
                f"ALL_ATTENTION_FUNCTIONS.get_interface), so its attention cannot be swapped"
            )


class PyroBackbone(DeepPyroModule):
    """A Hugging Face model as a ``PyroModule`` for your own Pyro model: called as the model
    itself, its swapped layers' sites named after their path (``model.encoder.layer.1.
    attention.self.attn.a_v``, prefixed by the attribute that holds it in your module). Under
    Pyro's global param store its trainable parameters are registered there as ``pyro.module``
    registers them, and its frozen ones are left out without a warning each
    (:func:`~probtrans.internals.pyro.frozen_parameters_unwarned`).

    Activation (gradient) checkpointing is refused in training: it runs each block again in the
    backward pass, outside Pyro's handlers, where a swapped layer would draw its attention anew
    (``torch.utils.checkpoint`` stops at the mismatch, or the gradient is another draw's)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.attach_deep()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        # a frozen backbone under the global param store: reading ``self.model`` registers it
        with frozen_parameters_unwarned():
            model = self.model
            checkpointing = getattr(model, "is_activation_checkpointing", False)
            if checkpointing and model.training and torch.is_grad_enabled():
                raise ProbtransError(
                    f"{type(model).__name__}: activation checkpointing is on (activation_ or "
                    f"gradient_checkpointing_enable()), which runs each block again in the "
                    f"backward pass, outside Pyro's handlers, where a probtrans layer would draw "
                    f"its attention anew; turn it off (model.activation_checkpointing_disable())"
                )
            return model(*args, **kwargs)


def swap_attention(
    model: nn.Module,
    layers: list[int] | str = (-1,),
    attention: str | Spec = "softmax",
    **options: Any,
) -> PyroBackbone:
    """``model`` (a Hugging Face transformer, changed in place) with the blocks ``layers``
    given the probtrans ``attention`` kind (:func:`swap_attention`), as a :class:`PyroBackbone`
    for your own SVI (``probtrans.swap_attention``)."""
    swap_blocks(model, layers, attention, field="swap_attention", **options)
    return PyroBackbone(model)


@torch.no_grad()
def start_from_pretrained(model: nn.Module, **inputs: Tensor) -> None:
    """Give the swapped layers of ``model`` initial values from the pretrained model itself
    (:meth:`~probtrans.attention.multihead.MultiHeadAttention.start_from`: H-STO's centroids from
    its keys, SGPA's inducing locations from its tokens): ``model(**inputs)`` runs once with
    its own attention, and each swapped block's input tokens are given to its layer."""
    swapped = [b for b in attention_blocks(model) if LAYER in b.module._modules]
    seen: dict[nn.Module, Tensor] = {}

    def keep(module: nn.Module, args: tuple, kwargs: dict) -> None:
        seen[module] = args[0] if args else kwargs["hidden_states"]

    hooks = [b.module.register_forward_pre_hook(keep, with_kwargs=True) for b in swapped]
    was_training = model.training
    try:
        model.eval()
        model.set_attn_implementation("sdpa")
        model(**inputs)
    finally:
        model.set_attn_implementation(IMPLEMENTATION)
        model.train(was_training)
        for hook in hooks:
            hook.remove()
    mask = inputs.get("attention_mask")
    for block in swapped:
        hidden = seen[block.module]  # (B, L, D)
        tokens = hidden[mask.bool()] if mask is not None else hidden.flatten(0, 1)
        block.module._modules[LAYER].start_from(tokens, block.key_map)


@contextmanager
def sampled_blocks(model: nn.Module, layers: list[int] | str, tau: float) -> Iterator[None]:
    """Inside the block, the blocks ``layers`` of the Hugging Face ``model`` form their weights
    as STO samples (Pei et al. 2022, Eq. 9–11: relaxed one-hot over their own logits q kᵀ) at
    temperature ``tau`` × √d_head, whatever they held before; afterwards the model is as it was.
    The post-hoc stochastic-attention predictive of a trained (or untouched) model."""
    field = "predictive.stochastic_layers"
    chosen = layers if layers == "all" else list(layers)
    every = attention_blocks(model)
    check_one_block_per_layer(model, every, field)
    check_not_encoder_decoder(model, field)
    blocks = chosen_blocks(every, chosen, field)
    check_swappable(blocks, field)
    before = {block.path: block.module._modules.get(LAYER) for block in blocks}
    implementation = attention_implementation(model.config)
    heads = attention_heads(model.config, field)
    try:
        for block in blocks:
            scale = tau * (block.width // heads) ** 0.5
            layer = make_attention("sto", block.width, heads, projections=False, tau=scale)
            device = next(block.module.parameters()).device
            block.module._modules[LAYER] = layer.to(device)
        use_implementation(model, blocks, field)
        yield
    finally:
        for block in blocks:
            if before[block.path] is None:
                del block.module._modules[LAYER]
            else:
                block.module._modules[LAYER] = before[block.path]
        model.set_attn_implementation(implementation)
