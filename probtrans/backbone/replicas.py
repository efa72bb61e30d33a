"""The replicas of a batch run a backbone's deterministic lower blocks once.

The posterior predictive evaluates R replicas of the local randomness of one posterior draw
(attention samples, SGPA outputs) as one pass over the batch repeated R times, sample-major
(:func:`probtrans.inference.predictive.sample_predictive`). In a pretrained backbone whose only
randomness is in its upper blocks (probtrans attention swapped into them, or sampled there
post hoc), the blocks below the first random one compute the same output for every copy. Inside
:func:`once_below_randomness` each of them runs on the first 1/R of its rows, and its output is
tiled R times: the R copies of the batch cost one pass through the lower blocks. The tiling is
done with PyTorch's forward hooks on the blocks, so the backbone's own code is untouched.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from probtrans.attention import MultiHeadAttention
from probtrans.backbone.swap import attention_blocks


def block_stack(model: nn.Module) -> nn.ModuleList | None:
    """The module list of ``model``'s transformer blocks (BERT's ``encoder.layer``, DistilBERT's
    ``transformer.layer``): the innermost list that holds its first self-attention module;
    None without one."""
    blocks = attention_blocks(model)
    if not blocks:
        return None
    modules = dict(model.named_modules())
    parts = blocks[0].path.split(".")
    stack = None
    for end in range(len(parts) - 1):
        parent = modules[".".join(parts[:end])]
        if isinstance(parent, nn.ModuleList) and parts[end].isdigit():
            stack = parent
    return stack


def deterministic_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks of ``model`` below its first random one, bottom to top: none if any module of
    the model is in training mode (dropout on, e.g. MC dropout: the copies differ from the
    embeddings on); otherwise the blocks below the first that holds a probtrans attention
    layer (:class:`~probtrans.attention.MultiHeadAttention`)."""
    stack = block_stack(model)
    if stack is None or any(module.training for module in model.modules()):
        return []
    lower = []
    for block in stack:
        if any(isinstance(module, MultiHeadAttention) for module in block.modules()):
            break
        lower.append(block)
    return lower


def first_rows(value: Any, rows: int, kept: int) -> Any:
    """``value`` (a tensor, or a tuple or dict of them) with each batch-major tensor (at least
    two dimensions, ``rows`` first) cut to its first ``kept`` rows."""
    if isinstance(value, Tensor):
        return value[:kept] if value.dim() >= 2 and value.shape[0] == rows else value
    if isinstance(value, tuple):
        return tuple(first_rows(item, rows, kept) for item in value)
    if isinstance(value, dict):
        return {key: first_rows(item, rows, kept) for key, item in value.items()}
    return value


def tiled(value: Any, kept: int, replicas: int) -> Any:
    """``value`` (as :func:`first_rows`) with each batch-major tensor of ``kept`` rows repeated
    ``replicas`` times along its first dimension (sample-major, as the batch was)."""
    if isinstance(value, Tensor):
        if value.dim() >= 2 and value.shape[0] == kept:
            return value.repeat(replicas, *[1] * (value.dim() - 1))
        return value
    if isinstance(value, tuple):
        return tuple(tiled(item, kept, replicas) for item in value)
    return value


@contextmanager
def once_below_randomness(model: nn.Module, replicas: int) -> Iterator[None]:
    """Inside the block, the deterministic lower blocks of the Hugging Face ``model``
    (:func:`deterministic_blocks`), given a batch that is R = ``replicas`` equal copies of its
    first 1/R rows, compute those rows alone and tile their output R times. A batch whose size
    R does not divide runs as it is. Afterwards the model is as it was."""
    lower = deterministic_blocks(model) if replicas > 1 else []
    handles: list[RemovableHandle] = []
    cut: dict[int, int] = {}  # id(block) → rows it was given, while it runs

    def before(block: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        hidden = args[0] if args else kwargs.get("hidden_states")
        if not isinstance(hidden, Tensor) or hidden.shape[0] % replicas:
            return None
        rows = hidden.shape[0]
        cut[id(block)] = rows
        kept = rows // replicas
        return first_rows(args, rows, kept), first_rows(kwargs, rows, kept)

    def after(block: nn.Module, args: tuple, output: Any) -> Any:
        rows = cut.pop(id(block), None)
        return None if rows is None else tiled(output, rows // replicas, replicas)

    try:
        for block in lower:
            handles.append(block.register_forward_pre_hook(before, with_kwargs=True))
            handles.append(block.register_forward_hook(after))
        yield
    finally:
        for handle in handles:
            handle.remove()
