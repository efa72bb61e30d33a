"""The backbone families: what probtrans needs to know of each kind of Hugging Face encoder, one
:class:`Family` per entry of :data:`FAMILIES`, so that a new family is one
:func:`register_family` call.

A family's self-attention modules project the tokens to queries, keys and values, with three
linear maps of its own names (:attr:`Family.projections`) or with one map that gives the three
stacked (ModernBERT's ``Wqkv``), and call the attention function their
config names in Hugging Face's registry (:mod:`probtrans.backbone.swap`). Its config gives the
number of heads under :attr:`Family.heads`; its learned positions may start after the padding id
(RoBERTa's ``padding_idx + 1``: :attr:`Family.position_offset`); LoRA adapts its query and value
maps (the stacked map of a fused family) unless ``lora.targets`` names others (Hu et al. 2022,
Sec. 7.1). A model is of the family that lists its config's ``model_type``; a model type no
family lists is of the first family whose projections its modules have.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from probtrans.errors import ConfigError
from probtrans.registry import Registry


@dataclass(frozen=True)
class Family:
    """One family of encoders: ``name`` (in messages), the config ``model_types`` it covers,
    the attribute names of its self-attention modules' ``projections`` — (query, key, value),
    or one name for a map whose output is the three stacked in that order —, the config
    attribute of its attention ``heads``, and whether its learned positions start after
    ``pad_token_id + 1`` (``position_offset``)."""

    name: str
    model_types: tuple[str, ...]
    projections: tuple[str, str, str] | tuple[str] = ("query", "key", "value")
    heads: str = "num_attention_heads"
    position_offset: bool = False

    def __post_init__(self) -> None:
        if len(self.projections) not in (1, 3):
            raise ValueError(
                f"Family {self.name!r}: projections = {self.projections!r}: name the query, key "
                f"and value maps, or the one map that gives the three stacked"
            )

    @property
    def lora_targets(self) -> list[str]:
        """The maps LoRA adapts by default: the query and value projections (the stacked map of
        a fused family)."""
        return list(self.projections[::2])

    def key_map(self, module: nn.Module) -> nn.Module | None:
        """The key projection of ``module`` if it is a self-attention module of this family (its
        projections are linear maps, or adapters of them), else None; of a fused family, the
        keys' part of the stacked map."""
        maps = [getattr(module, name, None) for name in self.projections]
        if not all(adapted_linear(m) is not None for m in maps):
            return None
        return maps[1] if len(maps) == 3 else StackedPart(maps[0], 1, 3)


#: the attribute under which an adapter keeps the linear map it adapts: probtrans's
#: :class:`~probtrans.backbone.lora.LoRALinear` (``base``), ``peft``'s LoRA layers (``base_layer``)
ADAPTED = ("base", "base_layer")


def adapted_linear(module: nn.Module | None) -> nn.Linear | None:
    """The ``nn.Linear`` that ``module`` is, or that it adapts (:data:`ADAPTED`: a LoRA layer of
    probtrans or of ``peft`` around it); None for any other module."""
    if isinstance(module, nn.Linear):
        return module
    inner = [getattr(module, name, None) for name in ADAPTED]
    return next((m for m in inner if isinstance(m, nn.Linear)), None)


class StackedPart(nn.Module):
    """Part ``index`` of ``parts`` equal parts of a linear map's output (or an adapter's): the
    keys of a map that gives queries, keys and values stacked. Not a submodule of the model: it
    reads the map's current weights, adapters included."""

    def __init__(self, stacked: nn.Module, index: int, parts: int) -> None:
        super().__init__()
        self.__dict__["stacked"] = stacked  # not registered: the model holds it
        self.index, self.parts = index, parts
        self.out_features = adapted_linear(stacked).out_features // parts

    def forward(self, x: Tensor) -> Tensor:
        return self.stacked(x).unflatten(-1, (self.parts, -1))[..., self.index, :]


#: the backbone families by name, in the order a model type none lists is matched
FAMILIES: Registry[Family] = Registry("backbone family")


def register_family(family: Family) -> Family:
    """Add ``family`` to :data:`FAMILIES` (a plugin's one call)."""
    return FAMILIES.register(family.name, family)


register_family(Family("BERT", ("bert", "electra", "ernie", "megatron-bert")))
register_family(
    Family(
        "RoBERTa", ("roberta", "xlm-roberta", "camembert", "xlm-roberta-xl"), position_offset=True
    )
)
register_family(Family("DistilBERT", ("distilbert",), ("q_lin", "k_lin", "v_lin"), "n_heads"))
register_family(Family("ViT", ("vit",), ("q_proj", "k_proj", "v_proj")))  # transformers 5
register_family(Family("ModernBERT", ("modernbert",), ("Wqkv",)))  # queries, keys, values stacked
# families whose attention probtrans cannot take over (disentangled or relative-position logits,
# refused by the swap with the reason) and whose query and value maps LoRA adapts by default
register_family(
    Family("DeBERTa", ("deberta", "deberta-v2"), ("query_proj", "key_proj", "value_proj"))
)
register_family(Family("MPNet", ("mpnet",), ("q", "k", "v")))
register_family(Family("T5", ("t5", "mt5", "umt5"), ("q", "k", "v"), "num_heads"))


def family_of_config(config: Any) -> Family | None:
    """The family listing ``config.model_type``; None for a model type none lists."""
    model_type = getattr(config, "model_type", None)
    return next((f for f in FAMILIES.entries() if model_type in f.model_types), None)


def module_family(module: nn.Module) -> Family | None:
    """The first family whose projections the self-attention ``module`` has as linear maps (or
    adapters of them); None for any other module."""
    return next((f for f in FAMILIES.entries() if f.key_map(module) is not None), None)


def family_of(model: nn.Module) -> Family | None:
    """The family of a Hugging Face ``model``: the one listing its model type, else the first
    whose projections its modules have; None for neither."""
    listed = family_of_config(getattr(model, "config", None))
    if listed is not None:
        return listed
    found = {module_family(module) for module in model.modules()} - {None}
    return next((f for f in FAMILIES.entries() if f in found), None)


def lora_targets(model: nn.Module, field: str = "model.prior.lora.targets") -> list[str]:
    """The maps LoRA adapts in ``model`` when ``lora.targets`` is unset: its family's query and
    value projections; a model of no known family raises ConfigError naming ``field``."""
    family = family_of(model)
    if family is None:
        raise ConfigError(
            f"{field}: unset, and {type(model).__name__} is of no known backbone family "
            f"({', '.join(FAMILIES.names())}): name the linear maps to adapt"
        )
    return family.lora_targets


def attention_heads(config: Any, field: str = "model.swap") -> int:
    """The backbone's attention heads: its family's config attribute (``num_attention_heads``;
    DistilBERT's ``n_heads``), else the first of the families' attributes the config has; a
    config giving no single count (Swin's one per stage) raises ConfigError naming ``field``."""
    family = family_of_config(config)
    names = [family.heads] if family else [f.heads for f in FAMILIES.entries()]
    name = next((name for name in names if getattr(config, name, None)), names[0])
    heads = getattr(config, name, None)
    if not isinstance(heads, int):
        raise ConfigError(
            f"{field}: the backbone's config gives {name} = {heads!r}, not one number of heads "
            f"for every block (a model of stages, as Swin), so its attention cannot be swapped"
        )
    return heads


def max_positions(config: Any) -> int:
    """The longest token sequence the backbone takes: its learned positions, less RoBERTa's
    first ``pad_token_id + 1``, which are not for tokens (unbounded without learned ones)."""
    positions = getattr(config, "max_position_embeddings", None)
    if positions is None:
        return 2**31
    family = family_of_config(config)
    if family is not None and family.position_offset:
        positions -= config.pad_token_id + 1
    return int(positions)
