"""Model and inference specs: strict TOML → dataclasses.

A *model spec* (``models/**.toml``) says what is modelled: data, architecture, attention kind,
priors. An *inference spec* (``inference/*.toml``) says how it is inferred: guide, ELBO,
optimiser, epochs, posterior samples. Every key is checked; an unknown key or a bad value raises
:class:`~probtrans.errors.ConfigError` naming the file and the dotted field.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from probtrans.errors import ConfigError


# ----------------------------------------------------------------------------- model spec
@dataclass
class DataSpec:
    """Which data set and how it is split (see :mod:`probtrans.data`)."""

    name: Literal["digits", "imdb", "cola"] = "digits"
    split_seed: int = 0
    # digits only
    patch_size: int = 2  # image patches are patch_size × patch_size pixels
    ood_classes: list[int] = field(default_factory=lambda: [8, 9])  # held out as out-of-domain
    val_fraction: float = 0.2
    test_fraction: float = 0.2
    # text only (imdb, cola; see probtrans.data.text and probtrans.data.tokenize)
    protocol: Literal["h_sto", "sgpa"] = "h_sto"  # whose train/validation/test split
    vocab_size: int = 20_000  # most frequent training words kept, with the pad and unknown ids
    min_freq: int = 1  # words seen fewer times in training map to the unknown id
    max_len: int = 512  # tokens kept per text; at most model.max_len


@dataclass
class PriorSpec:
    """Normal(0, scale²) priors on network weights; ``none`` keeps them deterministic."""

    weights: Literal["none", "last_layer", "all"] = "none"
    scale: float = 1.0


@dataclass
class HeadSpec:
    """The classification head: ``linear`` on the pooled features, or ``random_features``, the
    SNGP Gaussian-process output layer (a linear map of M random Fourier features of an RBF
    kernel with lengthscale ℓ; see :mod:`probtrans.sngp`)."""

    kind: Literal["linear", "random_features"] = "linear"
    features: int = 1024  # M, random_features only
    lengthscale: float = 1.0  # ℓ, random_features only


@dataclass
class NetSpec:
    """Transformer encoder + linear classification head."""

    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 128
    norm: Literal["pre", "post"] = "pre"
    pooling: Literal["mean", "first"] = "mean"
    dropout: float = 0.1
    max_len: int = 512  # longest token sequence (text data only)
    attention: Any = None  # the options dataclass of the chosen attention kind
    prior: PriorSpec = field(default_factory=PriorSpec)
    head: HeadSpec = field(default_factory=HeadSpec)
    # SNGP: every Linear map of the encoder gets spectral norm at most this bound; 0 = off
    spectral_norm: float = 0.0


@dataclass
class ModelSpec:
    data: DataSpec = field(default_factory=DataSpec)
    model: NetSpec = field(default_factory=NetSpec)
    path: str = "<defaults>"


# ------------------------------------------------------------------------- inference spec
@dataclass
class GuideSpec:
    """Guide over the global latent sites, by registry name (see :mod:`probtrans.guides`)."""

    name: str = "delta"
    init_scale: float = 0.01  # initial posterior std of normal / lowrank guides
    rank: int = 8  # lowrank only
    sites: Literal["auto", "all", "last_layer"] = (
        "auto"  # lowrank only: where the low-rank part goes
    )
    max_lowrank_dims: int = 20_000  # lowrank, sites="auto": larger nets get it on the last layer
    # guide of the whitened SGPA inducing variables u_g (probtrans.gp.guides): full-rank
    # Cholesky per head and output dim (the authors'), mean-field diagonal, or delta (MAP)
    inducing: Literal["cholesky", "diagonal", "delta"] = "cholesky"
    inducing_init_scale: float = 0.1  # initial std of the cholesky / diagonal u_g guides


@dataclass
class ElboSpec:
    name: Literal["trace", "meanfield"] = "trace"
    particles: int = 1
    # KL(q || p) of the global latent sites (weights, SGPA u_g) is multiplied by kl_weight and,
    # with kl_scale = "authors", by N_train: the SGPA authors' loss, mean NLL + KL (the KL not
    # divided by the data-set size). kl_scale = "dataset", kl_weight = 1 is the ELBO itself.
    kl_weight: float = 1.0
    kl_scale: Literal["dataset", "authors"] = "dataset"
    kl_anneal_epochs: int = 0  # linear warm-up of every KL term from 0 over this many epochs


@dataclass
class OptimSpec:
    name: Literal["adam", "clipped_adam"] = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    clip_norm: float = 10.0  # clipped_adam only
    schedule: Literal["constant", "cosine", "exponential"] = "constant"
    gamma: float = 0.999  # exponential schedule: lr multiplier per step


@dataclass
class TrainSpec:
    epochs: int = 30
    batch_size: int = 64
    patience: int = 0  # early stopping after this many epochs without improvement; 0 = off
    monitor: Literal["accuracy", "mcc", "nll"] = "accuracy"  # validation metric kept best
    val_samples: int = 3  # posterior samples used for the validation metric
    # token data: batches of rows of similar length (less padding), see DataSplit.batches
    group_by_length: bool = False


@dataclass
class PredictiveSpec:
    samples: int = 10
    batch_size: int = 256  # rows per pass (examples × samples evaluated together)
    # post-hoc predictives evaluated from the same trained weights, next to the plain one:
    # "mc_dropout" (dropout kept on), "laplace" (last-layer Laplace, prior precision on validation)
    posthoc: list[Literal["mc_dropout", "laplace"]] = field(default_factory=list)
    # prior precision of the Laplace head posterior; 0 = the value of a log grid with the lowest
    # validation NLL (SNGP fixes it to its prior's, 1 for β ~ N(0, I))
    laplace_prior_precision: float = 0.0


@dataclass
class InferenceSpec:
    guide: GuideSpec = field(default_factory=GuideSpec)
    elbo: ElboSpec = field(default_factory=ElboSpec)
    optim: OptimSpec = field(default_factory=OptimSpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    predictive: PredictiveSpec = field(default_factory=PredictiveSpec)
    path: str = "<defaults>"


# ------------------------------------------------------------------------------- loading
def read_toml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML ({err})") from None


def _check_value(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin is Literal:
        if value not in typing.get_args(hint):
            choices = ", ".join(repr(c) for c in typing.get_args(hint))
            raise ConfigError(f"{where} = {value!r}: must be one of {choices}")
        return value
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return None if value is None else _check_value(value, args[0], where)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where} = {value!r}: must be a list")
        (item,) = typing.get_args(hint)
        return [_check_value(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float, str, bool) and (type(value) is not hint):
        raise ConfigError(f"{where} = {value!r}: must be of type {hint.__name__}")
    return value


def build_dataclass(cls: type, table: dict, file: str, prefix: str = "") -> Any:
    """Build ``cls`` from a TOML table, rejecting unknown keys and values of the wrong type.

    Errors read ``FILE: section.key ...``; ``prefix`` is the dotted section of ``table``.
    """
    if not isinstance(table, dict):
        raise ConfigError(f"{file}: {prefix or 'top level'}: must be a table")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)} - {"path"}
    unknown = sorted(set(table) - names)
    if unknown:
        key = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        raise ConfigError(f"{file}: unknown key {key!r} (known here: {', '.join(sorted(names))})")
    kwargs = {}
    for name, value in table.items():
        dotted = f"{prefix}.{name}" if prefix else name
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            kwargs[name] = build_dataclass(hint, value, file, dotted)
        else:
            kwargs[name] = _check_value(value, hint, f"{file}: {dotted}")
    return cls(**kwargs)


def _positive(value: float, where: str) -> None:
    if not value > 0:
        raise ConfigError(f"{where} = {value!r}: must be > 0")


def load_model_spec(path: str | Path) -> ModelSpec:
    """Read and validate a model spec (e.g. ``models/digits/h_sto.toml``)."""
    from probtrans.attention import attention_options

    raw = read_toml(path)
    net_table = dict(raw.get("model", {}))
    attn_table = dict(net_table.pop("attention", {}))
    spec = build_dataclass(ModelSpec, {**raw, "model": net_table}, str(path))
    spec.path = str(path)
    spec.model.attention = attention_options(attn_table, str(path), "model.attention")
    validate_model_spec(spec)
    return spec


def validate_model_spec(spec: ModelSpec) -> None:
    where = f"{spec.path}: model"
    net = spec.model
    for name in ("d_model", "n_heads", "n_layers", "d_ff", "max_len"):
        _positive(getattr(net, name), f"{where}.{name}")
    if net.d_model % net.n_heads:
        raise ConfigError(
            f"{where}.n_heads = {net.n_heads}: must divide model.d_model = {net.d_model}"
        )
    if not 0.0 <= net.dropout < 1.0:
        raise ConfigError(f"{where}.dropout = {net.dropout}: must be in [0, 1)")
    _positive(net.prior.scale, f"{where}.prior.scale")
    _positive(net.head.features, f"{where}.head.features")
    _positive(net.head.lengthscale, f"{where}.head.lengthscale")
    if net.spectral_norm < 0:
        raise ConfigError(f"{where}.spectral_norm = {net.spectral_norm}: must be >= 0 (0 = off)")
    if net.spectral_norm and net.prior.weights == "all":
        raise ConfigError(
            f"{where}.spectral_norm = {net.spectral_norm}: needs model.prior.weights = "
            "'none' or 'last_layer' (spectral normalisation bounds deterministic weights)"
        )
    data = spec.data
    _positive(data.patch_size, f"{spec.path}: data.patch_size")
    for name in ("val_fraction", "test_fraction"):
        value = getattr(data, name)
        if not 0.0 < value < 0.5:
            raise ConfigError(f"{spec.path}: data.{name} = {value}: must be in (0, 0.5)")
    for name in ("max_len", "min_freq"):
        _positive(getattr(data, name), f"{spec.path}: data.{name}")
    if data.vocab_size < 3:
        raise ConfigError(f"{spec.path}: data.vocab_size = {data.vocab_size}: must be >= 3")
    if data.name != "digits" and data.max_len > net.max_len:
        raise ConfigError(
            f"{spec.path}: data.max_len = {data.max_len}: must be at most "
            f"model.max_len = {net.max_len}"
        )


def load_inference_spec(path: str | Path) -> InferenceSpec:
    """Read and validate an inference spec (e.g. ``inference/mfvi.toml``)."""
    from probtrans.guides import GUIDES

    spec = build_dataclass(InferenceSpec, read_toml(path), str(path))
    spec.path = str(path)
    if spec.guide.name not in GUIDES:
        raise ConfigError(
            f"{path}: guide.name = {spec.guide.name!r}: unknown guide "
            f"(known: {', '.join(sorted(GUIDES))})"
        )
    checks = {
        "guide.init_scale": spec.guide.init_scale,
        "guide.rank": spec.guide.rank,
        "guide.inducing_init_scale": spec.guide.inducing_init_scale,
        "elbo.particles": spec.elbo.particles,
        "optim.lr": spec.optim.lr,
        "optim.clip_norm": spec.optim.clip_norm,
        "optim.gamma": spec.optim.gamma,
        "train.epochs": spec.train.epochs,
        "train.batch_size": spec.train.batch_size,
        "train.val_samples": spec.train.val_samples,
        "predictive.samples": spec.predictive.samples,
        "predictive.batch_size": spec.predictive.batch_size,
    }
    for name, value in checks.items():
        _positive(value, f"{path}: {name}")
    if spec.elbo.kl_weight < 0:
        raise ConfigError(f"{path}: elbo.kl_weight = {spec.elbo.kl_weight}: must be >= 0")
    if spec.elbo.kl_anneal_epochs < 0:
        raise ConfigError(f"{path}: elbo.kl_anneal_epochs: must be >= 0")
    if spec.train.patience < 0:
        raise ConfigError(f"{path}: train.patience = {spec.train.patience}: must be >= 0")
    if spec.predictive.laplace_prior_precision < 0:
        raise ConfigError(
            f"{path}: predictive.laplace_prior_precision = "
            f"{spec.predictive.laplace_prior_precision}: must be >= 0 (0 = chosen on validation)"
        )
    return spec
