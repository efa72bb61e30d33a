"""Posterior predictive with ``pyro.infer.Predictive`` and its ArviZ ``InferenceData``.

Posterior draws of the global sites are taken once and shared by every example; samples that
share their global draw are evaluated in one batched pass (see :func:`predict`). Only requested
sites are kept: class probabilities ``probs`` and sampled labels ``obs`` always,
the attention matrices only with ``attention=True`` (they are B × H × L × L per sample).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import torch
from pyro import poutine
from pyro.infer import Predictive
from torch import Tensor, nn
from tqdm.auto import tqdm

from probtrans.attention import attention_sites
from probtrans.contract import local_params
from probtrans.data import DataSplit
from probtrans.inference.objective import self_guided
from probtrans.model import Classifier

with warnings.catch_warnings():  # ArviZ 0.23 announces its 1.0 refactor on import
    warnings.filterwarnings("ignore", category=FutureWarning, module="arviz")
    import arviz as az


@local_params()
@torch.no_grad()
def posterior_draws(
    guide: Callable, samples: int, split: DataSplit, device: str | torch.device = "cpu"
) -> dict[str, Tensor]:
    """S draws of every global site of ``guide`` (weights, inducing variables): name → (S, ...),
    on the device of the guide's parameters (the guide is called on a row of ``split`` on
    ``device``)."""
    _, inputs, mask, _ = next(split.batches(1))
    mask = None if mask is None else mask.to(device)
    draws = Predictive(guide, num_samples=samples)(inputs.to(device), mask)
    return {name: value.detach() for name, value in draws.items()}


def is_point_mass(draws: dict[str, Tensor]) -> bool:
    """Whether all S draws are the same (a ``delta`` guide, or no global sites)."""
    return all(bool((value == value[:1]).all()) for value in draws.values())


def dropout_on(classifier: Classifier) -> None:
    """Put every dropout in training mode: ``nn.Dropout`` modules and attention weight dropout
    (the only thing attention modules do differently in training)."""
    for module in classifier.modules():
        rate = getattr(module, "dropout", None)
        if isinstance(module, nn.Dropout) or (isinstance(rate, float) and rate > 0.0):
            module.train()


@local_params()
@torch.no_grad()
def predict(
    classifier: Classifier,
    guide: Callable | None,
    split: DataSplit,
    samples: int = 10,
    batch_size: int = 256,
    device: str = "cpu",
    attention: bool = False,
    draws: dict[str, Tensor] | None = None,
    mc_dropout: bool = False,
    extra_sites: Sequence[str] = (),
    progress: bool = False,
) -> dict[str, np.ndarray]:
    """S posterior predictive draws on ``split``, streamed over the data.

    The S global draws (``draws``, default :func:`posterior_draws` of ``guide``; on any device:
    the model runs on ``device``) are the same for every example. When they are all equal
    (point-mass guides) the S samples differ only in their local randomness (attention, dropout)
    and one pass evaluates all of them on the batch repeated S times (once, if the model has no
    local randomness); otherwise each draw gets its own pass. A pass holds about ``batch_size``
    rows, whatever the size of ``split``. Each pass is what ``Predictive`` does for one draw
    (condition the model on it and trace), without the two shape-probing model passes
    ``Predictive`` adds to every call.

    ``mc_dropout=True`` keeps dropout on (MC dropout, Gal & Ghahramani 2016) and nothing else of
    training mode. ``progress=True`` shows a bar over the batches.

    Returns ``probs`` (S, N, C), ``obs`` (S, N), ``energy`` (S, N), the ``extra_sites`` (e.g.
    ``features``) and, with ``attention=True``, every attention site (S, N, H, L, ·).
    """
    local_sites = attention_sites(classifier)
    sites = ["probs", "obs", "energy", *extra_sites, *(local_sites if attention else [])]
    if len(split) == 0:  # e.g. a data set without out-of-domain examples
        n_classes = classifier.head.out_features
        return {
            name: np.zeros((samples, 0, n_classes) if name == "probs" else (samples, 0))
            for name in sites
        }
    model = classifier if attention else self_guided(classifier)
    draws = posterior_draws(guide, samples, split, device) if draws is None else draws
    folded = is_point_mass(draws)
    # without local randomness a point-mass posterior has one predictive: compute it once
    local = mc_dropout or bool(local_sites)
    replicas = samples if local else 1
    # one (draw, replicas) pair per pass over a batch
    passes = [(0, replicas)] if folded else [(s, 1) for s in range(samples)]
    conditioned = [
        poutine.condition(model, data={name: value[s].to(device) for name, value in draws.items()})
        for s, _ in passes
    ]
    was_training = classifier.training
    classifier.eval()
    if mc_dropout:
        dropout_on(classifier)
    chunks: dict[str, list[np.ndarray]] = {name: [] for name in sites}
    located: list[Tensor] = []  # the split's row numbers of each batch
    rows_per_pass = max(1, batch_size // passes[0][1])
    # rows in order of length, so that token batches carry little padding; order restored below
    batches = tqdm(
        split.batches(rows_per_pass, trim=not attention, by_length=True),
        total=math.ceil(len(split) / rows_per_pass),
        desc="predictive",
        unit="batch",
        leave=False,
        disable=not progress,
    )
    for index, inputs, mask, _ in batches:  # (B, L) sites
        located.append(index)
        n = len(inputs)
        outputs: dict[str, list[Tensor]] = {name: [] for name in sites}
        for (_, replicas), run in zip(passes, conditioned, strict=True):
            rows = inputs.repeat(replicas, *[1] * (inputs.dim() - 1)).to(device)  # sample-major
            rows_mask = None if mask is None else mask.repeat(replicas, 1).to(device)
            trace = poutine.trace(run).get_trace(rows, rows_mask)
            for name in sites:
                value = trace.nodes[name]["value"]
                outputs[name].append(value.reshape(replicas, n, *value.shape[1:]))
        for name in sites:
            value = torch.cat(outputs[name]).expand(samples, *outputs[name][0].shape[1:])
            chunks[name].append(value.cpu().numpy())  # (S, B, ...)
    classifier.train(was_training)
    order = torch.cat(located).argsort().numpy()
    return {name: np.concatenate(parts, axis=1)[:, order] for name, parts in chunks.items()}


def inference_data(
    test: dict[str, np.ndarray],
    labels: np.ndarray,
    class_names: Sequence[str],
    ood: dict[str, dict[str, np.ndarray]] | None = None,
) -> az.InferenceData:
    """ArviZ InferenceData of a posterior predictive (one chain of S draws).

    Groups: ``posterior_predictive`` (``y`` sampled labels, ``probs`` class probabilities, and
    the other sites drawn, e.g. ``energy``), ``log_likelihood`` (``y``: log p(y_n | draw s)),
    ``observed_data`` (``y``) and, for each out-of-domain set NAME in ``ood``, ``predictions``
    (``y_NAME``, ``probs_NAME`` over the dimension ``example_NAME``).
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
            dims.setdefault(name, ["example", *[f"{name}_dim_{i}" for i in range(value.ndim - 2)]])
    kwargs = {}
    if ood:
        predictions, pred_dims, pred_coords = {}, {}, {"class": list(class_names)}
        for name, sites in ood.items():
            example = f"example_{name}"
            predictions[f"y_{name}"] = sites["obs"][None]
            predictions[f"probs_{name}"] = sites["probs"][None]
            pred_dims[f"y_{name}"] = [example]
            pred_dims[f"probs_{name}"] = [example, "class"]
            pred_coords[example] = np.arange(sites["obs"].shape[1])
        kwargs = {"predictions": predictions, "pred_dims": pred_dims, "pred_coords": pred_coords}
    idata = az.from_dict(
        posterior_predictive=posterior_predictive,
        log_likelihood={"y": log_lik[None]},
        observed_data={"y": labels},
        coords=coords,
        dims=dims,
        **kwargs,
    )
    for group in idata.groups():  # no time stamp: the same draws give the same file
        idata[group].attrs.pop("created_at", None)
    return idata
