"""The segmentation task's data: clean digits, their pixel labels, and noisy inputs.

scikit-learn's 1,797 handwritten digits (8×8, grey levels scaled to [0, 1]) are split into
training and test images. Every pixel is a token; its label is foreground (1) if the clean grey
level of the *target* digit exceeds ``threshold``, else background (0). The input is noisy in two
ways (:func:`make_inputs`):

- clutter: a second, random digit of the same split is overlaid, x = max(bright, c · faint),
  where a fair coin decides whether the target is the bright digit and the distractor the faint
  one (contrast c = ``distractor_contrast``) or the reverse. Which digit the annotator wants is
  not in the input, as in interactive segmentation; ``distractor_contrast = 0`` turns it off;
- white noise: x + ε, ε ~ N(0, noise_std²) iid per pixel, no clipping.

Training draws fresh distractors and noise at every step; the test inputs are one seeded draw.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from probtrans.data.digits import digit_images
from probtrans.segmentation.spec import SegDataSpec


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
    images = torch.from_numpy(digit_images()[0])
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(spec.split_seed))
    test, train = images[order[: spec.n_test]], images[order[spec.n_test :]]
    generator = torch.Generator().manual_seed(seed + 1)
    return SegmentationData(
        train_images=train,
        test_noisy=make_inputs(test, test, spec, generator),
        test_labels=pixel_labels(test, spec.threshold),
    )
