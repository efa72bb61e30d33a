"""The segmentation model and its training (Movellan & Gabbur 2020, "Combining off-line learning
and on-line adaptation").

Each pixel token embeds its window×window noisy neighbourhood plus a learned position, and
transformer blocks (Gaussian-mixture attention by default) give it context. A final layer of
mixture units, one per pixel, labels the pixels (:class:`SegmentationModel`): unit j's key ξ_j
and pixel j's query q_j are the same projection of the contextual token, and its expected value
μ_j = softmax(evidence of pixel j's own neighbourhood) lies on the label simplex and is trained to
predict pixel j's label. The label of pixel i is its inferred value v_i (Eq. 13–15). A correct
label for pixel c, the one-hot value v_c, updates the units that explain it (Eq. 35–38) and
through them every pixel that attends to those units. Optionally the model is trained through
such corrections (``train.max_corrections``): adaptation is differentiable, so training can
shape the keys and values for it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from probtrans.attention.em_adaptation import propagate_corrections
from probtrans.attention.encoder import EncoderBlock
from probtrans.attention.gaussian_mixture import MixtureUnits
from probtrans.segmentation.pixel_data import SegmentationData, make_inputs, pixel_labels
from probtrans.segmentation.spec import N_PIXELS, CorrectionSpec, SegmentationSpec, SegNetSpec

CLASS_NAMES = ("background", "foreground")


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
            EncoderBlock(
                d, spec.n_heads, d_ff=spec.d_ff, dropout=0.0, norm="pre", attention=spec.attention
            )
            for _ in range(spec.n_layers)
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
            x = block(x)
        x = self.norm(x)
        q = self.query(x).unsqueeze(1)  # queries = keys (B, 1, 64, d_key): one head
        mu = self.evidence(local).softmax(-1)  # (B, 64, C) on the simplex
        v = self.units(q, q, mu.unsqueeze(1), None).squeeze(1)
        return (v, mu) if with_evidence else v


def correct(
    model: SegmentationModel,
    noisy: Tensor,
    index: Tensor,
    labels: Tensor,
    spec: CorrectionSpec,
    **kwargs: Any,
) -> Any:
    """``model(noisy, **kwargs)`` after the annotator has given the correct ``labels`` (B, k) of
    the pixels ``index`` (B, k), propagated by Eq. 35–38 with the settings of ``spec``."""
    values = F.one_hot(labels, len(CLASS_NAMES)).to(noisy.dtype)  # correct values v_c (B, k, C)
    return propagate_corrections(
        model,
        noisy,
        index=index,
        values=values,
        n_iter=spec.n_iter,
        theta_mu=spec.theta_mu,
        theta_beta1=spec.theta_beta1,
        theta_beta2=spec.theta_beta2,
        theta_pi=spec.theta_pi,
        **kwargs,
    )


def pixel_nll(probs: Tensor, labels: Tensor) -> Tensor:
    """Mean −log v_i[y_i] over pixels; probs (..., C), labels (...)."""
    picked = probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return -picked.clamp_min(1e-6).log().mean()


def train_segmentation(spec: SegmentationSpec, data: SegmentationData) -> SegmentationModel:
    """Fit the model with Adam on fresh noisy inputs made from the training images (seeded).

    Loss: NLL of the inferred labels v (on the uncorrected pixels when the step has
    corrections) plus NLL of the units' own values μ, so that μ_j means pixel j's label.
    """
    torch.manual_seed(spec.seed)
    model = SegmentationModel(spec.network)
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
            loss = pixel_nll(probs, labels)
        else:
            order = torch.argsort(torch.rand(labels.shape, generator=generator), dim=1)
            index = order[:, :k]
            probs, mu = correct(
                model, noisy, index, labels.gather(1, index), spec.corrections, with_evidence=True
            )
            uncorrected = torch.ones_like(labels, dtype=torch.bool).scatter(1, index, False)
            loss = pixel_nll(probs[uncorrected], labels[uncorrected])
        loss = loss + pixel_nll(mu, labels)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    model.eval()
    return model
