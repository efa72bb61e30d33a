"""The posterior predictive of a trained classifier and its post-hoc variants.

From one set of trained weights and S posterior draws of its global sites, on the validation
and in-domain test splits and every out-of-domain set (:meth:`DataBundle.splits`):

- ``plain``: the posterior predictive of the model and its posterior;
- ``mc_dropout``: the same with dropout kept on (Gal & Ghahramani 2016), a baseline of both
  papers;
- ``laplace``: the last-layer Laplace approximation around the trained head
  (:mod:`probtrans.inference.laplace`; Daxberger et al. 2021), the SGPA paper's KFLLLA baseline
  and SNGP's posterior;
- ``stochastic_attention`` (a pretrained backbone): the blocks ``stochastic_layers`` sample
  their attention weights as STO does (Pei et al. 2022, Eq. 9–11) over their trained logits,
  at the temperature of ``stochastic_taus`` with the lowest validation NLL; no training.

The variants asked for are the inference spec's ``[predictive] posthoc``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from probtrans.data import DataBundle, DataSplit
from probtrans.errors import ConfigError, ProbtransError
from probtrans.inference.laplace import LastLayerLaplace
from probtrans.inference.predictive import sample_predictive
from probtrans.metrics import nll
from probtrans.model import BackboneClassifier, Classifier
from probtrans.specs import PredictiveSpec
from probtrans.stopwatch import Stopwatch

Probs = dict[str, dict[str, np.ndarray]]  # variant → split → (S, N, C)
TrainFeatures = Callable[[], np.ndarray]  # → the training split's features (N, D), computed once
Energy = dict[str, dict[str, np.ndarray]]  # variant → split → (N,) mean free energy


def check_posthoc(classifier: Classifier, spec: PredictiveSpec) -> None:
    """Refuse, before any training, a variant that ``classifier`` cannot give."""
    if "stochastic_attention" in spec.posthoc and not isinstance(classifier, BackboneClassifier):
        raise ConfigError(
            "predictive.posthoc = 'stochastic_attention': needs a model.backbone (it samples "
            "the attention weights of a pretrained model's blocks); a model trained here gets "
            "stochastic attention from model.attention"
        )


def needs_training_split(spec: PredictiveSpec) -> bool:
    """Whether a variant of ``spec`` is fitted on the training split (the Laplace is)."""
    return "laplace" in spec.posthoc


def posterior_predictives(
    classifier: Classifier,
    draws: dict[str, Tensor],
    data: DataBundle,
    spec: PredictiveSpec,
    samples: int,
    device: str = "cpu",
    progress: bool = False,
    predictive: Callable[..., dict[str, np.ndarray]] = sample_predictive,
    train_features: TrainFeatures | None = None,
    stopwatch: Stopwatch | None = None,
) -> tuple[Probs, Energy, dict[str, dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """Class probabilities of the ``plain`` predictive and of ``spec.posthoc``'s variants, the
    free energy of the variants with logits (all but ``laplace``; the mean over samples of
    −log Σ_c exp f_c), every site of the plain predictive per split (for the InferenceData),
    and, where the feature scores or the Laplace need them, the plain predictive's pooled
    features per split (S, N, D); from the S posterior ``draws`` of the global sites (the same
    draws on every split). ``predictive`` computes each split's predictive: by default
    :func:`~probtrans.inference.predictive.sample_predictive`; a test-time adaptation passes its
    own, with the same arguments. ``train_features``: what gives the training split's features
    (N, D) of the first draw, where the caller shares them (:func:`last_layer_laplace`).
    ``stopwatch`` times each variant (``predictive``, ``mc_dropout``, ``stochastic_attention``
    with its search of τ, ``laplace``)."""
    stopwatch = stopwatch or Stopwatch()
    laplace = needs_training_split(spec)
    with_features = laplace or spec.feature_scores
    splits = data.splits()

    def on(split: str, **options: Any) -> dict[str, np.ndarray]:
        return predictive(
            classifier,
            None,
            splits[split],
            samples,
            spec.batch_size,
            device,
            draws=draws,
            progress=progress,
            **options,
        )

    extra = ("features",) * with_features
    with stopwatch.part("predictive"):
        outputs = {"plain": {split: on(split, extra_sites=extra) for split in splits}}
    if "mc_dropout" in spec.posthoc:
        with stopwatch.part("mc_dropout"):
            outputs["mc_dropout"] = {split: on(split, mc_dropout=True) for split in splits}
    if "stochastic_attention" in spec.posthoc:
        check_posthoc(classifier, spec)
        with stopwatch.part("stochastic_attention"):
            tau, val = stochastic_temperature(classifier, spec, on, data.val.labels.numpy())
            with classifier.sampled_attention(spec.stochastic_layers, tau):
                others = {split: on(split) for split in splits if split != "val"}
        outputs["stochastic_attention"] = {"val": val, **others}
    probs = {v: {split: out["probs"] for split, out in by.items()} for v, by in outputs.items()}
    energy = {
        v: {split: out["energy"].mean(0) for split, out in by.items()} for v, by in outputs.items()
    }
    plain = outputs["plain"]
    features = {split: out.pop("features") for split, out in plain.items() if with_features}
    if laplace:
        with stopwatch.part("laplace"):
            probs["laplace"] = last_layer_laplace(
                classifier, data, spec, draws, features, device, train_features
            )
    return probs, energy, plain, features


def stochastic_temperature(
    classifier: BackboneClassifier,
    spec: PredictiveSpec,
    on: Callable[[str], dict[str, np.ndarray]],
    labels: np.ndarray,
) -> tuple[float, dict[str, np.ndarray]]:
    """The temperature of ``spec.stochastic_taus`` (× √d_head) whose stochastic-attention
    predictive has the lowest validation NLL, and that validation predictive; says which on
    stderr."""
    scores, predictives = {}, {}
    for tau in spec.stochastic_taus:
        with classifier.sampled_attention(spec.stochastic_layers, tau):
            predictives[tau] = on("val")
        scores[tau] = nll(predictives[tau]["probs"].mean(0), labels)
    best = min(scores, key=scores.__getitem__)
    tried = ", ".join(f"{tau:g}: {value:.4f}" for tau, value in scores.items())
    print(
        f"note: stochastic_attention: tau = {best:g} × √d_head (validation NLL by tau: {tried})",
        file=sys.stderr,
    )
    return best, predictives[best]


def last_layer_laplace(
    classifier: Classifier,
    data: DataBundle,
    spec: PredictiveSpec,
    draws: dict[str, Tensor],
    features: dict[str, np.ndarray],
    device: str = "cpu",
    train_features: TrainFeatures | None = None,
) -> dict[str, np.ndarray]:
    """Last-layer Laplace predictive from the plain predictive's feature draws (S, N, D),
    fitted on the training split's features (N, D) of the first draw: ``train_features()``, or
    computed on ``device``; the Laplace runs on the CPU (where the features are)."""
    if len(data.train) == 0:
        raise ProbtransError(
            f"{data.name}: no training split to fit the last-layer Laplace on (a run folder "
            f"keeps it only when its inference spec asks for the Laplace or for PSIS-LOO); load "
            f"the run with its data: Run.load(path, data=...)"
        )
    if train_features is not None:
        train = train_features()
    else:
        train = first_draw_features(classifier, draws, data.train, spec.batch_size, device)
    weight = draws["head.weight"][0] if "head.weight" in draws else classifier.head.weight
    bias = draws["head.bias"][0] if "head.bias" in draws else classifier.head.bias
    posterior = LastLayerLaplace.fit(torch.as_tensor(train), weight, bias)
    if spec.laplace_prior_precision:
        posterior.prior_precision = spec.laplace_prior_precision
    else:
        posterior.fit_prior_precision(torch.as_tensor(features["val"]), data.val.labels.numpy())
    return {split: posterior.predictive(torch.as_tensor(f)) for split, f in features.items()}


def first_draw_features(
    classifier: Classifier,
    draws: dict[str, Tensor],
    split: DataSplit,
    batch_size: int,
    device: str = "cpu",
) -> np.ndarray:
    """The pooled features (N, D) of ``split`` under the first of the posterior ``draws``, one
    sample of any local randomness."""
    first = {name: value[:1] for name, value in draws.items()}
    return sample_predictive(
        classifier, None, split, 1, batch_size, device, extra_sites=("features",), draws=first
    )["features"][0]
