"""The segmentation spec (``models/digits_segmentation/*.toml``): data, network, training and
how corrections propagate (Movellan & Gabbur 2020, Eq. 35–38)."""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from probtrans.specs.attention import GaussianMixtureOptions, attention_options
from probtrans.specs.base import (
    NonNegative,
    NonNegativeInt,
    Positive,
    PositiveInt,
    Seed,
    Spec,
    SpecFile,
    check_heads,
    read_spec,
    rule,
)

IMAGE_SIDE = 8
N_PIXELS = IMAGE_SIDE * IMAGE_SIDE
PixelCount = Annotated[int, Field(ge=0, lt=N_PIXELS)]


class SegDataSpec(Spec):
    """``[data]``: the noisy digits."""

    noise_std: NonNegative = 0.2
    """Standard deviation of the white Gaussian noise added to every pixel."""
    distractor_contrast: Annotated[float, Field(ge=0, lt=1)] = 0.5
    """Contrast c of the overlaid second digit; 0: none."""
    threshold: Annotated[float, Field(gt=0, lt=1)] = 0.5
    """Clean grey level above which a pixel of the target digit is foreground."""
    n_test: Annotated[int, Field(ge=2, le=1000)] = 300
    """Images held out for evaluation."""
    split_seed: Seed = 0


class SegNetSpec(Spec):
    """``[model]``: context blocks and the labelling units."""

    d_model: PositiveInt = 32
    n_heads: PositiveInt = 4
    n_layers: NonNegativeInt = 2
    """Context blocks before the labelling units."""
    d_ff: PositiveInt = 64
    window: PositiveInt = 3
    """Each pixel token sees its window × window noisy neighbourhood (odd)."""
    d_key: PositiveInt = 16
    """Query and key dimension of the labelling units."""
    attention: attention_options("gaussian_mixture") = GaussianMixtureOptions()
    """``[model.attention]``: the context blocks' attention (Gaussian-mixture by default)."""
    labeller: GaussianMixtureOptions = GaussianMixtureOptions(
        alpha=0.3, beta=2.0, prior="uniform", n_iter=2
    )
    """``[model.labeller]``: the labelling mixture units, one per pixel."""

    @model_validator(mode="after")
    def _shapes(self) -> SegNetSpec:
        check_heads(self.d_model, self.n_heads)
        if self.window % 2 == 0:
            raise rule("window", self.window, "must be odd")
        return self


class SegTrainSpec(Spec):
    """``[train]``: Adam on fresh noisy inputs."""

    steps: PositiveInt = 800
    batch_size: PositiveInt = 64
    lr: Positive = 3e-3
    max_corrections: PixelCount = 20
    """Train through the corrections too: each step an annotator fixes k ~ U{0..K} random
    pixels per image, propagated as ``[corrections]`` says; 0 trains without corrections."""


class CorrectionSpec(Spec):
    """``[corrections]``: how the annotator corrects pixels and how the corrections propagate."""

    ks: list[PixelCount] = [0, 1, 2, 5, 10, 20]
    """Numbers of corrected pixels."""
    n_test: Annotated[int, Field(ge=2)] = 200
    """Test images evaluated (at most data.n_test)."""
    selection: Literal["random", "errors"] = "random"
    """Which pixels the annotator fixes."""
    n_iter: PositiveInt = 2
    """EM iterations of the update."""
    theta_mu: Positive = 0.05
    """Precision of the Gaussian prior of μ around the trained μ⁰ (Eq. 35)."""
    theta_beta1: Annotated[float, Field(gt=1)] | None = None
    """Gamma shape of the prior of β (Eq. 37); unset: β not updated."""
    theta_beta2: Positive | None = None
    """Gamma rate of the prior of β; unset: its mode at the trained β."""
    theta_pi: NonNegative | None = 1.0
    """Dirichlet strength of the prior of π (Eq. 38); unset: π not updated."""

    @field_validator("ks")
    @classmethod
    def _distinct(cls, ks: list[int]) -> list[int]:
        if not ks or len(set(ks)) != len(ks):
            raise ValueError(f"must be distinct pixel counts in 0..{N_PIXELS - 1}")
        return ks


class SegmentationSpec(SpecFile):
    """A segmentation spec file. Its ``[model]`` table is :attr:`network`."""

    data: SegDataSpec = SegDataSpec()
    network: SegNetSpec = Field(SegNetSpec(), alias="model")
    train: SegTrainSpec = SegTrainSpec()
    corrections: CorrectionSpec = CorrectionSpec()
    seed: Seed = 0
    """Model initialisation, training noise and batches, test noise, annotator clicks."""

    @model_validator(mode="after")
    def _consistent(self) -> SegmentationSpec:
        corr = self.corrections
        if corr.n_test > self.data.n_test:
            raise rule(
                "corrections.n_test",
                corr.n_test,
                f"must be at most data.n_test = {self.data.n_test}",
            )
        if corr.theta_beta2 is not None and corr.theta_beta1 is None:
            raise rule("corrections.theta_beta2", corr.theta_beta2, "needs corrections.theta_beta1")
        if (
            corr.theta_beta1 is not None
            and corr.theta_beta2 is None
            and self.network.labeller.beta is None
        ):
            raise rule(
                "corrections.theta_beta2",
                None,
                "must be given when model.labeller.beta is unset (no trained β to centre on)",
            )
        return self

    def training_fingerprint(self) -> dict[str, Any]:
        """The parts of the spec that determine the trained model."""
        fingerprint = self.model_dump(by_alias=True, include={"data", "network", "train", "seed"})
        if self.train.max_corrections:  # corrections seen in training
            fingerprint["corrections"] = self.corrections.model_dump(
                include={"n_iter", "theta_mu", "theta_beta1", "theta_beta2", "theta_pi"}
            )
        return fingerprint


def load_segmentation_spec(path: str | os.PathLike[str]) -> SegmentationSpec:
    """Read and check a segmentation spec (``models/digits_segmentation/*.toml``)."""
    return read_spec(SegmentationSpec, path)
