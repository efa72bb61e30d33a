"""Low-rank adapters of a backbone's linear maps (LoRA; Hu et al. 2022, Eq. 3).

An adapted map is h = W x + b + (α / r) B A x with the pretrained W, b (frozen unless
``model.train_backbone``), A (r, d_in) and
B (d_out, r); B starts at zero, so the adapted model starts as the pretrained one, and A as in
the LoRA paper (Kaiming-uniform). :class:`LoRALinear` is a ``PyroModule``: with ``[model.prior]
weights = "lora"`` its ``lora_a`` (and, with ``lora.random = "ab"``, its ``lora_b``) become
``PyroSample`` sites with Normal priors (:class:`probtrans.classifier.BackboneClassifier`), so any
weight guide over them — MAP, mean-field, low-rank, Laplace — is Bayesian fine-tuning of the
adapters. Mean-field over A alone, B a point estimate, is BLoB (Wang et al., NeurIPS 2024, §3.2,
"asymmetric Bayesianisation"): B starts at zero, so the noise of A starts with no effect on the
pretrained map and grows only as far as B does.
"""

from __future__ import annotations

import math

import torch
from pyro.nn import PyroModule
from torch import Tensor, nn

from probtrans.errors import ConfigError

#: the attributes of an adapter that carry its low-rank factors
FACTORS = ("lora_a", "lora_b")
#: ``[model.prior] lora.random`` → the factors that carry the prior (the others are point estimates)
RANDOM_FACTORS = {"a": ("lora_a",), "ab": FACTORS}
#: the ``targets`` entry that adapts every linear map of the backbone (as PEFT's "all-linear")
ALL_LINEAR = "all-linear"


def linear_sizes(module: nn.Module) -> tuple[int, int] | None:
    """(d_in, d_out) of a linear map: an ``nn.Linear``, or ``transformers``' ``Conv1D`` (GPT-2's
    linear maps, x W + b with W stored as (d_in, d_out)); None for any other module."""
    from transformers.pytorch_utils import Conv1D

    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    if isinstance(module, Conv1D):
        d_in, d_out = module.weight.shape
        return d_in, d_out
    return None


class LoRALinear(PyroModule):
    """``base`` (a linear map, :func:`linear_sizes`: frozen with the backbone, or trained under
    ``model.train_backbone``) plus the low-rank update (α / r) B A."""

    def __init__(self, base: nn.Module, r: int, alpha: float) -> None:
        super().__init__()
        d_in, d_out = linear_sizes(base)
        self.base = base
        self.scaling = alpha / r
        self.lora_a = nn.Parameter(torch.empty(r, d_in))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.lora_b = nn.Parameter(torch.zeros(d_out, r))

    def forward(self, x: Tensor) -> Tensor:
        update = (x @ self.lora_a.transpose(0, 1).to(x.dtype)) @ self.lora_b.transpose(0, 1)
        return self.base(x) + self.scaling * update.to(x.dtype)


def add_lora(
    model: nn.Module, targets: list[str], r: int, alpha: float, field: str = "model.prior.lora"
) -> dict[str, LoRALinear]:
    """Replace (in place) every linear map (:func:`linear_sizes`) of ``model`` whose name is one
    of ``targets`` (or whose path ends with one; :data:`ALL_LINEAR`: every one) by a
    :class:`LoRALinear` around it; returns path → adapter. Targets that match no linear map are
    refused."""
    adapters: dict[str, LoRALinear] = {}
    matched: set[str] = set()
    linear = [(p, m) for p, m in model.named_modules() if linear_sizes(m) is not None and p]
    for path, module in linear:
        hits = [t for t in targets if t == ALL_LINEAR or path == t or path.endswith("." + t)]
        if not hits:
            continue
        matched.update(hits)
        parent_path, _, name = path.rpartition(".")
        parent = model.get_submodule(parent_path)
        adapter = LoRALinear(module, r, alpha)
        setattr(parent, name, adapter)
        adapters[path] = adapter
    missing = [t for t in targets if t not in matched]
    if missing:
        names = sorted({path.rpartition(".")[2] for path, _ in linear})  # before any adapter
        known = f"its linear maps are named {', '.join(names)}" if names else "it has none"
        raise ConfigError(
            f"{field}.targets = {targets}: {missing[0]!r} matches no linear map of the backbone "
            f"(nn.Linear or transformers' Conv1D; {known})"
        )
    return adapters
