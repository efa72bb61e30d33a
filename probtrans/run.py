"""A run: fit a model spec with an inference spec, evaluate it, and keep everything in one folder.

Run folder (:data:`RUN_FILES`):
    model.toml, inference.toml   the specs, copied verbatim
    checkpoint.pt                classifier + guide state of the best validation epoch (for a
                                 guide given in Python, which cannot be rebuilt from a file: its
                                 posterior draws), and the spec texts (what ``load_run`` reads)
    history.json                 per-epoch ELBO and validation metrics
    metrics.json                 test metrics, OOD scores, temperature-scaled metrics, post-hoc
                                 variants (:func:`probtrans.summary.summarise`), PSIS-LOO
                                 (:meth:`Likelihoods.metrics`) and the :class:`RunInfo`
    probs.npz                    class probabilities (S, N, C) of every variant on the validation
                                 and test splits and every out-of-domain set, free energies (N,)
    predictive.nc                ArviZ InferenceData (NetCDF): the test posterior predictive, the
                                 posterior draws of the global sites and the training
                                 log-likelihood that ``az.loo`` reads (:func:`evaluate`)
    report.png                   reliability with bin counts, entropy and mutual information in vs
                                 out of domain, OOD ROC, risk–coverage, training curves
                                 (:func:`probtrans.figures.run_figure`)
    timing.json                  wall-clock seconds of training, of each epoch and of evaluation
    data.json, data.pt,          the data the run is evaluated on, its class names, tokenizer and
    tokenizer.json               image scaling (:mod:`probtrans.data.saved`): ``evaluate`` and
                                 ``predict`` need nothing but the folder

Two fits with the same specs and seed write byte-identical files, ``timing.json`` aside.

``fit`` trains into ``DIR.partial`` and only replaces ``DIR`` once the run is complete, so a
failed or interrupted fit never destroys an earlier run; it replaces ``DIR`` only if that is a run
folder (or ``force``), and holds the lock ``DIR.lock`` (:mod:`probtrans.lock`) while it works.
``DIR.partial/resume.pt`` holds the whole training state after the last finished epoch: fitting
the same specs, seed and epochs into the same folder again continues from there (the folder's
``resume.pt`` is removed once the run is complete). A resume file that cannot be read is set aside
as ``DIR.unreadable-resume.pt`` and the fit starts over.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyro
import torch
from torch import nn

from probtrans import distributed, figures, metrics
from probtrans.checkpoint import (
    UnreadableCheckpoint,
    load_checkpoint,
    require,
    save_checkpoint,
    set_aside,
)
from probtrans.contract import keep_params_local, local_params
from probtrans.data import DataBundle, DataSplit, load_data
from probtrans.data.file_bundle import add_ood_sets
from probtrans.data.saved import DATA_FILES, load_saved_bundle, save_bundle
from probtrans.elpd import Loo, psis_loo
from probtrans.errors import ProbtransError, in_file
from probtrans.inference.guide import GuideChoice, build_guide
from probtrans.inference.objective import ELBO_KEYS
from probtrans.inference.posthoc import (
    Energy,
    Probs,
    needs_training_split,
    posterior_predictives,
)
from probtrans.inference.predictive import (
    global_sites,
    inference_data,
    is_point_mass,
    log_likelihood,
    posterior_draws,
    predict,
    varies_in_the_head_only,
)
from probtrans.inference.train import BestState, Resumable, TrainingDiverged, train_classifier
from probtrans.io import (
    atomic_write,
    is_temporary_file,
    read_json,
    read_npz,
    remove_temporary_files,
    write_json,
    write_npz,
    write_text,
)
from probtrans.lock import folder_lock
from probtrans.model import Classifier, build_classifier
from probtrans.prediction import prediction_columns
from probtrans.resolve import load_inference_spec, load_model_spec, spec_folder
from probtrans.specs import InferenceSpec, ModelSpec, SpecFile, read_spec_text, updated
from probtrans.specs.inference import AUTOMATIC_LOO_SAMPLES
from probtrans.specs.model import OodSetSpec
from probtrans.summary import ood_sets, summarise

#: the metrics ``fit`` and ``evaluate`` print
HEADLINE = ("accuracy", "nll", "ece", "mce", "brier", "mutual_information")
#: the files of a run folder; a folder holding anything else is not replaced without ``force``
RUN_FILES = frozenset(
    {
        "model.toml",
        "inference.toml",
        "checkpoint.pt",
        "history.json",
        "history.csv",  # the training log ([train] logger = "csv")
        "tensorboard",  # ... or its TensorBoard folder
        "metrics.json",
        "probs.npz",
        "predictive.nc",
        "report.png",
        "timing.json",
        *DATA_FILES,
    }
)
#: seeds of numpy and scikit-learn (and so of a fit) are in 0 … 2**32 − 1
SEED_RANGE = range(2**32)
#: the prefix of the free energies' keys in ``probs.npz``
ENERGY = "energy."


@dataclass
class RunInfo:
    """How a run was trained: written by ``fit`` into ``metrics.json`` beside the metrics and
    kept there when the run is evaluated again."""

    seed: int
    epochs: int  # asked for; ``compare`` refits a run trained for other epochs
    best_epoch: int  # the epoch whose state was kept

    @classmethod
    def read(cls, metrics: dict[str, Any]) -> dict[str, Any]:
        """The run information among a ``metrics.json``'s keys."""
        return {f.name: metrics[f.name] for f in dataclasses.fields(cls) if f.name in metrics}


@dataclass
class Run:
    """A fitted (or reloaded) model with its specs, data, guide and folder.

    ``guide`` is None for a run whose guide was given in Python and which was read back from its
    folder: its posterior is the ``draws`` kept in its checkpoint (site → (S, ...)).
    """

    model_spec: ModelSpec
    inference_spec: InferenceSpec
    data: DataBundle
    classifier: Classifier
    guide: Callable | None  # None until fitted
    path: Path
    draws: dict[str, torch.Tensor] | None = None
    guide_name: str = ""  # a guide given in Python: what it is; else the spec's guide.name

    @classmethod
    def load(cls, path: str | Path, device: str = "cpu", data: DataBundle | None = None) -> Run:
        """The run in folder ``path`` (:func:`load_run`)."""
        return load_run(path, device, data)

    @property
    def metrics(self) -> dict[str, Any]:
        """The run's ``metrics.json``."""
        return read_json(self.path / "metrics.json")

    @property
    def device(self) -> str:
        return "cuda" if next(self.classifier.parameters()).is_cuda else "cpu"

    def describe_guide(self) -> str:
        return self.guide_name or self.inference_spec.guide.name

    def posterior_samples(self, samples: int, seed: int = 0) -> dict[str, torch.Tensor]:
        """S draws of every global site (weights with priors, inducing variables): site →
        (S, ...). From the guide, seeded; for a guide given in Python and read back from the
        folder, the first S of the draws its checkpoint keeps."""
        if samples <= 0:
            raise ProbtransError(f"samples = {samples}: must be > 0")
        if self.guide is None:
            assert self.draws is not None
            kept = min((len(v) for v in self.draws.values()), default=samples)
            if samples > kept:
                raise ProbtransError(
                    f"{self.path}: its guide ({self.describe_guide()}) was given in Python and "
                    f"only {kept} posterior draws are kept in checkpoint.pt; ask for at most "
                    f"{kept} samples"
                )
            return {name: value[:samples] for name, value in self.draws.items()}
        return seeded_draws(self.guide, samples, self.data.val, seed, self.device)

    def predictives(
        self, samples: int, device: str = "cpu", progress: bool = False, seed: int = 0
    ) -> tuple[Probs, Energy, dict[str, dict[str, np.ndarray]]]:
        """The plain posterior predictive and the spec's post-hoc variants
        (:func:`probtrans.inference.posthoc.posterior_predictives`) on S draws of
        :meth:`posterior_samples`; the local randomness (attention, dropout) is seeded after
        the draws, so it is the same whether they come from the guide or the checkpoint."""
        draws = self.posterior_samples(samples, seed)
        pyro.set_rng_seed(seed)
        spec = self.inference_spec.predictive
        return posterior_predictives(
            self.classifier, draws, self.data, spec, samples, device, progress
        )

    @local_params()
    def predict(
        self,
        inputs: list[str] | torch.Tensor | np.ndarray | DataSplit,
        samples: int | None = None,
        seed: int = 0,
        progress: bool = False,
        labels: np.ndarray | None = None,
    ) -> dict[str, np.ndarray]:
        """The posterior predictive on new ``inputs``: texts (a list of strings, tokenised as in
        training), token ids (N, L) (0 = padding), raw images (N, C, H, W) or (N, H, W),
        scaled as the training images were, or a split made by :meth:`as_split`. Returns
        :func:`probtrans.prediction.prediction_columns`, one row per input, with the entropy
        percentile among the run's validation examples (from its ``probs.npz``) and, given
        ``labels`` (N,) (classes, −1 for none), the label's class name; the same numbers as
        ``probtrans predict``."""
        samples = samples or self.inference_spec.predictive.samples
        split = inputs if isinstance(inputs, DataSplit) else self.as_split(inputs)
        draws = self.posterior_samples(samples, seed)
        pyro.set_rng_seed(seed)  # the local randomness, as in :meth:`predictives`
        batch = self.inference_spec.predictive.batch_size
        device = self.device

        def probs(part: DataSplit) -> np.ndarray:
            return predict(
                self.classifier, None, part, samples, batch, device, draws=draws, progress=progress
            )["probs"]

        columns = probs(split)
        validation = self.validation_probs()
        if validation is None:
            validation = probs(self.data.val)
        reference = metrics.predictive_entropy(validation)
        return prediction_columns(columns, self.data.class_names, reference, labels)

    def validation_probs(self) -> np.ndarray | None:
        """The validation predictive (S, N, C) the run's ``probs.npz`` keeps, if it has one."""
        path = self.path / "probs.npz"
        return read_probs(path)[0]["plain"]["val"] if path.is_file() else None

    def as_split(
        self, inputs: list[str] | torch.Tensor | np.ndarray, what: str = "inputs"
    ) -> DataSplit:
        """``inputs`` as an unlabelled split of this run's kind (see :meth:`predict`); errors
        name them as ``what``."""
        if isinstance(inputs, str):
            raise ProbtransError(f"{what}: give a list of texts, not one string")
        if len(inputs) == 0:
            raise ProbtransError(f"{what}: nothing to predict")
        texts = isinstance(inputs, list | tuple) and all(isinstance(x, str) for x in inputs)
        if texts or self.data.kind == "image":
            prepared, mask = self.data.encode(list(inputs) if texts else inputs, what)
            return DataSplit.unlabelled(prepared, mask)
        values = torch.as_tensor(np.asarray(inputs))
        if values.dim() != 2 or values.is_floating_point():
            raise ProbtransError(
                f"inputs of shape {tuple(values.shape)} ({values.dtype}): this run takes texts "
                f"or token ids (N, L)"
            )
        ids = values.long()
        return DataSplit.unlabelled(ids, ids != 0)

    def module(self, draw: str | int = "mean") -> nn.Module:
        """The trained network as a plain module: the classifier with every random weight fixed
        at the posterior mean (``draw="mean"``: the guide's median, the mean of a Normal guide; the
        mean of the kept draws for a guide given in Python) or at posterior draw number ``draw``
        of :meth:`posterior_samples` (seed 0). ``module(inputs, mask)`` returns logits (B, C) in
        one pass; stochastic attention still draws its weights on each call. In eval mode."""
        if draw == "mean":
            if self.guide is not None and hasattr(self.guide, "median"):
                _, inputs, mask, labels = next(self.data.val.batches(2))
                with local_params():
                    values = self.guide.median(inputs, mask, labels)
            else:
                draws = self.posterior_samples(self.inference_spec.predictive.samples)
                values = {name: value.mean(0) for name, value in draws.items()}
        elif isinstance(draw, int) and draw >= 0:
            values = {name: v[draw] for name, v in self.posterior_samples(draw + 1).items()}
        else:
            raise ProbtransError(f"draw = {draw!r}: must be 'mean' or a draw number ≥ 0")
        network = copy.deepcopy(self.classifier)
        for site, value in values.items():
            owner, _, name = site.rpartition(".")
            module = network.get_submodule(owner)
            delattr(module, name)
            setattr(module, name, nn.Parameter(value.detach().clone()))
        network.initial_weights = {}
        return keep_params_local(network).eval()


def seeded_draws(
    guide: Callable, samples: int, split: DataSplit, seed: int, device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """S draws of the guide's global sites, seeded: those :meth:`Run.posterior_samples` gives,
    and those a run folder keeps for a guide given in Python (the guide's parameters and
    ``device`` alike)."""
    pyro.set_rng_seed(seed)
    return posterior_draws(guide, samples, split, device)


def check_seed(seed: int, option: str = "--seed") -> int:
    if seed not in SEED_RANGE:
        raise ProbtransError(f"{option} {seed}: must be in 0 … 2**32 − 1")
    return seed


def check_replaceable(
    folder: Path, force: bool = False, allowed: frozenset[str] = RUN_FILES
) -> None:
    """Refuse to replace ``folder`` unless it is absent, or holds only ``allowed`` files (and
    temporary files of interrupted writes), or ``force``."""
    if not folder.exists() and not folder.is_symlink():
        above = next(p for p in folder.parents if p.exists() or p == Path(p.anchor))
        if not above.is_dir():
            raise ProbtransError(f"{folder}: cannot be created, {above} is a file")
        return
    if not folder.is_dir() or folder.is_symlink():
        raise ProbtransError(f"{folder}: exists and is not a folder; choose another --out")
    foreign = sorted(
        entry.name
        for entry in folder.iterdir()
        if entry.name not in allowed and not is_temporary_file(entry)
    )
    if foreign and not force:
        shown = ", ".join(foreign[:3]) + (
            f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        )
        raise ProbtransError(
            f"{folder}: not a probtrans run folder (it holds {shown}); choose another --out, "
            f"or pass --force to replace it and everything in it"
        )


def read_timing(folder: Path) -> dict[str, float]:
    """``timing.json`` of a run folder: ``train_seconds`` (summed over resumed sessions),
    ``epoch_seconds`` (the wall time of each epoch) and ``evaluate_seconds``; empty if the run
    has none."""
    path = folder / "timing.json"
    return read_json(path) if path.is_file() else {}


def check_device(device: str) -> str:
    if device not in ("cpu", "cuda"):
        raise ProbtransError(f"--device {device!r}: must be 'cpu' or 'cuda'")
    if device == "cuda" and not torch.cuda.is_available():
        raise ProbtransError("--device cuda: no CUDA device is available on this machine")
    return device


SpecSource = str | Path | SpecFile


def spec_source(source: SpecSource, load: Callable[..., SpecFile]) -> tuple[str, SpecFile]:
    """The text and the checked spec of a spec file path, or of a spec object (its TOML text)."""
    if isinstance(source, SpecFile):
        text = source.to_toml()
        return text, load(source.file, text)
    text = read_spec_text(Path(source))
    return text, load(Path(source), text)


def guide_identity(guide: GuideChoice) -> str:
    """What a guide given in Python is, for the run folder and the resume file."""
    target = getattr(guide, "func", guide)  # functools.partial
    name = getattr(target, "__qualname__", type(target).__qualname__)
    return f"{getattr(target, '__module__', '')}.{name}".lstrip(".")


def fit(
    model: SpecSource,
    inference: SpecSource,
    *,
    out: str | Path | None = None,
    seed: int = 0,
    guide: GuideChoice | None = None,
    data: DataBundle | None = None,
    epochs: int | None = None,
    device: str = "cpu",
    progress: bool = True,
    force: bool = False,
) -> Run:
    """Train a model spec with an inference spec by SVI, evaluate it and write a complete run
    folder; returns the :class:`Run` (its metrics: ``run.metrics``).

    ``model``, ``inference``: spec files or spec objects (:class:`~probtrans.specs.ModelSpec`,
    :class:`~probtrans.specs.InferenceSpec`). ``out``: the run folder (default: a new temporary
    folder, ``run.path``); replaced only if it is a run folder, unless ``force``. ``guide``: a
    Pyro guide or a factory ``model -> guide`` (e.g. ``AutoNormal``), used instead of the one
    the inference spec names; it is built on the self-guided model and the folder keeps
    ``predictive.samples`` posterior draws of it. ``data``: an in-memory
    :class:`~probtrans.data.DataBundle` instead of the model spec's ``[data]``. Everything
    random is seeded by ``seed`` before the network is built, so two fits with one seed are
    identical. An interrupted fit into the same ``out`` continues from its last finished epoch.

    In a process group (``torchrun``; :mod:`probtrans.distributed`) every process calls ``fit``
    with the same arguments and they train one model together; rank 0 alone writes the run
    folder (and evaluates), and every process returns once it is written.
    """
    processes = distributed.current()
    device, seed = check_device(device), check_seed(seed)
    model_text, model_spec = spec_source(model, load_model_spec)
    inference_text, inference_spec = spec_source(inference, load_inference_spec)
    texts = {"model_spec": model_text, "inference_spec": inference_text}
    if epochs is not None:
        inference_spec = updated(inference_spec, {"train.epochs": epochs}, f"--epochs = {epochs}")
    if out is None:  # one new folder, the same for every process
        out = processes.share(lambda: tempfile.mkdtemp(prefix="probtrans-run-"))
    out_dir = Path(out)
    processes.share(lambda: check_replaceable(out_dir, force))
    origin = {} if guide is None else {"guide": guide_identity(guide)}
    if data is not None:
        origin["data"] = data.name
    with in_file(model_spec.file):
        with processes.main_first():  # rank 0 fills the data cache that the others read
            data = load_data(model_spec.data, spec_folder(model_spec)) if data is None else data
        pyro.set_rng_seed(seed)  # the initial weights too depend on the seed
        classifier = build_classifier(model_spec, data)
    run = Run(model_spec, inference_spec, data, classifier, None, out_dir)
    run.guide_name = origin.get("guide", "")
    staging = out_dir.with_name(out_dir.name + ".partial")
    identity = {**texts, **origin, "seed": seed, "epochs": inference_spec.train.epochs}
    if processes.distributed:  # a resume file keeps one random state per process
        identity["processes"] = processes.size
    with contextlib.ExitStack() as held:
        resumable: Resumable | None = None

        def stage() -> None:  # on rank 0
            nonlocal resumable
            held.enter_context(folder_lock(out_dir, "probtrans fit"))
            check_replaceable(out_dir, force)  # again, now that no other command writes it
            resumable = open_staging(staging, out_dir, texts, identity, progress, force)

        processes.share(stage)
        if resumable is None:  # another process: it trains, rank 0 writes
            result = train_classifier(
                classifier, data, inference_spec, seed=seed, device=device, guide=guide
            )
            run.guide = result.guide
        else:
            run.path = staging
            try:
                train_and_evaluate(
                    run, resumable, {**texts, **origin}, seed, device, progress, guide
                )
            except TrainingDiverged as err:
                raise ProbtransError(f"{err}. {unfinished(staging)}") from None
            except BaseException:
                print(f"note: {unfinished(staging)}", file=sys.stderr)
                raise
            _replace_dir(staging, out_dir)
            run.path = out_dir
    processes.share(lambda: None)  # every process returns once the folder is written
    return run


def fit_run(
    model_path: str | Path,
    inference_path: str | Path,
    out_dir: str | Path,
    **options: Any,
) -> dict[str, float]:
    """:func:`fit` into ``out_dir``; returns the metrics (what ``probtrans fit`` prints)."""
    return fit(model_path, inference_path, out=out_dir, **options).metrics


def open_staging(
    staging: Path,
    out_dir: Path,
    texts: dict[str, str],
    identity: dict,
    progress: bool,
    force: bool = False,
) -> Resumable:
    """The staging folder of a fit, continued if it holds this fit's resume file, else new (it
    is replaced only if it holds nothing but a fit's files, or ``force``)."""
    check_replaceable(staging, force, allowed=RUN_FILES | {"resume.pt"})
    resume = staging / "resume.pt"
    try:
        resumable = Resumable(resume, identity)
    except UnreadableCheckpoint as err:
        aside = out_dir.with_name(out_dir.name + ".unreadable-resume.pt")
        set_aside(err, aside, "the fit starts over")
        resumable = Resumable(resume, identity)
    if resumable.saved is None:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        write_text(staging / "model.toml", texts["model_spec"])
        write_text(staging / "inference.toml", texts["inference_spec"])
    else:
        remove_temporary_files(staging)  # of writes a killed fit left unfinished
        if progress:
            print(f"resuming {staging} after epoch {resumable.saved['epoch']}", flush=True)
    return resumable


def train_and_evaluate(
    run: Run,
    resumable: Resumable,
    texts: dict[str, str],
    seed: int,
    device: str,
    progress: bool,
    guide: GuideChoice | None = None,
) -> dict[str, float]:
    """Fit ``run``'s classifier, then evaluate it; writes every file of the run into
    ``run.path`` and returns the metrics. ``texts``: what the checkpoint keeps besides the
    weights (the spec texts, and where a guide or the data were given in Python)."""
    samples = run.inference_spec.predictive.samples

    def checkpoint(best: BestState, trained: Callable) -> None:
        if guide is None:
            posterior = {"guide_state": best.guide_state}
        else:  # a guide given in Python cannot be rebuilt from a file: keep its draws
            rng = pyro.util.get_rng_state()  # training goes on with the random state as it was
            draws = seeded_draws(trained, samples, run.data.val, seed, device)
            pyro.util.set_rng_state(rng)
            posterior = {"posterior_draws": {name: v.cpu() for name, v in draws.items()}}
        save_checkpoint(
            run.path / "checkpoint.pt",
            {
                "model_state": best.model_state,
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
        log_dir=run.path,
    )
    run.guide = result.guide
    checkpoint(result.best, result.guide)  # the guide as returned (e.g. its Laplace approximation)
    write_json(run.path / "history.json", result.history)
    save_run_data(run)
    started = time.perf_counter()
    scores = evaluate(run, device=device, seed=seed, progress=progress)
    info = RunInfo(seed, run.inference_spec.train.epochs, result.best.epoch)
    scores.update({**result.elbo_terms, **dataclasses.asdict(info)})  # training-set ELBO
    write_json(run.path / "metrics.json", scores)
    timing = {
        "train_seconds": result.seconds,
        "evaluate_seconds": time.perf_counter() - started,
        "epoch_seconds": result.epoch_seconds,
    }
    write_json(run.path / "timing.json", timing)
    resumable.path.unlink()
    remove_temporary_files(run.path)
    return scores


def save_run_data(run: Run) -> None:
    """Keep the run's data in its folder, the training split too where a post-hoc predictive
    is fitted on it or PSIS-LOO reads its log-likelihood."""
    spec = run.inference_spec.predictive
    needed = (needs_training_split(spec) or spec.loo_samples != 0) and len(run.data.train) > 0
    save_bundle(run.path, run.data, with_train=needed)


def unfinished(staging: Path) -> str:
    """What is left of a fit that stopped: its staging folder when an epoch finished (the same
    command continues it), else nothing (the folder is removed)."""
    resume = staging / "resume.pt"
    if resume.is_file():
        try:
            epoch = load_checkpoint(resume)["epoch"]
        except (ProbtransError, KeyError):
            epoch = "?"
        return (
            f"The state after epoch {epoch} is kept in {staging}/ (resume.pt, and checkpoint.pt "
            f"of the best epoch): the same command continues from it, other specs start over"
        )
    shutil.rmtree(staging, ignore_errors=True)
    return "No epoch had finished: nothing was kept"


def _replace_dir(new: Path, old: Path) -> None:
    """Move the finished ``new`` folder to ``old``, removing the previous run only afterwards."""
    if not old.exists():
        new.rename(old)
        return
    trash = Path(tempfile.mkdtemp(dir=old.parent, prefix=f".{old.name}.replaced-"))
    old.rename(trash / old.name)
    new.rename(old)
    shutil.rmtree(trash)


def load_run(run_dir: str | Path, device: str = "cpu", data: DataBundle | None = None) -> Run:
    """Rebuild the classifier and guide of a run folder from its checkpoint, with the spec texts
    the checkpoint keeps (the folder's copies are for reading; a note says if they differ).

    The data come from the folder (:mod:`probtrans.data.saved`); ``data`` replaces them. A run
    written before runs kept their data reads its model spec's ``[data]``."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ProbtransError(f"{run_dir}: no such run folder")
    device = check_device(device)
    path = run_dir / "checkpoint.pt"
    keys = ["model_state", "model_spec", "inference_spec"]
    state = require(load_checkpoint(path), path, keys)
    if "guide_state" not in state and "posterior_draws" not in state:
        require(state, path, ["guide_state"])
    for key, name in (("model_spec", "model.toml"), ("inference_spec", "inference.toml")):
        copy_ = run_dir / name
        if not copy_.is_file() or copy_.read_bytes() != state[key].encode():
            print(
                f"note: {copy_} is not the spec this run was trained with; using that one, kept "
                f"in {path}",
                file=sys.stderr,
            )
    model_spec = load_model_spec(f"{path} (model spec)", state["model_spec"])
    inference_spec = load_inference_spec(f"{path} (inference spec)", state["inference_spec"])
    data = load_saved_bundle(run_dir) if data is None else data
    if "data" in state and data is None:
        raise ProbtransError(
            f"{run_dir}: fitted on the in-memory data set {state['data']!r}, which no file "
            f"holds; pass it: Run.load(path, data=...)"
        )
    with in_file(model_spec.file):
        data = load_data(model_spec.data, spec_folder(model_spec)) if data is None else data
        classifier = build_classifier(model_spec, data).to(device)
    guide, draws = None, None
    try:
        classifier.load_state_dict(state["model_state"])
        if "posterior_draws" in state:
            draws = {name: value.to(device) for name, value in state["posterior_draws"].items()}
        else:
            guide = build_guide(classifier, inference_spec.guide, data.val, device)
            guide.load_state_dict(state["guide_state"])
    except (RuntimeError, KeyError) as err:
        reason = f"its weights do not fit its model spec ({str(err).splitlines()[0]})"
        raise UnreadableCheckpoint(path, reason) from None
    run = Run(model_spec, inference_spec, data, classifier, guide, run_dir, draws)
    run.guide_name = state.get("guide", "")
    return run


def split_labels(data: DataBundle) -> dict[str, np.ndarray]:
    return {name: split.labels.numpy() for name, split in data.splits().items()}


def write_probs(path: Path, probs: Probs, labels: dict[str, np.ndarray], energy: Energy) -> None:
    """``probs.npz``: ``{variant}/{split}`` (S, N, C), ``labels/{split}`` (N,) and
    ``energy.{variant}/{split}`` (N,)."""
    arrays = {f"{v}/{s}": p.astype(np.float32) for v, by in probs.items() for s, p in by.items()}
    arrays.update({f"labels/{split}": value for split, value in labels.items()})
    arrays.update(
        {
            f"{ENERGY}{v}/{s}": e.astype(np.float32)
            for v, by in energy.items()
            for s, e in by.items()
        }
    )
    write_npz(path, arrays)


def read_probs(path: Path) -> tuple[Probs, dict[str, np.ndarray], Energy]:
    """Inverse of :func:`write_probs`: probabilities, labels, energies (none in runs written
    before they were kept)."""
    probs: Probs = {}
    energy: Energy = {}
    labels = {}
    for key, value in read_npz(path).items():
        variant, split = key.split("/", 1)
        if variant == "labels":
            labels[split] = value
        elif variant.startswith(ENERGY):
            energy.setdefault(variant.removeprefix(ENERGY), {})[split] = value
        else:
            probs.setdefault(variant, {})[split] = value
    return probs, labels, energy


@dataclass
class Likelihoods:
    """The pointwise likelihoods of a run's global posterior draws, the local randomness averaged
    out (:func:`probtrans.inference.predictive.log_likelihood`), and the PSIS-LOO they give."""

    posterior: dict[str, np.ndarray]  # site → (S, ...): the draws of the predictive
    test: np.ndarray | None  # (S, N_test); None without LOO
    train: np.ndarray | None  # (S', N_train), S' = loo_samples; None: no LOO (see loo_note)
    loo: Loo | None
    loo_note: str

    def metrics(self) -> dict[str, Any]:
        """The LOO keys of ``metrics.json`` (:meth:`probtrans.elpd.Loo.metrics`; null without
        a LOO, ``loo_note`` says why)."""
        if self.loo is not None:
            return self.loo.metrics()
        empty = {"loo": None, "loo_se": None, "p_loo": None, "loo_k_bad": None}
        return {**empty, "loo_note": self.loo_note}


def likelihoods(
    run: Run, samples: int, device: str = "cpu", seed: int = 0, progress: bool = False
) -> Likelihoods:
    """The S draws of :meth:`Run.posterior_samples` (those of :meth:`Run.predictives`), their
    test log-likelihood, and the training log-likelihood of the first ``loo_samples`` draws of
    the same seed with its PSIS-LOO (:func:`probtrans.elpd.psis_loo`); a point-mass posterior is
    evaluated once and its rows repeated. No likelihoods (the draws alone) with
    ``loo_samples = 0``, or unset when the draws differ inside the network (see
    :class:`probtrans.specs.PredictiveSpec`)."""
    spec = run.inference_spec.predictive
    count = AUTOMATIC_LOO_SAMPLES if spec.loo_samples is None else spec.loo_samples
    wanted = max(samples, count)
    if run.guide is None and run.draws:  # a guide given in Python: the draws its folder keeps
        wanted = min(wanted, min(len(value) for value in run.draws.values()))
    sites = global_sites(run.classifier)
    draws = {name: v for name, v in run.posterior_samples(wanted, seed).items() if name in sites}
    posterior = {name: value[:samples].cpu().numpy() for name, value in draws.items()}
    cheap = is_point_mass(draws) or varies_in_the_head_only(draws)
    if spec.loo_samples == 0 or (spec.loo_samples is None and not cheap):
        note = (
            "no LOO: [predictive] loo_samples = 0"
            if spec.loo_samples == 0
            else f"no LOO: the posterior varies inside the network, so the training "
            f"log-likelihood costs loo_samples × replicas passes over the training split; set "
            f"[predictive] loo_samples (e.g. {AUTOMATIC_LOO_SAMPLES}) to compute it"
        )
        return Likelihoods(posterior, None, None, None, note)

    def pointwise(count: int, split: DataSplit) -> np.ndarray:  # (count, N)
        first = {name: value[:count] for name, value in draws.items()}
        values = log_likelihood(
            run.classifier, first, split, spec.replicas, spec.batch_size, device, seed, progress
        )
        return np.broadcast_to(values, (count, len(split)))

    test = pointwise(samples, run.data.test)
    if len(run.data.train) == 0:
        note = "no LOO: the run folder keeps no training split (written before runs kept it)"
        return Likelihoods(posterior, test, None, None, note)
    train = pointwise(min(count, wanted), run.data.train)
    return Likelihoods(posterior, test, train, psis_loo(train, is_point_mass(draws)), "")


def evaluate(
    run: Run,
    *,
    samples: int | None = None,
    device: str = "cpu",
    seed: int = 0,
    progress: bool = False,
) -> dict[str, Any]:
    """Posterior predictive on the validation and in-domain test splits and every out-of-domain
    set; writes ``predictive.nc`` (:func:`probtrans.inference.predictive.inference_data`),
    ``probs.npz`` and ``report.png`` into the run folder and returns the metrics
    (:func:`probtrans.summary.summarise`; post-hoc variants prefixed ``{variant}.``; PSIS-LOO of
    the plain predictive: :meth:`Likelihoods.metrics`). An unreliable LOO is warned about."""
    samples = samples or run.inference_spec.predictive.samples
    probs, energy, plain = run.predictives(samples, device, progress, seed)
    labels = split_labels(run.data)
    scores = summarise(probs["plain"], labels, energy["plain"])
    for variant in sorted(probs.keys() - {"plain"}):
        variant_scores = summarise(probs[variant], labels, energy.get(variant))
        scores.update({f"{variant}.{k}": v for k, v in variant_scores.items()})
    scores["posterior_samples"] = samples
    write_probs(run.path / "probs.npz", probs, labels, energy)
    pointwise = likelihoods(run, samples, device, seed, progress)
    scores.update(pointwise.metrics())
    if pointwise.loo is not None and not pointwise.loo.reliable:
        print(f"warning: {pointwise.loo.note} (metrics.json: loo_note)", file=sys.stderr)
    idata = inference_data(
        plain["test"],
        labels["test"],
        run.data.class_names,
        ood_sets(plain),
        posterior=pointwise.posterior,
        train_log_lik=pointwise.train,
        train_labels=run.data.train.labels.numpy(),
        test_log_lik=pointwise.test,
    )
    atomic_write(
        run.path / "predictive.nc", lambda tmp: idata.to_netcdf(str(tmp), engine="h5netcdf")
    )
    figures.save_run_figure(
        run.path / "report.png",
        probs["plain"]["test"],
        labels["test"],
        ood_sets(probs["plain"]),
        title=figures.run_title(
            run.data.name,
            run.model_spec.network.attention.kind,
            run.describe_guide(),
            samples,
            run.model_spec.network.prior.weights,
            inducing=None if run.guide_name else run.inference_spec.guide.inducing,
        ),
        history=figures.read_history(run.path / "history.json"),
    )
    return scores


def evaluate_run(
    run_dir: str | Path,
    *,
    samples: int | None = None,
    device: str = "cpu",
    seed: int = 0,
    progress: bool = False,
    ood: list[OodSetSpec] = (),
) -> dict[str, Any]:
    """Reload a run folder, re-evaluate it and rewrite its metrics, predictive and report; the
    :class:`RunInfo` and training-set ELBO that ``fit`` wrote and its training time are kept.
    ``ood``: more named out-of-domain sets (relative paths start at the working folder), kept in
    the run's data; a set of a name the run has replaces that one."""
    seed = check_seed(seed)
    run = load_run(run_dir, device)
    for known in sorted({o.name for o in ood} & set(run.data.ood)):
        print(f"note: the out-of-domain set {known!r} of {run.path} is replaced", file=sys.stderr)
    add_ood_sets(run.data, list(ood), run.model_spec.data, replace=True)
    metrics_file = run.path / "metrics.json"
    previous = read_json(metrics_file) if metrics_file.is_file() else {}
    timing = read_timing(run.path)
    if "train_seconds" in previous:  # a run written before timing.json: keep its training time
        timing.setdefault("train_seconds", previous["train_seconds"])
    with folder_lock(run.path, "probtrans evaluate"):
        started = time.perf_counter()
        scores = evaluate(run, samples=samples, device=device, seed=seed, progress=progress)
        scores.update({key: previous[key] for key in ELBO_KEYS if key in previous})  # fit's
        scores.update(RunInfo.read(previous))
        if ood or not (run.path / "data.json").is_file():
            save_run_data(run)
        write_json(metrics_file, scores)
        timing["evaluate_seconds"] = time.perf_counter() - started
        write_json(run.path / "timing.json", timing)
    return scores
