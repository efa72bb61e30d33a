"""Model specs (``models/**.toml``): what is modelled — data, network, attention, priors."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from probtrans.specs.attention import AttentionOptions, SoftmaxOptions
from probtrans.specs.base import (
    NonNegative,
    Positive,
    PositiveInt,
    Rate,
    Seed,
    Spec,
    SpecFile,
    check_heads,
    rule,
)

SplitFraction = Annotated[float, Field(gt=0, lt=0.5)]
#: the name of an out-of-domain set: it keys ``metrics.json`` and the columns of tables
SET_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.+-]*"
SetName = Annotated[str, Field(pattern=f"^{SET_NAME_PATTERN}$", max_length=64)]
#: ``[data] name`` of a data set read from the spec's own files (``train`` and the rest)
FILES = "files"


class OodSetSpec(Spec):
    """``[[data.ood]]``: a named out-of-domain set, scored against the in-domain test split."""

    name: SetName
    source: str = Field(min_length=1)
    """A file (CSV, TSV, JSON Lines, Parquet; ``.npz`` for images), ``hf:ID[:CONFIG][@SPLIT]``
    (default split ``test``), or ``digits-c:CORRUPTION:SEVERITY`` (the digits test split
    corrupted, :mod:`probtrans.data.corruptions`). Relative paths start at the spec's folder."""
    text_column: str | None = None
    """Default: ``data.text_column``."""
    text_pair_column: str | None = Field(None, min_length=1)
    """Default: ``data.text_pair_column`` (given only where the data are pairs of texts)."""
    image_column: str | None = None
    """Default: ``data.image_column``."""
    label_column: str | None = None
    """Default: ``data.label_column``; its labels are used when the column exists (they must
    be classes of the task), ``""`` ignores labels."""


class DataSpec(Spec):
    """``[data]``: which data set and how it is split (:mod:`probtrans.data`).

    A registered data set (``name``), or your own files: ``kind`` and ``train`` (with optional
    ``validation`` and ``test``), read by :mod:`probtrans.data.files`."""

    name: str = "digits"
    """A data source registered in ``probtrans.data.sources.DATA_SOURCES``; ``"files"`` (set
    by giving ``train``) reads the files below."""
    kind: Literal["text", "image"] | None = None
    """Your files: texts or images (required with ``train``)."""
    train: str | None = None
    """Your files: a CSV, TSV, JSON Lines (.jsonl, .jsonl.gz) or Parquet file of texts, an
    ``.npz`` of images (``x`` (N, H, W) or (N, C, H, W), ``y``), or ``hf:ID[:CONFIG][@SPLIT]``
    (a Hugging Face data set, or a folder written by its ``save_to_disk``). Relative paths start
    at the spec's folder."""
    validation: str | None = None
    """Your files: else ``val_fraction`` of ``train`` (stratified, seeded by ``split_seed``)."""
    test: str | None = None
    """Your files: else ``test_fraction`` of ``train`` (stratified, seeded by ``split_seed``)."""
    text_column: str = Field("text", min_length=1)
    text_pair_column: str | None = Field(None, min_length=1)
    """Your text files: a second text column, for a sentence-pair task (entailment, paraphrase):
    each row's two texts are one input, encoded as the tokenizer's pair ([CLS] text [SEP] pair
    [SEP] with BERT's, its segment ids given to a backbone that takes them; a [SEP] token
    between them with a word-level one). Inputs to predict are then pairs too."""
    image_column: str = Field("image", min_length=1)
    label_column: str = Field("label", min_length=1)
    labels: list[str] | list[int] | None = None
    """Your files: the classes in order (the label values; or, for labels 0..C−1, their names;
    where a ClassLabel feature names the integers, by those names). Default: string labels
    sorted, integer labels 0..C−1 (names from the data set if it has them)."""
    normalize: bool = True
    """Your images: standardise each channel with the training split's mean and standard
    deviation (after scaling 8-bit pixels to [0, 1])."""
    ood: list[OodSetSpec] = []
    """Named out-of-domain sets, each scored against the in-domain test split."""
    split_seed: Seed = 0
    patch_size: PositiveInt = 2
    """Images: patches of patch_size × patch_size pixels are the tokens."""
    ood_classes: list[int] = [8, 9]
    """Digits: the classes held out as out-of-domain."""
    val_fraction: SplitFraction = 0.2
    test_fraction: SplitFraction = 0.2
    protocol: Literal["h_sto", "sgpa"] = "h_sto"
    """Text: whose train/validation/test split (Pei et al. 2022 or Chen & Li 2023)."""
    vocab_size: int = Field(20_000, ge=3)
    """Text: the most frequent training words kept, with the padding and unknown ids."""
    min_freq: PositiveInt = 1
    """Text: words seen fewer times in training map to the unknown id."""
    max_len: PositiveInt = 512
    """Text: tokens kept per text (at most ``model.max_positions``); images ignore it."""
    tokenizer: str | None = Field(None, min_length=1)
    """Text: a pretrained Hugging Face tokenizer, a folder written by ``save_pretrained`` or
    ``hf:ID``, instead of a word-level one learned on the training split (``vocab_size`` and
    ``min_freq`` do not apply to it: either set beside it is refused). A ``model.backbone`` sets
    it to its own."""

    def in_words(self) -> str:
        """The data for a figure's title: the registered data set's name, or your training
        file's name (without its folders) or hub ID."""
        if self.train is None:
            return self.name
        return self.train if self.train.startswith("hf:") else Path(self.train).name

    @model_validator(mode="after")
    def _source(self) -> DataSpec:
        files = ("kind", "train", "validation", "test", "labels")
        given = [f for f in files if getattr(self, f) is not None]
        if self.train is not None:
            if "name" in self.model_fields_set and self.name != FILES:
                raise rule("name", self.name, "give a registered data set or train, not both")
            if self.kind is None:
                raise rule("kind", None, "is required with data.train: 'text' or 'image'")
            self.name = FILES
        elif given or self.name == FILES:
            raise rule(
                "train", None, f"is required with data.{given[0] if given else 'name = files'}"
            )
        if self.text_pair_column is not None:
            if self.train is None or self.kind != "text":
                raise rule(
                    "text_pair_column",
                    self.text_pair_column,
                    "applies to your own text files (data.kind = 'text' with data.train)",
                )
            if self.text_pair_column == self.text_column:
                raise rule("text_pair_column", self.text_pair_column, "is data.text_column")
        unpaired = [s.name for s in self.ood if s.text_pair_column is not None]
        if unpaired and self.text_pair_column is None:
            raise rule(
                "ood",
                unpaired,
                "give text_pair_column only where data.text_pair_column reads pairs of texts",
            )
        names = [s.name for s in self.ood]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise rule("ood", repeated, "names each set once")
        if self.tokenizer is not None:  # given, or a model.backbone's (probtrans.resolve)
            for name in ("vocab_size", "min_freq"):
                value = getattr(self, name)
                if value != type(self).model_fields[name].default:
                    raise rule(
                        name,
                        value,
                        "does not apply to a pretrained tokenizer (data.tokenizer, or the "
                        "model.backbone's own), which keeps its vocabulary; remove it",
                    )
        return self


class LoraSpec(Spec):
    """``[model.prior] lora``: low-rank adapters W x + (alpha / r) B A x of a backbone's linear
    maps (Hu et al. 2022), A (r, d_in) and B (d_out, r); with ``weights = "lora"`` A (and B,
    ``random = "ab"``) carry the priors and the backbone is frozen unless
    ``model.train_backbone`` (Bayesian LoRA; Wang et al. 2024)."""

    r: PositiveInt = 8
    alpha: Positive = 16.0
    random: Literal["a", "ab"] = "a"
    """The factors that carry the prior: ``"a"``, A alone with B a point estimate (BLoB's
    asymmetric Bayesianisation, Wang et al. 2024 §3.2: with B starting at zero, A's noise leaves
    the pretrained map unchanged at the start), or ``"ab"``, both."""
    targets: list[Annotated[str, Field(min_length=1)]] | None = Field(None, min_length=1)
    """The backbone's linear maps to adapt: those whose module name (the last part of its
    path) is one of these, e.g. ``query`` and ``value`` in BERT, ``q_lin`` and ``v_lin`` in
    DistilBERT, or whose whole path ends with one; ``"all-linear"``: every linear map (in any
    family; on all-MiniLM-L6-v2 and CoLA, 3 epochs, it reached plain fine-tuning's MCC where
    query and value alone stayed 20 points below). Unset: the query and value maps of the
    backbone's family (``probtrans.backbone.families``)."""


class PriorSpec(Spec):
    """``[model.prior]``: Normal(0, scale²) priors on network weights."""

    weights: Literal["none", "last_layer", "all", "lora"] = "none"
    """Which weights are random: none (maximum likelihood), the head, all, or (with a
    ``model.backbone``) low-rank adapters of the frozen backbone and the head."""
    scale: Positive = 1.0
    lora: LoraSpec = LoraSpec()


class HeadSpec(Spec):
    """``[model.head]``: a linear map of the pooled features, or SNGP's Gaussian-process output
    layer, a linear map of random Fourier features of an RBF kernel (:mod:`probtrans.gp.sngp`)."""

    kind: Literal["linear", "random_features"] = "linear"
    features: PositiveInt = 1024
    """random_features: M, the number of random Fourier features."""
    lengthscale: Positive | None = None
    """random_features: the RBF kernel's length scale ℓ. Unset: with a ``model.backbone``, the
    median distance between the pooled pretrained features of 64 training examples (the
    median heuristic: a length scale at the features' own scale); else 1."""


class SwapSpec(Spec):
    """``[model.swap]``: which self-attention blocks of a ``model.backbone`` form their weights
    with a probtrans attention kind (the pretrained projections are kept,
    :mod:`probtrans.backbone.swap`)."""

    layers: list[int] | Literal["all"] = [-1]
    """Block indices, 0 the lowest; negative ones count from the top (−1 the last)."""
    attention: AttentionOptions = SoftmaxOptions()
    """The attention kind and its options, as ``model.attention``."""


#: ``[model]`` fields that a ``model.backbone`` gives itself (its config), refused beside one
BACKBONE_FIXES = ("d_model", "n_heads", "n_layers", "d_ff", "norm", "max_positions", "attention")


class NetworkSpec(Spec):
    """``[model]``: the transformer encoder and its classification head: one trained here
    (its sizes below), or a pretrained Hugging Face ``backbone``."""

    backbone: str | None = Field(None, min_length=1)
    """A pretrained Hugging Face transformer (:mod:`probtrans.backbone`): ``hf:ID`` (optional
    ``@REVISION``), or a folder written by ``save_pretrained`` (relative paths start at the
    spec's folder). Its tokenizer reads the texts; its sizes replace the ones below."""
    swap: SwapSpec | None = None
    """With a backbone: its blocks whose attention becomes a probtrans kind (default none)."""
    train_backbone: bool | None = None
    """With a backbone: whether its pretrained weights train too (point estimates, at
    ``[optim] backbone_lr``), beside the head, the adapters and the swapped layers' own
    parameters. Unset: frozen under ``prior.weights = "lora"`` (the adapters alone, as LoRA),
    trained otherwise (full fine-tuning). ``true`` with ``"lora"``: full fine-tuning with Bayesian
    adapters on top; ``false`` with ``"last_layer"``: a Bayesian head on frozen features."""

    d_model: PositiveInt = 64
    n_heads: PositiveInt = 4
    n_layers: PositiveInt = 2
    d_ff: PositiveInt = 128
    norm: Literal["pre", "post"] = "pre"
    pooling: Literal["mean", "first", "cls", "last", "pooler"] = "mean"
    """``mean`` over real tokens, or the first token (``first`` or ``cls``): a learned [CLS]
    token for a network trained here, the backbone's own first token ([CLS], ``<s>``); with a
    backbone, ``last``: its last real token (what ``transformers``' sequence classifiers of
    decoders such as GPT-2 and Llama read, the one token of a causal model that sees the whole
    text) and ``pooler``: its own pooler (BERT's tanh layer over [CLS], as
    ``AutoModelForSequenceClassification`` reads it)."""
    dropout: Rate = 0.1
    max_positions: PositiveInt = 512
    """Learned positions of token inputs: the longest sequence the network takes."""
    attention: AttentionOptions = SoftmaxOptions()
    prior: PriorSpec = PriorSpec()
    head: HeadSpec = HeadSpec()
    spectral_norm: NonNegative = 0.0
    """SNGP: every Linear map of the encoder gets spectral norm at most this bound; 0 = off."""

    def in_words(self) -> str:
        """The network for a figure's title: its attention kind, or its backbone (the last
        part of its name) and the kind swapped into which of its blocks."""
        if self.backbone is None:
            return f"{self.attention.kind} attention"
        name = self.backbone.rstrip("/").rpartition("/")[2].rpartition(":")[2]
        if self.swap is None:
            return f"{name} (its own attention)"
        layers = self.swap.layers
        where = "every block" if layers == "all" else f"blocks {', '.join(map(str, layers))}"
        return f"{name} with {self.swap.attention.kind} attention in {where}"

    @model_validator(mode="after")
    def _consistent(self) -> NetworkSpec:
        check_heads(self.d_model, self.n_heads)
        if self.backbone is not None:
            fixed = [
                name
                for name in BACKBONE_FIXES
                if getattr(self, name) != type(self).model_fields[name].default
            ]
            if "attention" in fixed:
                kind = self.attention.kind
                raise rule(
                    "attention",
                    {"kind": kind},
                    f"a backbone keeps its own attention; to put {kind} into its blocks, move "
                    f"the table to [model.swap] attention = {{ kind = {kind!r} }} (and "
                    f"model.swap.layers)",
                )
            if fixed:
                value = getattr(self, fixed[0])
                raise rule(fixed[0], value, "comes from model.backbone; remove it")
            if self.prior.weights == "all" or self.spectral_norm:
                field, value = (
                    ("prior.weights", "all")
                    if self.prior.weights == "all"
                    else ("spectral_norm", self.spectral_norm)
                )
                raise rule(
                    field,
                    value,
                    "not with a model.backbone (use prior.weights = 'last_layer' to fine-tune it "
                    "under a Bayesian head, or 'lora' for Bayesian adapters, with "
                    "model.train_backbone = true to fine-tune it under them)",
                )
        else:
            needs_backbone = {
                "swap": "…" if self.swap is not None else None,
                "pooling": self.pooling if self.pooling in ("pooler", "last") else None,
                "train_backbone": self.train_backbone,
                "prior.weights": "lora" if self.prior.weights == "lora" else None,
            }
            if getattr(self.attention, "lengthscale", None) == "keys":
                needs_backbone["attention.lengthscale"] = "keys"  # measured on pretrained keys
            given = [(field, value) for field, value in needs_backbone.items() if value is not None]
            if given:
                raise rule(*given[0], "needs model.backbone (a pretrained model)")
        if self.spectral_norm and self.prior.weights == "all":
            raise rule(
                "spectral_norm",
                self.spectral_norm,
                "needs model.prior.weights = 'none' or 'last_layer' (spectral normalisation "
                "bounds deterministic weights)",
            )
        return self


class ModelSpec(SpecFile):
    """A model spec file. Its ``[model]`` table is :attr:`network`. That text fits the
    positions (``data.max_len`` ≤ ``model.max_positions``) is checked by
    :func:`probtrans.resolve.load_model_spec`, which knows the data sources of images."""

    data: DataSpec = DataSpec()
    network: NetworkSpec = Field(NetworkSpec(), alias="model")
