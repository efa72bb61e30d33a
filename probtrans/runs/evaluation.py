"""Evaluating a run: one set of posterior draws, the posterior predictive of every split with
its post-hoc variants, the metrics, PSIS-LOO, and the files that hold them (``probs.npz``,
``predictive.nc``, ``report.png``; ``metrics.json`` is written by the caller).

:func:`evaluate` draws the posterior once: ``max(samples, LOO draws)`` draws of one seed, the
first ``samples`` for the predictive, the first ``loo_samples`` for the training
log-likelihood (:class:`Likelihoods`).
"""

from __future__ import annotations

import functools
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyro
import torch

from probtrans.analysis import figures
from probtrans.analysis.elpd import Loo, psis_loo
from probtrans.analysis.feature_scores import FittedScores, fit_feature_scores
from probtrans.analysis.results import PLAIN, PredictiveMetrics, RunMetrics
from probtrans.analysis.summary import constant_note, ood_sets, summarise
from probtrans.attention import attention_sites
from probtrans.data import DataBundle, DataSplit
from probtrans.data.file_bundle import add_ood_sets
from probtrans.data.saved import saved_with
from probtrans.errors import ProbtransError
from probtrans.inference.objective import ELBO_KEYS
from probtrans.inference.posthoc import (
    Energy,
    Probs,
    TrainFeatures,
    first_draw_features,
    needs_training_split,
    posterior_predictives,
)
from probtrans.inference.predictive import (
    draw_predictive,
    global_sites,
    inference_data,
    is_point_mass,
    netcdf_bytes,
    network_groups,
    sample_predictive,
)
from probtrans.runs.folder import (
    FEATURE_FILE,
    RunInfo,
    read_timing,
    replace_folder,
    save_run_data,
    staged_copy,
)
from probtrans.runs.kept import (
    FeatureScores,
    checkpoint_fingerprint,
    given_scores,
    read_feature_scores,
    write_feature_scores,
    write_probs,
)
from probtrans.runs.run import Run, load_run
from probtrans.runtime.caller_state import caller_random_state, float32_default
from probtrans.runtime.paths import taken
from probtrans.runtime.progress import no_thread_left
from probtrans.runtime.stopwatch import Stopwatch
from probtrans.specs.base import check_count, check_seed
from probtrans.specs.inference import AUTOMATIC_LOO_SAMPLES, PredictiveSpec
from probtrans.specs.model import OodSetSpec
from probtrans.storage.io import read_json, write_bytes, write_json
from probtrans.storage.lock import folder_lock
from probtrans.tta import Adaptation, AdaptationOptions, adaptation_options, adapted_predictive

Draws = dict[str, torch.Tensor]  # site → (S, ...)


def loo_draws(spec: PredictiveSpec) -> int:
    """How many global draws the training log-likelihood of PSIS-LOO is asked for: ``[predictive]
    loo_samples``, or :data:`AUTOMATIC_LOO_SAMPLES` when it is unset (and LOO is cheap)."""
    return AUTOMATIC_LOO_SAMPLES if spec.loo_samples is None else spec.loo_samples


def split_predictives(
    run: Run,
    draws: Draws,
    samples: int,
    device: str = "cpu",
    seed: int = 0,
    progress: bool = False,
    adapt: AdaptationOptions | None = None,
    train_features: TrainFeatures | None = None,
    stopwatch: Stopwatch | None = None,
) -> tuple[Probs, Energy, dict[str, dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """The plain posterior predictive and the spec's post-hoc variants on the run's own splits
    (:func:`probtrans.inference.posthoc.posterior_predictives`, with the pooled features where
    they are needed) from the S = ``samples`` posterior ``draws`` (for a network without global
    sites: S draws of its local randomness, S equal ones without any); the local randomness
    (attention, dropout) is seeded with ``seed`` first, so it is the same whether the draws come
    from the guide or the checkpoint. ``adapt``: each batch predicted after a test-time
    adaptation to it (:mod:`probtrans.tta`). ``train_features`` and ``stopwatch``: as
    :func:`~probtrans.inference.posthoc.posterior_predictives` takes them."""
    pyro.set_rng_seed(seed)
    spec = run.inference_spec.predictive
    predictive = sample_predictive if adapt is None else adapted(adapt)
    return posterior_predictives(
        run.classifier,
        draws,
        run.data,
        spec,
        samples,
        device,
        progress,
        predictive,
        train_features,
        stopwatch,
    )


def shared_training_features(run: Run, draws: Draws, device: str = "cpu") -> TrainFeatures | None:
    """What gives the training split's features (N, D), computed once, on first use, for the
    two that read them, the last-layer Laplace and the feature scores, where they read the same
    values: the draws are a point mass and the network has no local randomness, so one
    deterministic pass gives every draw's features. None otherwise (each computes its own)."""
    spec = run.inference_spec.predictive
    both = needs_training_split(spec) and spec.feature_scores and len(run.data.train) > 0
    if not both or not is_point_mass(draws) or attention_sites(run.classifier):
        return None
    train = run.data.train
    return functools.cache(
        lambda: first_draw_features(run.classifier, draws, train, spec.batch_size, device)
    )


@dataclass
class Likelihoods:
    """The pointwise likelihoods of a run's global posterior draws, the local randomness averaged
    out (:func:`probtrans.inference.predictive.draw_predictive`), and the PSIS-LOO they give.
    With a LOO, the posterior, the test and the training values share the same S' draws."""

    posterior: dict[str, np.ndarray]  # site → (S, ...): the draws of the values below
    test: np.ndarray | None  # (S, N_test); None without LOO
    train: np.ndarray | None  # (S, N_train), S = loo_samples; None: no LOO (see loo_note)
    loo: Loo | None
    loo_note: str
    test_probs: np.ndarray | None = None  # (S, N_test, C): each draw's class probabilities
    train_probs: np.ndarray | None = None  # (S, N_train, C)

    def metrics(self) -> dict[str, Any]:
        """The LOO keys of ``metrics.json`` (:meth:`probtrans.analysis.elpd.Loo.metrics`; null
        without a LOO, ``loo_note`` says why)."""
        if self.loo is not None:
            return self.loo.metrics()
        empty = {"loo": None, "loo_se": None, "p_loo": None, "loo_k_bad": None}
        return {**empty, "loo_note": self.loo_note}


def likelihoods(
    run: Run, draws: Draws, samples: int, device: str = "cpu", seed: int = 0, progress: bool = False
) -> Likelihoods:
    """The test and training log-likelihood (and class probabilities) of the first
    ``loo_samples`` global ``draws``, and the PSIS-LOO of the training one
    (:func:`probtrans.analysis.elpd.psis_loo`), with those draws as the posterior; a point-mass
    posterior is evaluated once and its rows repeated. Without a training split: the test values of
    the first ``samples`` draws. No likelihoods (the first ``samples`` draws alone) with
    ``loo_samples = 0``, or unset when the draws differ inside the network (see
    :class:`probtrans.specs.PredictiveSpec`)."""
    spec = run.inference_spec.predictive
    sites = global_sites(run.classifier)
    draws = {name: value for name, value in draws.items() if name in sites}

    def first(count: int) -> dict[str, np.ndarray]:
        return {name: value[:count].cpu().numpy() for name, value in draws.items()}

    cheap = is_point_mass(draws) or len(network_groups(draws)) == 1  # one network for all
    if spec.loo_samples == 0 or (spec.loo_samples is None and not cheap):
        note = (
            "no LOO: [predictive] loo_samples = 0"
            if spec.loo_samples == 0
            else f"no LOO: the posterior varies inside the network, so the training "
            f"log-likelihood costs loo_samples × replicas passes over the training split; set "
            f"[predictive] loo_samples (e.g. {AUTOMATIC_LOO_SAMPLES}) to compute it"
        )
        return Likelihoods(first(samples), None, None, None, note)

    def pointwise(count: int, split: DataSplit) -> tuple[np.ndarray, np.ndarray]:
        kept = {name: value[:count] for name, value in draws.items()}
        values, probs = draw_predictive(
            run.classifier, kept, split, spec.replicas, spec.batch_size, device, seed, progress
        )
        return (
            np.broadcast_to(values, (count, len(split))),
            np.broadcast_to(probs, (count, *probs.shape[1:])),
        )

    if len(run.data.train) == 0:
        test, test_probs = pointwise(samples, run.data.test)
        note = "no LOO: the run folder keeps no training split (written before runs kept it)"
        return Likelihoods(first(samples), test, None, None, note, test_probs)
    drawn = min((len(value) for value in draws.values()), default=samples)
    shared = min(loo_draws(spec), drawn)
    train, train_probs = pointwise(shared, run.data.train)
    test, test_probs = pointwise(shared, run.data.test)
    loo = psis_loo(train, is_point_mass(draws))
    return Likelihoods(first(shared), test, train, loo, "", test_probs, train_probs)


def fit_run_feature_scores(
    run: Run,
    draws: Draws,
    device: str = "cpu",
    seed: int = 0,
    progress: bool = False,
    train_features: TrainFeatures | None = None,
    folder: Path | None = None,
) -> FittedScores | None:
    """The feature-space scores of the run (``[predictive] feature_scores``), fitted on the
    training split's pooled features averaged over the posterior ``draws``, one per network (every
    ``head_draws``-th) (:func:`probtrans.analysis.feature_scores.fit_feature_scores`), written to
    ``feature_scores.npz``; a folder that keeps no training split keeps the scores it has (None
    if none, with a note). What a score says of some classes (one that falls back to the shared
    covariance, or has no training example) is a note.
    ``train_features``: what gives every draw's features (N, D), where one pass does
    (:func:`shared_training_features`). ``folder``: where the file is read and written (default
    ``run.path``)."""
    spec = run.inference_spec.predictive
    folder = run.path if folder is None else folder
    path = folder / FEATURE_FILE
    if not spec.feature_scores:
        return None
    if len(run.data.train) == 0:
        if path.is_file():
            return read_feature_scores(path, *run.feature_shape())
        print(
            f"note: {run.path}: no feature scores: the folder keeps no training split to fit "
            f"them on (a run written before they were fitted; fit it again to have them)",
            file=sys.stderr,
        )
        return None
    if not path.is_file() and (folder / "metrics.json").is_file():
        print(f"note: {run.path}: fitting its feature scores ({FEATURE_FILE})", file=sys.stderr)
    # draws kM … kM + M − 1 (M = head_draws) differ in the head alone: the same features
    draws = {name: value[:: spec.head_draws] for name, value in draws.items()}
    samples = min((len(value) for value in draws.values()), default=1)
    if train_features is not None:  # the mean of S equal draws: the first
        features = train_features()
    else:
        pyro.set_rng_seed(seed)
        features = sample_predictive(
            run.classifier,
            None,
            run.data.train,
            samples,
            spec.batch_size,
            device,
            draws=draws,
            extra_sites=("features",),
            progress=progress,
        )["features"].mean(0)
    labels = run.data.train.labels.numpy()
    n_classes = len(run.data.class_names)
    try:
        fitted = fit_feature_scores(features, labels, n_classes, spec.knn_neighbours)
    except ProbtransError as err:  # too few examples, constant features: the run goes on
        print(f"note: {run.path}: no feature scores ({err})", file=sys.stderr)
        return None
    names = run.data.class_names
    for classes, what in fitted.notes():
        listed = ", ".join(repr(names[c]) for c in classes)
        print(f"note: feature scores: the classes {listed} have {what}", file=sys.stderr)
    write_feature_scores(path, fitted)
    return fitted


def split_feature_scores(
    fitted: FittedScores | None, features: dict[str, np.ndarray]
) -> FeatureScores:
    """split → score → (N,) of the pooled features (S, N, D) of every split, averaged over the
    S draws; none without ``fitted`` scores."""
    if fitted is None:
        return {}
    return {
        split: fitted.scores(value.mean(0))
        for split, value in features.items()
        if value.shape[1] > 0
    }


def adapted(options: AdaptationOptions) -> Callable[..., dict[str, np.ndarray]]:
    """:func:`~probtrans.inference.predictive.sample_predictive`'s stand-in that adapts the model
    to each batch first (:func:`probtrans.tta.adapted_predictive`)."""

    def predictive(classifier: Any, guide: Any, split: DataSplit, *args: Any, **kwargs: Any):
        return adapted_predictive(classifier, guide, split, options, *args, **kwargs)

    return predictive


def split_labels(data: DataBundle) -> dict[str, np.ndarray]:
    return {name: split.labels.numpy() for name, split in data.splits().items()}


@caller_random_state()
def evaluate(
    run: Run,
    *,
    samples: int | None = None,
    device: str = "cpu",
    seed: int = 0,
    progress: bool = False,
    adapt: AdaptationOptions | None = None,
    stopwatch: Stopwatch | None = None,
    folder: Path | None = None,
) -> RunMetrics:
    """Posterior predictive on the validation and in-domain test splits and every out-of-domain
    set; writes ``predictive.nc`` (:func:`probtrans.inference.predictive.inference_data`),
    ``probs.npz``, ``feature_scores.npz`` and ``report.png`` into ``folder`` (a staging folder
    that becomes ``run.path``; default ``run.path``) and returns the metrics: of each
    predictive (:func:`probtrans.analysis.summary.summarise`), and the run's (PSIS-LOO of the
    plain predictive: :meth:`Likelihoods.metrics`). An unreliable LOO is warned
    about. ``adapt``: the predictive of every split adapts to each test batch first
    (:mod:`probtrans.tta`; ``metrics["adaptation"]`` names it); the training split's
    features and likelihoods are not adapted. Seeded by ``seed``; the caller's random state is
    restored on return (:func:`~probtrans.runtime.caller_state.caller_random_state`). ``stopwatch``
    gets the seconds of each part (the predictive and each variant, the training features, the
    feature scores, the likelihoods and LOO, the metrics and the files)."""
    stopwatch = stopwatch or Stopwatch()
    folder = run.path if folder is None else folder
    samples = run.predictive_samples(samples)
    wanted = max(samples, min(loo_draws(run.inference_spec.predictive), run.kept_draws()))
    with stopwatch.part("posterior_draws"):
        draws = run.posterior_samples(wanted, seed)  # the only draw of the posterior
    weights_vary = not is_point_mass(draws)  # else the S draws differ by attention alone
    first = {name: value[:samples] for name, value in draws.items()}
    train_features = shared_training_features(run, first, device)  # computed by the Laplace
    probs, energy, plain, features = split_predictives(
        run, first, samples, device, seed, progress, adapt, train_features, stopwatch
    )
    with stopwatch.part("feature_scores"):
        fitted = fit_run_feature_scores(run, first, device, seed, progress, train_features, folder)
    feature = split_feature_scores(fitted, features)
    with stopwatch.part("metrics"):
        labels = split_labels(run.data)
        predictives = {
            variant: PredictiveMetrics(
                summarise(probs[variant], labels, given_scores(energy.get(variant), feature)),
                constant_note(probs[variant], run.data.class_names),  # warned of at the end
            )
            for variant in [PLAIN, *sorted(probs.keys() - {PLAIN})]
        }
    scores = RunMetrics(
        predictives,
        {
            "posterior_samples": samples,
            "ood_score": run.inference_spec.predictive.ood_score,  # the one shown first
            "adaptation": None if adapt is None else adapt.model_dump(),
        },
    )
    with stopwatch.part("files"):
        write_probs(folder / "probs.npz", probs, labels, energy, feature)
    with stopwatch.part("likelihoods"):
        pointwise = likelihoods(run, draws, samples, device, seed, progress)
    scores.run.update(pointwise.metrics())
    if pointwise.loo is not None and not pointwise.loo.reliable:
        print(f"warning: {pointwise.loo.note} (metrics.json: loo_note)", file=sys.stderr)
    with stopwatch.part("files"):
        idata = inference_data(
            plain["test"],
            labels["test"],
            run.data.class_names,
            ood_sets(plain),
            posterior=pointwise.posterior,
            train_log_lik=pointwise.train,
            train_labels=run.data.train.labels.numpy(),
            train_probs=pointwise.train_probs,
            test_log_lik=pointwise.test,
            test_probs=pointwise.test_probs,
            seed=seed,
        )
        write_bytes(folder / "predictive.nc", netcdf_bytes(idata))
        figures.save_run_figure(
            folder / "report.png",
            probs[PLAIN]["test"],
            labels["test"],
            ood_sets(probs[PLAIN]),
            title=figures.run_title(
                run.model_spec.data.in_words() if run.model_spec.data.train else run.data.name,
                run.model_spec.network.in_words(),
                run.guide_words(),
                samples,
                figures.draws_in_words(weights_vary, bool(attention_sites(run.classifier))),
            ),
            history=figures.read_history(folder / "history.json"),
            given=given_scores(energy[PLAIN], feature),
            ood_score=run.inference_spec.predictive.ood_score,
            weights_vary=weights_vary,
        )
    return scores


@float32_default()
@no_thread_left()
@caller_random_state()
def evaluate_run(
    run_dir: str | Path,
    *,
    samples: int | None = None,
    device: str = "cpu",
    seed: int = 0,
    progress: bool = False,
    ood: list[OodSetSpec] = (),
    adapt: str | AdaptationOptions | None = None,
    adapt_online: bool = False,
) -> dict[str, Any]:
    """Reload a run folder, re-evaluate it and rewrite its metrics, predictive and report; the
    :class:`RunInfo` and training-set ELBO that ``fit`` wrote and its training time are kept.
    ``ood``: more named out-of-domain sets (relative paths start at the working folder), kept in
    the run's data; a set of a name the run has replaces that one. ``adapt`` (``"em"``,
    ``"tent"`` or their options; ``adapt_online``: Tent's state carried between batches): a
    test-time adaptation to each batch (:func:`evaluate`), checked against the model before
    anything is computed. The files are written into a copy of the folder that then replaces it
    (:func:`~probtrans.runs.folder.staged_copy`): whatever stops the evaluation, the folder is
    the old run or the new one. Returns what ``metrics.json`` now holds. The caller's random
    state is restored on return (:func:`~probtrans.runtime.caller_state.caller_random_state`).
    """
    seed = check_seed(seed, f"seed = {seed!r}")
    check_count(samples, f"samples = {samples!r}")
    run = load_run(run_dir, device)
    options = None
    if adapt is not None:
        options = adaptation_options(adapt, adapt_online)
        Adaptation(run.classifier, options)  # refuses a model it cannot adapt, before any work
    for known in sorted({o.name for o in ood} & set(run.data.ood)):
        print(f"note: the out-of-domain set {known!r} of {run.path} is replaced", file=sys.stderr)
    add_ood_sets(run.data, list(ood), run.model_spec.data, replace=True)
    metrics_file = run.path / "metrics.json"
    previous = read_json(metrics_file, expect=dict) if metrics_file.is_file() else {}
    timing = read_timing(run.path)
    if "train_seconds" in previous:  # a run written before timing.json: keep its training time
        timing.setdefault("train_seconds", previous["train_seconds"])
    with folder_lock(run.path, "probtrans evaluate"):
        staging = staged_copy(run.path)
        try:
            started = time.perf_counter()
            stopwatch = Stopwatch()
            scores = evaluate(
                run,
                samples=samples,
                device=device,
                seed=seed,
                progress=progress,
                adapt=options,
                stopwatch=stopwatch,
                folder=staging,
            )
            scores.run.update({key: previous[key] for key in ELBO_KEYS if key in previous})
            scores.run.update(RunInfo.read(previous))  # fit's
            if ood or saved_with(staging) != checkpoint_fingerprint(staging):
                # none saved, saved with another checkpoint, or before checkpoints were named
                save_run_data(staging, run.data, run.inference_spec.predictive)
            timing["evaluate_seconds"] = time.perf_counter() - started
            timing["evaluate_parts"] = stopwatch.seconds
            timing["evaluate_paths"] = taken(device, run.classifier.paths)
            write_json(staging / "timing.json", timing)
            written = scores.to_json()
            write_json(staging / "metrics.json", written)
            replace_folder(staging, run.path)
        except ProbtransError as err:  # a file named in the run folder, not in its copy
            shutil.rmtree(staging, ignore_errors=True)
            err.args = (str(err).replace(str(staging), str(run.path)),)
            err.add_note(f"{run.path} is as it was")
            raise
        except BaseException as err:
            shutil.rmtree(staging, ignore_errors=True)
            err.add_note(f"{run.path} is as it was")
            raise
    return written
