"""The embedded default task: scikit-learn's handwritten digits as a small vision-transformer task.

1,797 8×8 grey-level images (UCI optical recognition of handwritten digits, as shipped in
``sklearn.datasets.load_digits``), pixel values 0–16 scaled to [0, 1]. Out-of-domain data are the
digits of held-out classes (``data.ood_classes``, default 8 and 9): the model is trained on the
other classes and should be uncertain on these. The in-domain images are split, stratified by
class and seeded by ``data.split_seed``, into train / validation / test.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from probtrans.data.bundle import DataBundle, DataSplit
from probtrans.errors import ConfigError
from probtrans.specs import DataSpec


def digit_images() -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 images (N, 8, 8) as float32 in [0, 1], and their classes (N,) in 0–9."""
    digits = load_digits()
    return (digits.images / 16.0).astype(np.float32), digits.target


def held_out_name(held_out: list[int]) -> str:
    """The name of the out-of-domain set of the held-out classes, e.g. ``digits_8_9``."""
    return "digits_" + "_".join(map(str, held_out))


def load_digits_bundle(spec: DataSpec) -> DataBundle:
    """Train / validation / test of the in-domain classes, and the held-out classes as OOD."""
    images, targets = digit_images()
    images = images[:, None]  # (N, 1, 8, 8)
    held_out = sorted(set(spec.ood_classes))
    if not set(held_out) <= set(range(10)) or len(held_out) > 8:
        raise ConfigError(f"data.ood_classes = {spec.ood_classes}: must be at most 8 digits in 0–9")
    kept = [c for c in range(10) if c not in held_out]
    in_domain = np.isin(targets, kept)
    relabel = {c: i for i, c in enumerate(kept)}
    x = images[in_domain]
    y = np.array([relabel[c] for c in targets[in_domain]])
    idx = np.arange(len(y))
    rest, test = train_test_split(
        idx, test_size=spec.test_fraction, stratify=y, random_state=spec.split_seed
    )
    train, val = train_test_split(
        rest,
        test_size=spec.val_fraction / (1.0 - spec.test_fraction),
        stratify=y[rest],
        random_state=spec.split_seed,
    )

    def split(rows: np.ndarray) -> DataSplit:
        return DataSplit(torch.from_numpy(x[rows]), torch.from_numpy(y[rows]).long())

    ood_x = images[~in_domain]
    # Label -1: out-of-domain images have no in-domain class; only their uncertainty is scored.
    ood = DataSplit(torch.from_numpy(ood_x), torch.full((len(ood_x),), -1, dtype=torch.long))
    return DataBundle(
        name="digits",
        train=split(train),
        val=split(val),
        test=split(test),
        ood={held_out_name(held_out): ood},
        class_names=[str(c) for c in kept],
        kind="image",
        image_shape=(1, 8, 8),
        description={
            "source": "sklearn.datasets.load_digits (UCI handwritten digits, 8x8)",
            "in_domain_classes": kept,
            "ood": f"digits of held-out classes {held_out}",
        },
    )
