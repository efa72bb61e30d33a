"""Fitting a run: a spec pair (files or objects), any guide, in-memory data → a complete run
folder (:mod:`probtrans.runs.folder`), on one process or several (``torchrun``).

Two fits with the same specs and seed write byte-identical files, ``timing.json`` aside.
``fit`` trains into ``DIR.partial`` and only replaces ``DIR`` once the run is complete, so a
failed or interrupted fit never destroys an earlier run; it replaces ``DIR`` only if that is a
run folder (or ``force``), and holds the lock ``DIR.lock`` (:mod:`probtrans.storage.lock`) while it
works. Fitting the same specs, seed and epochs into the same folder again continues from the
last finished epoch (the folder's ``resume.pt`` is removed once the run is complete).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyro

from probtrans.classifier import BackboneClassifier, PyroClassifier, build_classifier
from probtrans.data import DataBundle, load_data
from probtrans.data.tokenizer import filling_max_len
from probtrans.errors import ConfigError, ProbtransError, in_file
from probtrans.hub import Backbone, keep_backbone
from probtrans.inference.guide_builder import GuideChoice
from probtrans.inference.posthoc import check_posthoc
from probtrans.inference.train import BestState, Resumable, TrainingDiverged, train_classifier
from probtrans.resolve import (
    as_backbone_reads,
    load_inference_spec,
    load_model_spec,
    spec_folder,
    with_local_backbone,
)
from probtrans.runs.evaluation import evaluate
from probtrans.runs.folder import (
    RunInfo,
    check_replaceable,
    keep_or_remove_staging,
    open_staging,
    replace_folder,
    save_run_data,
    staging_folder,
)
from probtrans.runs.run import Run, check_device, seeded_draws
from probtrans.runtime import distributed
from probtrans.runtime.caller_state import caller_random_state, float32_default
from probtrans.runtime.paths import taken
from probtrans.runtime.progress import no_thread_left
from probtrans.runtime.stopwatch import Stopwatch
from probtrans.specs import (
    ElboSpec,
    InferenceSpec,
    OptimSpec,
    PathsSpec,
    PredictiveSpec,
    Spec,
    SpecFile,
    TrainSpec,
    parse,
    read_spec_text,
    updated,
)
from probtrans.specs.base import check_seed
from probtrans.storage.checkpoint import save_checkpoint
from probtrans.storage.io import remove_temporary_files, write_json
from probtrans.storage.lock import folder_lock

SpecSource = str | Path | SpecFile
#: what a keyword of :func:`fit` gives one table of the inference spec: field → value, or the
#: table's spec object
TableSource = dict[str, Any] | Spec
#: the tables of an inference spec that :func:`fit`'s keywords override, with their spec classes
TABLES: dict[str, type[Spec]] = {
    "elbo": ElboSpec,
    "optim": OptimSpec,
    "train": TrainSpec,
    "predictive": PredictiveSpec,
    "paths": PathsSpec,
}
#: a guide given in Python is labelled with its ``functools.partial`` keywords if they are this
#: short, written out
LABEL_KEYWORDS_CHARS = 40


def spec_source(source: SpecSource, load: Callable[..., SpecFile]) -> tuple[str, SpecFile]:
    """The text and the checked spec of a spec file path, or of a spec object (its TOML text)."""
    if isinstance(source, SpecFile):
        text = source.to_toml()
        return text, load(source.file, text)
    text = read_spec_text(Path(source))
    return text, load(Path(source), text)


def inference_source(
    inference: SpecSource | None,
    guide: GuideChoice | None,
    tables: dict[str, TableSource | None],
) -> tuple[str, InferenceSpec]:
    """The text and the checked spec of the inference a fit uses: the spec ``inference`` (a file
    or a spec object) or, when it is None and a ``guide`` is given in Python, the defaults of
    :class:`~probtrans.specs.InferenceSpec`; each table of ``tables`` (:data:`TABLES`: field →
    value, or the table's spec object) replaces the fields it names. Overridden, the text is
    the effective spec's (what the run folder keeps); a bad field is one line naming it."""
    if inference is None:
        if guide is None:
            raise ProbtransError(
                "fit: give an inference spec (inference=FILE or an InferenceSpec), or a guide "
                "(guide=..., trained with the InferenceSpec defaults and the elbo=, optim=, "
                "train=, predictive= keywords)"
            )
        inference = InferenceSpec()
    text, spec = spec_source(inference, load_inference_spec)
    given = {name: value for name, value in tables.items() if value is not None}
    if not given:
        return text, spec
    table = spec.model_dump(by_alias=True)
    for name, value in given.items():
        cls = TABLES[name]
        if isinstance(value, cls):
            table[name] = value.model_dump(by_alias=True)
        elif isinstance(value, dict):
            table[name] = {**table[name], **value}
        else:
            raise ProbtransError(
                f"{name} = {value!r}: give a dict of [{name}] fields or a {cls.__name__}"
            )
        spec = parse(InferenceSpec, table, f"{name} = {value!r}").located(spec.file)
    text = spec.to_toml()
    return text, load_inference_spec(spec.file, text)


def guide_identity(guide: GuideChoice) -> str:
    """What a guide given in Python is, for the run folder and the resume file."""
    target = getattr(guide, "func", guide)  # functools.partial
    name = getattr(target, "__qualname__", type(target).__qualname__)
    return f"{getattr(target, '__module__', '')}.{name}".lstrip(".")


def guide_label(guide: GuideChoice) -> str:
    """A guide given in Python in a few words, for figures: its class or function's short name
    (``AutoNormal``; an instance: its class's), with a ``functools.partial``'s keywords when
    they are short (``AutoLowRankMultivariateNormal(rank=2)``)."""
    target = getattr(guide, "func", guide)
    name = getattr(target, "__qualname__", type(target).__qualname__).rpartition(".")[2]
    keywords = ", ".join(f"{k}={v!r}" for k, v in getattr(guide, "keywords", {}).items())
    return f"{name}({keywords})" if 0 < len(keywords) <= LABEL_KEYWORDS_CHARS else name


@float32_default()
@no_thread_left()
@caller_random_state()
def fit(
    model: SpecSource,
    inference: SpecSource | None = None,
    *,
    out: str | Path | None = None,
    seed: int = 0,
    guide: GuideChoice | None = None,
    elbo: TableSource | None = None,
    optim: TableSource | None = None,
    train: TableSource | None = None,
    predictive: TableSource | None = None,
    paths: TableSource | None = None,
    data: DataBundle | None = None,
    epochs: int | None = None,
    device: str = "cpu",
    progress: bool = True,
    force: bool = False,
) -> Run:
    """Train a model spec with an inference spec by SVI, evaluate it and write a complete run
    folder; returns the :class:`Run` (its metrics: ``run.metrics``).

    ``model``, ``inference``: spec files or spec objects (:class:`~probtrans.specs.ModelSpec`,
    :class:`~probtrans.specs.InferenceSpec`). ``out``: the run folder, replaced only if it is a
    run folder, unless ``force``; by default a new temporary folder (``run.path``) that the run
    removes when it is closed (``run.close()``, or ``with probtrans.fit(...) as run:``) or
    collected (under torchrun, where every process holds the run, it is left). ``guide``: a
    Pyro guide or a factory ``model -> guide`` (e.g. ``AutoNormal``; an autoguide class that
    names no ``init_scale`` starts at 0.01), used instead of the one the inference spec names;
    it is built on the self-guided model and the folder keeps ``predictive.samples`` posterior
    draws of it.

    Where each part of the inference comes from: the guide is ``guide`` if given, else the
    spec's ``[guide]``; the ELBO (and its KL annealing), optimiser, training, predictive and
    computation paths are the tables ``[elbo]``, ``[optim]``, ``[train]``, ``[predictive]``,
    ``[paths]`` of ``inference`` — or, when ``inference`` is omitted (only with a ``guide``),
    the defaults of
    :class:`~probtrans.specs.InferenceSpec` (Trace_ELBO without annealing, Adam at 1e-3, 30
    epochs) — with the fields that the keywords ``elbo``, ``optim``, ``train``, ``predictive``,
    ``paths`` name replaced (a dict field → value, e.g. ``elbo={"kl_anneal_epochs": 5}``, or
    the table's spec object, e.g. ``optim=OptimSpec(lr=5e-3)``, which replaces the whole
    table). The run folder (``inference.toml``, ``checkpoint.pt``) keeps that effective spec,
    so :meth:`Run.load` reads it back. ``epochs`` sets ``train.epochs`` last (the folder keeps
    the spec's text and the epochs beside it, as ``--epochs``). ``data``: an in-memory
    :class:`~probtrans.data.DataBundle` instead of the model spec's ``[data]``. Everything
    random is seeded by ``seed`` before the network is built, so two fits with one seed are
    identical, and the caller's random state (Python's ``random``, NumPy's, torch's) is restored
    on return (:func:`~probtrans.runtime.caller_state.caller_random_state`). An interrupted fit
    into the same ``out`` continues from its last finished epoch.

    In a process group (``torchrun``; :mod:`probtrans.runtime.distributed`) every process calls
    ``fit`` with the same arguments and they train one model together; rank 0 alone writes the run
    folder (and evaluates), and every process returns once it is written.
    """
    processes = distributed.current()
    device = check_device(device, f"device = {device!r}")
    seed = check_seed(seed, f"seed = {seed!r}")
    model_text, model_spec = spec_source(model, load_model_spec)
    model_spec, backbone = with_local_backbone(model_spec)
    tables = {
        "elbo": elbo,
        "optim": optim,
        "train": train,
        "predictive": predictive,
        "paths": paths,
    }
    inference_text, inference_spec = inference_source(inference, guide, tables)
    texts = {"model_spec": model_text, "inference_spec": inference_text}
    if epochs is not None:
        inference_spec = updated(inference_spec, {"train.epochs": epochs}, f"--epochs = {epochs}")
    temporary = out is None
    if temporary:  # one new folder, the same for every process
        out = processes.share(lambda: tempfile.mkdtemp(prefix="probtrans-run-"))
    out_dir = Path(out)
    processes.share(lambda: check_replaceable(out_dir, force))
    origin: dict[str, str] = {}
    if guide is not None:  # the identity for resume checks, the label for figures
        origin = {"guide": guide_identity(guide), "guide_label": guide_label(guide)}
    if data is not None:
        origin["data"] = data.name
    with in_file(model_spec.file):
        with processes.main_first():  # rank 0 fills the data cache that the others read
            data = load_data(model_spec.data, spec_folder(model_spec)) if data is None else data
        data = as_backbone_reads(data, backbone)
        pyro.set_rng_seed(seed)  # the initial weights too depend on the seed
        classifier = build_classifier(model_spec, data, backbone)
    with in_file(inference_spec.file):
        check_posthoc(classifier, inference_spec.predictive)
        check_knn_neighbours(inference_spec.predictive, data)
    if processes.is_main:
        for note in (cut_texts_note(data), unused_backbone_lr_note(inference_spec, classifier)):
            if note:
                print(f"note: {note}", file=sys.stderr)
    run = Run(model_spec, inference_spec, data, classifier, None, out_dir)
    run.guide_name = origin.get("guide_label", "")
    staging = staging_folder(out_dir)
    identity = {**texts, **origin, "seed": seed, "epochs": inference_spec.train.epochs}
    if processes.distributed:  # a resume file keeps one random state per process
        identity["processes"] = processes.size
    with contextlib.ExitStack() as held:
        resumable: Resumable | None = None

        def stage() -> None:  # on rank 0
            nonlocal resumable
            held.enter_context(folder_lock(out_dir, "probtrans fit"))
            check_replaceable(out_dir, force)  # again, now that no other command writes it
            resumable = open_staging(out_dir, texts, identity, progress, force)

        processes.share(stage)
        if resumable is None:  # another process: it trains, rank 0 writes
            result = train_classifier(
                classifier, data, inference_spec, seed=seed, device=device, guide=guide
            )
            run.guide = result.guide
        else:
            try:
                train_and_evaluate(
                    run,
                    resumable,
                    {**texts, **origin},
                    seed,
                    device,
                    progress,
                    guide,
                    staging,
                    backbone,
                )
            except TrainingDiverged as err:
                raise ProbtransError(f"{err}; {keep_or_remove_staging(staging)}") from None
            except BaseException as err:  # the command prints the note with the error
                err.add_note(keep_or_remove_staging(staging))
                raise
            replace_folder(staging, out_dir)
    processes.share(lambda: None)  # every process returns once the folder is written
    if temporary and not processes.distributed:  # several processes: the folder is left
        run.own_temporary_folder()
    return run


def cut_texts_note(data: DataBundle) -> str | None:
    """How many training texts fill every one of the ``max_len`` tokens the data were read
    with (texts longer are cut to them, without a word from the tokenizer); None where none
    does, or for data that are not texts read here."""
    max_len = data.description.get("max_len")
    if data.kind != "tokens" or data.train.mask is None or not isinstance(max_len, int):
        return None
    full, rows = filling_max_len(data.train.mask, max_len), len(data.train.mask)
    if not full:
        return None
    return (
        f"data: {full:,} of {rows:,} training texts ({100 * full / rows:.1f} %) "
        f"fill all data.max_len = {max_len} tokens; those longer are cut to them (a larger "
        f"max_len reads more of each, at more cost per step)"
    )


def unused_backbone_lr_note(spec: InferenceSpec, classifier: PyroClassifier) -> str | None:
    """Where ``optim.backbone_lr`` is set and no pretrained weight trains (a frozen backbone,
    or none), the rate applies to nothing: say so (an inference spec is shared between model
    specs, so it is not refused); None otherwise."""
    rate = spec.optim.backbone_lr
    if rate is None or classifier.pretrained_parameters():
        return None
    why = (
        "the backbone is frozen: model.train_backbone = true fine-tunes its weights at this rate"
        if isinstance(classifier, BackboneClassifier)
        else "the model has no pretrained backbone"
    )
    return f"optim.backbone_lr = {rate:g} applies to no weight here ({why})"


def check_knn_neighbours(spec: PredictiveSpec, data: DataBundle) -> None:
    """Refuse, before any training, a ``knn_neighbours`` chosen above the training rows: the
    k-NN score would be the distance to the farthest training feature. (The default k is taken
    down to the rows there are.)"""
    rows, k = len(data.train), spec.knn_neighbours
    default = PredictiveSpec.model_fields["knn_neighbours"].default
    if spec.feature_scores and k != default and k > rows:
        raise ConfigError(
            f"predictive.knn_neighbours = {k}: above the {rows} training rows of {data.name} "
            f"(the k-NN score would be the distance to the farthest training feature); set it "
            f"to at most {rows}"
        )


def train_and_evaluate(
    run: Run,
    resumable: Resumable,
    texts: dict[str, str],
    seed: int,
    device: str,
    progress: bool,
    guide: GuideChoice | None,
    folder: Path,
    backbone: Backbone | None,
) -> None:
    """Fit ``run``'s classifier, then evaluate it; writes every file of the run into
    ``folder`` (the staging folder that becomes ``run.path``), with the config of its resolved
    ``backbone``. ``texts``: what the checkpoint keeps besides the weights (the spec texts,
    and where a guide or the data were given in Python)."""
    options = run.classifier.attention_options()
    resolved = {"attention_options": json.dumps(options)} if options else {}

    def checkpoint(best: BestState, trained: Callable) -> None:
        if guide is None:
            posterior = {"guide_state": best.guide_state}
        else:  # a guide given in Python cannot be rebuilt from a file: keep its draws
            rng = pyro.util.get_rng_state()  # training goes on with the random state as it was
            samples = run.predictive_samples()
            head_draws = run.inference_spec.predictive.head_draws
            draws = seeded_draws(trained, samples, run.data.val, seed, device, head_draws)
            pyro.util.set_rng_state(rng)
            posterior = {"posterior_draws": {name: v.cpu() for name, v in draws.items()}}
        save_checkpoint(
            folder / "checkpoint.pt",
            {
                "model_state": best.model_state,
                **resolved,
                **posterior,
                "epoch": best.epoch,
                "seed": seed,
                **texts,
            },
        )

    result = train_classifier(
        run.classifier,
        run.data,
        run.inference_spec,
        seed=seed,
        device=device,
        on_improve=checkpoint,
        resumable=resumable,
        progress=progress,
        guide=guide,
        log_dir=folder,
    )
    run.guide = result.guide
    checkpoint(result.best, result.guide)  # the guide as returned (e.g. its Laplace approximation)
    write_json(folder / "history.json", result.history)
    save_run_data(folder, run.data, run.inference_spec.predictive)
    if backbone is not None:
        keep_backbone(backbone, folder)
    started = time.perf_counter()
    stopwatch = Stopwatch()
    scores = evaluate(
        run, device=device, seed=seed, progress=progress, stopwatch=stopwatch, folder=folder
    )
    info = RunInfo(seed, run.inference_spec.train.epochs, result.best.epoch)
    scores.run.update({**result.elbo_terms, **dataclasses.asdict(info)})  # training-set ELBO
    write_json(folder / "metrics.json", scores.to_json())
    paths = taken(device, run.classifier.paths)
    timing = {
        "train_seconds": result.seconds,
        "evaluate_seconds": time.perf_counter() - started,
        "evaluate_parts": stopwatch.seconds,
        "epoch_seconds": result.epoch_seconds,
        "train_paths": paths,  # one device for both
        "evaluate_paths": paths,
    }
    write_json(folder / "timing.json", timing)
    resumable.path.unlink()
    remove_temporary_files(folder)
