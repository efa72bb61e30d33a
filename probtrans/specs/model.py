"""Model specs (``models/**.toml``): what is modelled — data, network, attention, priors."""

from __future__ import annotations

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


class DataSpec(Spec):
    """``[data]``: which data set and how it is split (:mod:`probtrans.data`)."""

    name: str = "digits"
    """A data source registered in ``probtrans.data.sources.DATA_SOURCES``."""
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
    """Text: tokens kept per text (at most ``model.max_positions``)."""


class PriorSpec(Spec):
    """``[model.prior]``: Normal(0, scale²) priors on network weights."""

    weights: Literal["none", "last_layer", "all"] = "none"
    """Which weights are random: none (maximum likelihood), the head, or all."""
    scale: Positive = 1.0


class HeadSpec(Spec):
    """``[model.head]``: a linear map of the pooled features, or SNGP's Gaussian-process output
    layer, a linear map of random Fourier features of an RBF kernel (:mod:`probtrans.sngp`)."""

    kind: Literal["linear", "random_features"] = "linear"
    features: PositiveInt = 1024
    """random_features: M, the number of random Fourier features."""
    lengthscale: Positive = 1.0
    """random_features: the RBF kernel's length scale ℓ."""


class NetworkSpec(Spec):
    """``[model]``: the transformer encoder and its classification head."""

    d_model: PositiveInt = 64
    n_heads: PositiveInt = 4
    n_layers: PositiveInt = 2
    d_ff: PositiveInt = 128
    norm: Literal["pre", "post"] = "pre"
    pooling: Literal["mean", "first"] = "mean"
    dropout: Rate = 0.1
    max_positions: PositiveInt = 512
    """Learned positions of token inputs: the longest sequence the network takes."""
    attention: AttentionOptions = SoftmaxOptions()
    prior: PriorSpec = PriorSpec()
    head: HeadSpec = HeadSpec()
    spectral_norm: NonNegative = 0.0
    """SNGP: every Linear map of the encoder gets spectral norm at most this bound; 0 = off."""

    @model_validator(mode="after")
    def _consistent(self) -> NetworkSpec:
        check_heads(self.d_model, self.n_heads)
        if self.spectral_norm and self.prior.weights == "all":
            raise rule(
                "spectral_norm",
                self.spectral_norm,
                "needs model.prior.weights = 'none' or 'last_layer' (spectral normalisation "
                "bounds deterministic weights)",
            )
        return self


class ModelSpec(SpecFile):
    """A model spec file. Its ``[model]`` table is :attr:`network`."""

    data: DataSpec = DataSpec()
    network: NetworkSpec = Field(NetworkSpec(), alias="model")

    @model_validator(mode="after")
    def _fits(self) -> ModelSpec:
        if self.data.max_len > self.network.max_positions:
            raise rule(
                "data.max_len",
                self.data.max_len,
                f"must be at most model.max_positions = {self.network.max_positions}",
            )
        return self
