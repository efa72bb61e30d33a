"""Posterior predictive with ``pyro.infer.Predictive`` and its ArviZ ``InferenceData``.

Only requested sites are kept: class probabilities ``probs`` and sampled labels ``obs`` always,
the attention matrices only with ``attention=True`` (they are B × H × L × L per sample).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import numpy as np
import torch
from pyro.infer import Predictive

from probtrans.data import DataSplit
from probtrans.model import Classifier
from probtrans.objective import self_guided

with warnings.catch_warnings():  # ArviZ 0.23 announces its 1.0 refactor on import
    warnings.filterwarnings("ignore", category=FutureWarning, module="arviz")
    import arviz as az


def attention_sites(classifier: Classifier) -> list[str]:
    """Names of the attention sample sites of ``classifier``, e.g. ``layers.0.attn.a_v``."""
    names = []
    for layer in classifier.encoder.layers:
        attn = layer.attn
        names += [attn.site(s) for s in attn.sample_sites]
    return names


@torch.no_grad()
def predict(
    classifier: Classifier,
    guide: Callable,
    split: DataSplit,
    samples: int = 10,
    batch_size: int = 256,
    device: str = "cpu",
    attention: bool = False,
) -> dict[str, np.ndarray]:
    """S posterior predictive draws on ``split``, batched over the data.

    Returns ``probs`` (S, N, C), ``obs`` (S, N) and, with ``attention=True``, every attention site
    (S, N, H, L, ·).
    """
    sites = ["probs", "obs"] + (attention_sites(classifier) if attention else [])
    model = classifier if attention else self_guided(classifier)
    predictive = Predictive(model, guide=guide, num_samples=samples, return_sites=sites)
    was_training = classifier.training
    classifier.eval()
    chunks: dict[str, list[np.ndarray]] = {name: [] for name in sites}
    for _, inputs, mask, _ in split.batches(batch_size):
        mask = None if mask is None else mask.to(device)
        out = predictive(inputs.to(device), mask)
        for name in sites:
            chunks[name].append(out[name].cpu().numpy())  # (S, B, ...)
    classifier.train(was_training)
    return {name: np.concatenate(parts, axis=1) for name, parts in chunks.items()}


def inference_data(
    test: dict[str, np.ndarray],
    labels: np.ndarray,
    class_names: Sequence[str],
    ood: dict[str, np.ndarray] | None = None,
) -> az.InferenceData:
    """ArviZ InferenceData of a posterior predictive (one chain of S draws).

    Groups: ``posterior_predictive`` (``y`` sampled labels, ``probs`` class probabilities),
    ``log_likelihood`` (``y``: log p(y_n | draw s)), ``observed_data`` (``y``) and, when
    out-of-domain draws are given, ``predictions`` (``y_ood``, ``probs_ood``).
    """
    probs = test["probs"]  # (S, N, C)
    log_lik = np.log(
        np.clip(np.take_along_axis(probs, labels[None, :, None], -1)[..., 0], 1e-30, None)
    )
    coords = {"example": np.arange(len(labels)), "class": list(class_names)}
    dims = {"y": ["example"], "probs": ["example", "class"]}
    posterior_predictive = {"y": test["obs"][None], "probs": probs[None]}
    for name, value in test.items():
        if name not in ("probs", "obs"):
            posterior_predictive[name] = value[None]
    kwargs = {}
    if ood is not None:
        kwargs = {
            "predictions": {"y_ood": ood["obs"][None], "probs_ood": ood["probs"][None]},
            "pred_dims": {"y_ood": ["example_ood"], "probs_ood": ["example_ood", "class"]},
            "pred_coords": {
                "example_ood": np.arange(ood["obs"].shape[1]),
                "class": list(class_names),
            },
        }
    return az.from_dict(
        posterior_predictive=posterior_predictive,
        log_likelihood={"y": log_lik[None]},
        observed_data={"y": labels},
        coords=coords,
        dims=dims,
        **kwargs,
    )
