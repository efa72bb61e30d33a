"""The corrections curve: accuracy on the pixels an annotator did not fix, as she fixes more.

For each test image of the digits segmentation task (:mod:`probtrans.segmentation`) the annotator
gives the correct label of k pixels; the labelling units absorb them by EM (Movellan & Gabbur 2020,
Eq. 35–38, :func:`probtrans.attention.em_adaptation.propagate_corrections`) and every pixel is
labelled again. The score is the accuracy on the 64 − k uncorrected pixels, against the same pixels
labelled without the corrections. With ``selection = "random"`` the fixed pixels are drawn
uniformly, so without propagation the expected accuracy does not depend on k and any gain is
propagation; ``"errors"`` fixes the model's mistakes first (a realistic annotator; both columns
then rise). The sets are nested: the first k of one random order per image.

``probtrans corrections`` (:func:`run`) trains the model of a spec (or reloads it from
``DIR/model.pt`` when it was trained from the same settings), prints the table and writes
``DIR/corrections.json`` and ``DIR/corrections.png``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from matplotlib.figure import Figure
from torch import Tensor

from probtrans.errors import ProbtransError
from probtrans.segmentation.pixel_data import SegmentationData, load_segmentation_data
from probtrans.segmentation.segmenter import SegmentationModel, correct, train_segmentation
from probtrans.segmentation.spec import N_PIXELS, CorrectionSpec, SegmentationSpec
from probtrans.storage.checkpoint import load_cached, save_checkpoint
from probtrans.storage.io import save_png, write_json


def annotator_order(
    predictions: Tensor, labels: Tensor, selection: str, generator: torch.Generator
) -> Tensor:
    """The order in which the annotator fixes pixels, per image: (N, 64) pixel indices.

    ``random``: a uniform random order; ``errors``: the wrong pixels first (in random order).
    """
    order = torch.argsort(torch.rand(labels.shape, generator=generator), dim=1)
    if selection == "errors":
        wrong = (predictions != labels).gather(1, order)
        order = order.gather(1, torch.argsort((~wrong).long(), dim=1, stable=True))
    return order


def sem(per_image: Tensor) -> float:
    """Standard error of the mean over images."""
    return (per_image.std() / len(per_image) ** 0.5).item()


@torch.no_grad()
def corrections_curve(
    model: SegmentationModel, noisy: Tensor, labels: Tensor, spec: CorrectionSpec, seed: int
) -> dict:
    """Accuracy on uncorrected pixels for each k of ``spec.ks``, with and without propagation.

    noisy: (N, 8, 8) test inputs; labels: (N, 64). Means and standard errors over images.
    """
    before = model(noisy).argmax(-1)  # (N, 64)
    order = annotator_order(before, labels, spec.selection, torch.Generator().manual_seed(seed))
    rows = []
    for k in spec.ks:
        index = order[:, :k]  # (N, k)
        after = before
        if k > 0:
            after = correct(model, noisy, index, labels.gather(1, index), spec).argmax(-1)
        uncorrected = torch.ones_like(labels, dtype=torch.bool).scatter(1, index, False)
        n = uncorrected.sum(1)  # (N,) = 64 − k
        with_prop = ((after == labels) & uncorrected).sum(1) / n
        without = ((before == labels) & uncorrected).sum(1) / n
        rows.append(
            {
                "k": k,
                "accuracy": with_prop.mean().item(),
                "accuracy_sem": sem(with_prop),
                "accuracy_without_propagation": without.mean().item(),
                "accuracy_without_propagation_sem": sem(without),
                "gain": (with_prop - without).mean().item(),
                "gain_sem": sem(with_prop - without),  # paired over images
            }
        )
    return {"selection": spec.selection, "n_test": len(labels), "rows": rows}


def format_table(curve: dict) -> str:
    lines = [
        f"accuracy on uncorrected pixels, mean ± s.e. over {curve['n_test']} test images "
        f"(annotator: {curve['selection']} pixels)",
        f"{'k':>3}  {'with propagation':>17}  {'without':>17}  {'gain (paired)':>17}",
    ]
    for row in curve["rows"]:
        lines.append(
            f"{row['k']:>3}  {row['accuracy']:>8.4f} ± {row['accuracy_sem']:.4f}  "
            f"{row['accuracy_without_propagation']:>8.4f} ± "
            f"{row['accuracy_without_propagation_sem']:.4f}  "
            f"{row['gain']:>+8.4f} ± {row['gain_sem']:.4f}"
        )
    return "\n".join(lines)


def save_plot(curve: dict, path: Path, title: str) -> None:
    ks = [row["k"] for row in curve["rows"]]
    fig = Figure(figsize=(5, 3.5))
    ax = fig.subplots()
    for key, label in (
        ("accuracy", "with propagation (Eq. 35–38)"),
        ("accuracy_without_propagation", "without propagation"),
    ):
        ax.errorbar(
            ks,
            [r[key] for r in curve["rows"]],
            [r[f"{key}_sem"] for r in curve["rows"]],
            marker="o",
            capsize=3,
            label=label,
        )
    ax.set_xlabel("pixels corrected by the annotator (k)")
    ax.set_ylabel("accuracy on uncorrected pixels")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path)


def trained_model(
    spec: SegmentationSpec, data: SegmentationData, out: Path
) -> tuple[SegmentationModel, bool]:
    """Reload DIR/model.pt if it was trained from the same settings, else train and save it
    (an unreadable model.pt is set aside first)."""
    path = out / "model.pt"
    fingerprint = json.dumps(spec.training_fingerprint(), sort_keys=True)
    model = SegmentationModel(spec.network)
    saved = load_cached(path, ["fingerprint", "state"])
    if saved is not None and saved["fingerprint"] == fingerprint:
        model.load_state_dict(saved["state"])
        return model.eval(), True
    model = train_segmentation(spec, data)
    save_checkpoint(path, {"fingerprint": fingerprint, "state": model.state_dict()})
    return model, False


def run(spec: SegmentationSpec, out: Path) -> dict:
    """Train or reload, evaluate the curve, write JSON and PNG into ``out``; returns the JSON."""
    blocking = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise ProbtransError(
            f"--out {out}: {blocking} is a file; corrections writes a folder, choose another"
        )
    start = time.perf_counter()
    data = load_segmentation_data(spec.data, spec.seed)
    model, reloaded = trained_model(spec, data, out)
    trained = time.perf_counter()
    n = spec.corrections.n_test
    curve = corrections_curve(
        model, data.test_noisy[:n], data.test_labels[:n], spec.corrections, spec.seed
    )
    result = {
        "spec": spec.file,
        "seed": spec.seed,
        "data": spec.data.model_dump(),
        "corrections": spec.corrections.model_dump(),
        "n_pixels": N_PIXELS,
        "model_reloaded": reloaded,
        "train_or_load_seconds": round(trained - start, 2),
        **curve,
        "wall_seconds": round(time.perf_counter() - start, 2),
    }
    write_json(out / "corrections.json", result)
    save_plot(
        curve,
        out / "corrections.png",
        f"{Path(spec.file).name}: digits, noise σ = {spec.data.noise_std}, "
        f"distractor contrast {spec.data.distractor_contrast}",
    )
    return result
