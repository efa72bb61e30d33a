"""Foreground/background labelling of noisy digits: the interactive-segmentation use case of
Movellan & Gabbur (2020, "On Line Belief Propagation", Eq. 31–38).

Data: scikit-learn's 1,797 handwritten digits (8×8, grey levels 0–16 scaled to [0, 1]), split
into training and test images. Every pixel is a token; its label is foreground (1) if the clean
grey level of the *target* digit exceeds ``threshold``, else background (0). The input is noisy
in two ways (:func:`make_inputs`):

- clutter: a second, random digit of the same split is overlaid, x = max(bright, c · faint),
  where a fair coin decides whether the target is the bright digit and the distractor the faint
  one (contrast c = ``distractor_contrast``) or the reverse. Which digit the annotator wants is
  not in the input, as in interactive segmentation; ``distractor_contrast = 0`` turns it off;
- white noise: x + ε, ε ~ N(0, noise_std²) iid per pixel, no clipping.

Training draws fresh distractors and noise at every step; the test inputs are one seeded draw.

Model: each pixel token embeds its window×window noisy neighbourhood plus a learned position,
and transformer blocks (Gaussian-mixture attention by default) give it context. A final layer
of mixture units, one per pixel, labels the pixels (:class:`SegmentationModel`): unit j's key
ξ_j and pixel j's query q_j are the same projection of the contextual token, and its expected
value μ_j = softmax(evidence of pixel j's own neighbourhood) lies on the label simplex and is
trained to predict pixel j's label. The label of pixel i is its inferred value v_i
(Eq. 13–15). A correct label for pixel c, the one-hot value v_c, updates the units that explain
it (Eq. 35–38) and through them every pixel that attends to those units. Optionally the model is
trained through such corrections (``train.max_corrections``), the paper's "Combining off-line
learning and on-line adaptation": adaptation is differentiable, so training can shape the keys
and values for it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import Tensor, nn

from probtrans.adaptation import propagate_corrections
from probtrans.attention import attention_options, build_attention
from probtrans.attention.gaussian_mixture import GaussianMixtureOptions, MixtureUnits
from probtrans.config import build_dataclass, read_toml
from probtrans.encoder import Block
from probtrans.errors import ConfigError

IMAGE_SIDE = 8
N_PIXELS = IMAGE_SIDE * IMAGE_SIDE
CLASS_NAMES = ("background", "foreground")
ATTENTION_TABLES = ("attention", "labeller")  # [model.attention], [model.labeller]


# ---------------------------------------------------------------------------------- spec
@dataclass
class SegDataSpec:
    noise_std: float = 0.2  # std of the white Gaussian noise added to every pixel
    distractor_contrast: float = 0.5  # contrast c of the overlaid second digit; 0: none
    threshold: float = 0.5  # clean grey level above which a pixel is foreground
    n_test: int = 300  # images held out for evaluation
    split_seed: int = 0


@dataclass
class SegNetSpec:
    d_model: int = 32
    n_heads: int = 4
    n_layers: int = 2  # context blocks before the labelling units
    d_ff: int = 64
    window: int = 3  # each pixel token sees its window×window noisy neighbourhood (odd)
    d_key: int = 16  # query/key dimension of the labelling units
    attention: Any = None  # options of the context blocks' attention ([model.attention])
    labeller: Any = None  # GaussianMixtureOptions of the labelling units ([model.labeller])


@dataclass
class SegTrainSpec:
    steps: int = 800
    batch_size: int = 64
    lr: float = 3e-3
    # train through the corrections too: each step an annotator fixes k ~ U{0..K} random pixels
    # per image, propagated as in [corrections] (Eq. 35–38); 0 trains without corrections
    max_corrections: int = 20


@dataclass
class CorrectionSpec:
    """How the annotator corrects pixels and how the corrections propagate (Eq. 35–38)."""

    ks: list[int] = field(default_factory=lambda: [0, 1, 2, 5, 10, 20])  # corrected pixels
    n_test: int = 200  # test images evaluated
    selection: Literal["random", "errors"] = "random"  # which pixels the annotator fixes
    n_iter: int = 2  # EM iterations of the update
    theta_mu: float = 0.05  # precision of the Gaussian prior of μ around the trained μ⁰
    theta_beta1: float | None = None  # Gamma shape of the prior of β; None: β not updated
    theta_beta2: float | None = None  # Gamma rate; None: mode at the trained β
    theta_pi: float | None = 1.0  # Dirichlet strength of the prior of π; None: π not updated


@dataclass
class SegmentationSpec:
    data: SegDataSpec = field(default_factory=SegDataSpec)
    model: SegNetSpec = field(default_factory=SegNetSpec)
    train: SegTrainSpec = field(default_factory=SegTrainSpec)
    corrections: CorrectionSpec = field(default_factory=CorrectionSpec)
    seed: int = 0  # model initialisation, training noise and batches, test noise, annotator
    path: str = "<defaults>"


def load_segmentation_spec(path: str | Path) -> SegmentationSpec:
    """Read and validate a segmentation spec (``models/digits_segmentation/*.toml``)."""
    raw = read_toml(path)
    file = str(path)
    net = raw.get("model", {})
    if not isinstance(net, dict):
        raise ConfigError(f"{file}: model: must be a table")
    tables = {name: net.get(name, {}) for name in ATTENTION_TABLES}
    for name, table in tables.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{file}: model.{name}: must be a table")
    net = {k: v for k, v in net.items() if k not in ATTENTION_TABLES}
    spec = build_dataclass(SegmentationSpec, {**raw, "model": net}, file)
    spec.path = file
    for name, table in tables.items():
        options = attention_options({"kind": "gaussian_mixture", **table}, file, f"model.{name}")
        setattr(spec.model, name, options)
    validate_segmentation_spec(spec)
    return spec


def default_segmentation_spec() -> SegmentationSpec:
    """The default spec: standard attention (Gaussian-mixture attention with its defaults) in
    the blocks, and labelling units with α = 0.3, β = 2, uniform priors, two EM iterations."""
    spec = SegmentationSpec()
    spec.model.attention = GaussianMixtureOptions()
    spec.model.labeller = GaussianMixtureOptions(alpha=0.3, beta=2.0, prior="uniform", n_iter=2)
    return spec


def validate_segmentation_spec(spec: SegmentationSpec) -> None:
    """Check the values of a segmentation spec; errors name the file and the field."""
    def check(ok: bool, name: str, value: Any, rule: str) -> None:
        if not ok:
            raise ConfigError(f"{spec.path}: {name} = {value!r}: {rule}")

    data, net, train, corr = spec.data, spec.model, spec.train, spec.corrections
    check(isinstance(net.labeller, GaussianMixtureOptions), "model.labeller.kind",
          getattr(net.labeller, "kind", None), "must be 'gaussian_mixture'")
    check(data.noise_std >= 0, "data.noise_std", data.noise_std, "must be >= 0")
    check(0 <= data.distractor_contrast < 1, "data.distractor_contrast",
          data.distractor_contrast, "must be in [0, 1)")
    check(0 < data.threshold < 1, "data.threshold", data.threshold, "must be in (0, 1)")
    check(2 <= data.n_test <= 1000, "data.n_test", data.n_test, "must be in 2..1000")
    for name in ("d_model", "n_heads", "n_layers", "d_ff", "d_key"):
        value = getattr(net, name)
        check(value > 0 or (name == "n_layers" and value == 0), f"model.{name}", value,
              "must be > 0" if name != "n_layers" else "must be >= 0")
    check(net.d_model % net.n_heads == 0, "model.n_heads", net.n_heads, "must divide d_model")
    check(net.window > 0 and net.window % 2 == 1, "model.window", net.window,
          "must be a positive odd number")
    for name in ("steps", "batch_size"):
        check(getattr(train, name) > 0, f"train.{name}", getattr(train, name), "must be > 0")
    check(train.lr > 0, "train.lr", train.lr, "must be > 0")
    check(0 <= train.max_corrections < N_PIXELS, "train.max_corrections", train.max_corrections,
          f"must be in 0..{N_PIXELS - 1}")
    check_ks(corr.ks, f"{spec.path}: corrections.ks")
    check(2 <= corr.n_test <= data.n_test, "corrections.n_test", corr.n_test,
          f"must be in 2..data.n_test = {data.n_test}")
    check(corr.n_iter > 0, "corrections.n_iter", corr.n_iter, "must be > 0")
    check(corr.theta_mu > 0, "corrections.theta_mu", corr.theta_mu, "must be > 0")
    beta1 = corr.theta_beta1
    check(beta1 is None or beta1 > 1, "corrections.theta_beta1", beta1, "must be > 1")
    beta2 = corr.theta_beta2
    check(beta2 is None or beta2 > 0, "corrections.theta_beta2", beta2, "must be > 0")
    check(beta1 is not None or beta2 is None, "corrections.theta_beta2", beta2,
          "needs corrections.theta_beta1")
    check(beta1 is None or beta2 is not None or net.labeller.beta is not None,
          "corrections.theta_beta2", beta2,
          "must be given when model.labeller.beta is unset (no trained β to centre on)")
    check(corr.theta_pi is None or corr.theta_pi >= 0, "corrections.theta_pi", corr.theta_pi,
          "must be >= 0")


def check_ks(ks: list[int], where: str) -> None:
    """Numbers of corrected pixels: distinct, in 0..N_PIXELS − 1."""
    if not ks or any(not 0 <= k < N_PIXELS for k in ks) or len(set(ks)) != len(ks):
        raise ConfigError(f"{where} = {ks}: must be distinct pixel counts in 0..{N_PIXELS - 1}")


def training_fingerprint(spec: SegmentationSpec) -> dict:
    """The parts of a spec that determine the trained model."""
    fingerprint = {
        "data": dataclasses.asdict(spec.data),
        "model": dataclasses.asdict(spec.model),
        "train": dataclasses.asdict(spec.train),
        "seed": spec.seed,
    }
    if spec.train.max_corrections:  # corrections seen in training
        corr = dataclasses.asdict(spec.corrections)
        fingerprint["corrections"] = {k: corr[k] for k in corr if k.startswith(("theta", "n_iter"))}
    return fingerprint


# ---------------------------------------------------------------------------------- data
@dataclass
class SegmentationData:
    """Clean training images (N, 8, 8) in [0, 1]; the fixed noisy test inputs (N_test, 8, 8)
    and their labels (N_test, 64)."""

    train_images: Tensor
    test_noisy: Tensor
    test_labels: Tensor


def pixel_labels(images: Tensor, threshold: float) -> Tensor:
    """Foreground (1) / background (0) per pixel: images (N, 8, 8) → labels (N, 64) long."""
    return (images.flatten(1) > threshold).long()


def make_inputs(
    targets: Tensor, pool: Tensor, spec: SegDataSpec, generator: torch.Generator
) -> Tensor:
    """Noisy inputs (N, 8, 8) for the clean target digits ``targets`` (N, 8, 8): a random
    distractor from ``pool`` overlaid, target and distractor at full and ``distractor_contrast``
    contrast in random order (see the module doc), then white Gaussian noise."""
    inputs = targets
    if spec.distractor_contrast > 0:
        others = pool[torch.randint(len(pool), (len(targets),), generator=generator)]
        target_bright = torch.rand(len(targets), 1, 1, generator=generator) < 0.5
        bright = torch.where(target_bright, targets, others)
        faint = torch.where(target_bright, others, targets)
        inputs = torch.maximum(bright, spec.distractor_contrast * faint)
    return inputs + spec.noise_std * torch.randn(targets.shape, generator=generator)


def load_segmentation_data(spec: SegDataSpec, seed: int) -> SegmentationData:
    """Split the digits (seeded by ``spec.split_seed``) and draw the test inputs (``seed``)."""
    images = torch.from_numpy((load_digits().images / 16.0).astype(np.float32))
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(spec.split_seed))
    test, train = images[order[: spec.n_test]], images[order[spec.n_test:]]
    generator = torch.Generator().manual_seed(seed + 1)
    return SegmentationData(
        train_images=train,
        test_noisy=make_inputs(test, test, spec, generator),
        test_labels=pixel_labels(test, spec.threshold),
    )


# --------------------------------------------------------------------------------- model
class SegmentationModel(nn.Module):
    """Noisy images (B, 8, 8) → label probabilities per pixel (B, 64, 2); see the module doc.

    ``self.units`` is the layer of labelling mixture units on which corrections act.
    """

    def __init__(self, spec: SegNetSpec, n_classes: int = len(CLASS_NAMES)) -> None:
        super().__init__()
        d = spec.d_model
        self.window = spec.window
        self.embed = nn.Linear(spec.window**2, d)
        self.position = nn.Parameter(torch.randn(N_PIXELS, d) * 0.02)
        self.blocks = nn.ModuleList(
            Block(d, spec.d_ff, 0.0, "pre",
                  build_attention(spec.attention, d, spec.n_heads, f"blocks.{i}.attn"))
            for i in range(spec.n_layers)
        )
        self.norm = nn.LayerNorm(d)
        self.query = nn.Linear(d, spec.d_key)  # also the key: ξ_j = q_j
        self.evidence = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, n_classes))
        self.units = MixtureUnits(spec.labeller, 1, spec.d_key, n_classes)

    def forward(self, noisy: Tensor, with_evidence: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """noisy: (B, 8, 8) → v: (B, 64, C), each row a probability vector; with
        ``with_evidence`` also the units' expected values μ (B, 64, C)."""
        patches = F.unfold(noisy.unsqueeze(1), self.window, padding=self.window // 2)
        local = self.embed(patches.transpose(1, 2)) + self.position  # (B, 64, D)
        x = local
        for block in self.blocks:
            x = block(x, None)
        x = self.norm(x)
        q = self.query(x).unsqueeze(1)  # queries = keys (B, 1, 64, d_key): one head
        mu = self.evidence(local).softmax(-1)  # (B, 64, C) on the simplex
        v = self.units(q, q, mu.unsqueeze(1), None).squeeze(1)
        return (v, mu) if with_evidence else v


def correct(
    model: SegmentationModel, noisy: Tensor, index: Tensor, labels: Tensor,
    spec: CorrectionSpec, **kwargs: Any,
) -> Any:
    """``model(noisy, **kwargs)`` after the annotator has given the correct ``labels`` (B, k) of
    the pixels ``index`` (B, k), propagated by Eq. 35–38 with the settings of ``spec``."""
    values = F.one_hot(labels, len(CLASS_NAMES)).to(noisy.dtype)  # correct values v_c (B, k, C)
    return propagate_corrections(
        model, noisy, index=index, values=values, n_iter=spec.n_iter, theta_mu=spec.theta_mu,
        theta_beta1=spec.theta_beta1, theta_beta2=spec.theta_beta2, theta_pi=spec.theta_pi,
        **kwargs,
    )


def nll(probs: Tensor, labels: Tensor) -> Tensor:
    """Mean −log v_i[y_i] over pixels; probs (..., C), labels (...)."""
    picked = probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return -picked.clamp_min(1e-6).log().mean()


def train_segmentation(spec: SegmentationSpec, data: SegmentationData) -> SegmentationModel:
    """Fit the model with Adam on fresh noisy inputs made from the training images (seeded).

    Loss: NLL of the inferred labels v (on the uncorrected pixels when the step has
    corrections) plus NLL of the units' own values μ, so that μ_j means pixel j's label.
    """
    torch.manual_seed(spec.seed)
    model = SegmentationModel(spec.model)
    optimiser = torch.optim.Adam(model.parameters(), lr=spec.train.lr)
    generator = torch.Generator().manual_seed(spec.seed)
    train = data.train_images
    model.train()
    for _ in range(spec.train.steps):
        targets = train[torch.randint(len(train), (spec.train.batch_size,), generator=generator)]
        noisy = make_inputs(targets, train, spec.data, generator)
        labels = pixel_labels(targets, spec.data.threshold)
        k = int(torch.randint(spec.train.max_corrections + 1, (), generator=generator))
        if k == 0:
            probs, mu = model(noisy, with_evidence=True)
            loss = nll(probs, labels)
        else:
            order = torch.argsort(torch.rand(labels.shape, generator=generator), dim=1)
            index = order[:, :k]
            probs, mu = correct(model, noisy, index, labels.gather(1, index), spec.corrections,
                                with_evidence=True)
            uncorrected = torch.ones_like(labels, dtype=torch.bool).scatter(1, index, False)
            loss = nll(probs[uncorrected], labels[uncorrected])
        loss = loss + nll(mu, labels)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    model.eval()
    return model
