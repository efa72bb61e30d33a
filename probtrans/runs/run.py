""":class:`Run`, the public object of a fitted model: its specs, data, classifier, guide and
folder; :func:`load_run` reads one back from its folder (:mod:`probtrans.runs.folder`)."""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyro
import torch
from torch import nn

from probtrans.analysis import metrics
from probtrans.analysis.feature_scores import FittedScores
from probtrans.analysis.results import PLAIN
from probtrans.attention import inducing_sites
from probtrans.classifier import Classifier, build_classifier
from probtrans.data import DataBundle, DataSplit
from probtrans.data.saved import ForeignData, load_saved_bundle
from probtrans.errors import ProbtransError, in_file
from probtrans.hub import kept_backbone
from probtrans.inference.guide_builder import build_guide, guide_in_words
from probtrans.inference.predictive import posterior_draws, sample_predictive
from probtrans.resolve import load_inference_spec, load_model_spec, read_as_backbone
from probtrans.runs.folder import FEATURE_FILE
from probtrans.runs.kept import (
    KeptPredictives,
    checkpoint_fingerprint,
    probs_origin,
    read_feature_scores,
    read_probs,
)
from probtrans.runs.network import TrainedNetwork, new_inputs
from probtrans.runs.prediction import prediction_columns
from probtrans.runtime.caller_state import (
    SteppedRandomState,
    caller_random_state,
    float32_default,
    keep_params_local,
    local_params,
)
from probtrans.runtime.progress import no_thread_left
from probtrans.specs import InferenceSpec, ModelSpec
from probtrans.specs.attention import ATTENTION_OPTIONS
from probtrans.specs.base import check_count, check_seed
from probtrans.storage.checkpoint import UnreadableCheckpoint, load_checkpoint, require
from probtrans.storage.io import DamagedFile, TemporaryFolder, read_json
from probtrans.tta import AdaptationOptions, adaptation_options, adapted_predictive

#: the devices a run is fitted, evaluated or asked on
DEVICES = ("cpu", "cuda")


def check_device(device: str, label: str) -> str:
    """``device`` if this machine has it; else an error that names it as ``label``
    (``"--device cuda"`` for the command, ``"device = 'cuda'"`` in Python)."""
    if device not in DEVICES:
        raise ProbtransError(f"{label}: must be 'cpu' or 'cuda'")
    if device == "cuda" and not torch.cuda.is_available():
        raise ProbtransError(f"{label}: no CUDA device is available on this machine")
    return device


#: inputs predicted at a time by :meth:`Run.predict`: a chunk's tokens and S draws of its
#: features are freed before the next, so its memory does not grow with the inputs
PREDICT_CHUNK_ROWS = 8192


@dataclass
class Run(TemporaryFolder):
    """A fitted (or reloaded) model with its specs, data, guide and folder.

    ``guide`` is None for a run whose guide was given in Python and which was read back from its
    folder: its posterior is the ``draws`` kept in its checkpoint (site → (S, ...)).

    A run that :func:`~probtrans.runs.fit` wrote into a temporary folder of its own (no
    ``out``) removes that folder when it is closed (:meth:`close`, or leaving ``with run:``) or
    collected; any other folder is the caller's and stays.
    """

    model_spec: ModelSpec
    inference_spec: InferenceSpec
    data: DataBundle
    classifier: Classifier
    guide: Callable | None  # None until fitted
    path: Path
    draws: dict[str, torch.Tensor] | None = None
    guide_name: str = ""  # a guide given in Python: its label (``AutoNormal``); else ""

    def __post_init__(self) -> None:
        self.classifier.paths = self.inference_spec.paths.model_dump()  # its [paths] overrides

    @classmethod
    def load(cls, path: str | Path, device: str = "cpu", data: DataBundle | None = None) -> Run:
        """The run in folder ``path`` (:func:`load_run`)."""
        return load_run(path, device, data)

    @property
    def metrics(self) -> dict[str, Any]:
        """The run's ``metrics.json``."""
        return read_json(self.path / "metrics.json", expect=dict)

    @property
    def device(self) -> str:
        return "cuda" if next(self.classifier.parameters()).is_cuda else "cpu"

    def describe_guide(self) -> str:
        return self.guide_name or self.inference_spec.guide.name

    def guide_words(self) -> str:
        """The guide in words, as the title of the run's ``report.png`` names it (its inducing
        guide too where the network has inducing variables and the guide comes from the spec)."""
        given = self.guide_name or not inducing_sites(self.classifier)
        inducing = None if given else self.inference_spec.guide.inducing
        weight_priors = self.model_spec.network.prior.weights
        return guide_in_words(self.describe_guide(), weight_priors, inducing, bool(self.guide_name))

    def predictive_samples(self, asked: int | None = None) -> int:
        """The posterior draws of a predictive: ``asked`` (a positive integer), else
        ``[predictive] samples``."""
        check_count(asked, f"samples = {asked!r}")
        return asked or self.inference_spec.predictive.samples

    @caller_random_state()
    def posterior_samples(self, samples: int, seed: int = 0) -> dict[str, torch.Tensor]:
        """S draws of every global site (weights with priors, inducing variables): site →
        (S, ...). From the guide, seeded; for a guide given in Python and read back from the
        folder, the first S of the draws its checkpoint keeps. The draws are taken one after
        the other, so the first S of more draws with one seed are these S. The caller's random
        state is restored on return
        (:func:`~probtrans.runtime.caller_state.caller_random_state`)."""
        check_count(samples, f"samples = {samples!r}")
        seed = check_seed(seed, f"seed = {seed!r}")
        if self.guide is None:
            assert self.draws is not None
            kept = self.kept_draws()
            if samples > kept:
                raise ProbtransError(
                    f"{self.path}: its guide ({self.describe_guide()}) was given in Python and "
                    f"only {kept} posterior draws are kept in checkpoint.pt; ask for at most "
                    f"{kept} samples"
                )
            return {name: value[:samples] for name, value in self.draws.items()}
        head_draws = self.inference_spec.predictive.head_draws
        return seeded_draws(self.guide, samples, self.data.val, seed, self.device, head_draws)

    def kept_draws(self) -> int:
        """How many posterior draws the folder keeps for a guide given in Python (none is
        unbounded: a guide draws as many as asked)."""
        if self.guide is not None or not self.draws:
            return sys.maxsize
        return min(len(value) for value in self.draws.values())

    def predict(
        self,
        inputs: list[str] | torch.Tensor | np.ndarray | DataSplit,
        samples: int | None = None,
        seed: int = 0,
        progress: bool = False,
        labels: np.ndarray | None = None,
        adapt: str | AdaptationOptions | None = None,
        adapt_online: bool = False,
    ) -> dict[str, np.ndarray]:
        """The posterior predictive on new ``inputs``: texts (a list of strings, a NumPy array or
        pandas Series of them, tokenised as in training; a run on pairs of texts takes ``(text,
        text_pair)`` tuples or an (N, 2) array; a DataFrame gives the run's text columns by name,
        :meth:`text_columns`, else its columns in order), token ids (N, L) (0 =
        padding), raw images (N, C, H, W) or (N, H, W), scaled as the training images were, or a
        split made by :meth:`as_split`. Returns
        :func:`probtrans.runs.prediction.prediction_columns`, one row per input, with the entropy
        percentile among the run's validation examples (from its ``probs.npz``), the feature-space
        scores where the run has them (:meth:`feature_scores`) with their percentiles, and, given
        ``labels`` (N,) (classes, −1 for none), the label's class name; the same numbers as
        ``probtrans predict``. ``adapt`` (``"em"``, ``"tent"`` or their options; ``adapt_online``:
        Tent's state carried between batches) adapts the model to each batch of ``inputs`` before
        predicting it (:mod:`probtrans.tta`); the percentiles stay those of the run's unadapted
        validation predictive. Seeded by ``seed``; the caller's random state is restored on return
        (:func:`~probtrans.runtime.caller_state.caller_random_state`). :meth:`predict_chunks` gives
        the same rows a chunk at a time."""
        chunks = self.predict_chunks(inputs, samples, seed, progress, labels, adapt, adapt_online)
        parts = list(chunks)
        return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}

    def predict_chunks(
        self,
        inputs: Sequence[str] | torch.Tensor | np.ndarray | DataSplit | Iterator[Any],
        samples: int | None = None,
        seed: int = 0,
        progress: bool = False,
        labels: np.ndarray | None = None,
        adapt: str | AdaptationOptions | None = None,
        adapt_online: bool = False,
    ) -> Iterator[dict[str, np.ndarray]]:
        """:meth:`predict` a chunk of :data:`PREDICT_CHUNK_ROWS` inputs at a time: the columns
        of each chunk, in order (one empty chunk for no input), computed as the caller asks for
        it, so that inputs and outputs of any length take the memory of one chunk (``inputs``
        need only a length and slices: a lazy sequence of texts is read a chunk at a time; or
        ``inputs`` is an iterator of chunks, each predicted as it comes, without ``labels``:
        :func:`probtrans.data.files.input_text_chunks` reads a file so).
        Joined, the chunks are :meth:`predict`'s columns, the same numbers. The posterior draws
        and the validation predictive are computed on the call; each chunk runs under the
        caller's random state left as it was between chunks
        (:class:`~probtrans.runtime.caller_state.SteppedRandomState`). Tent's online adaptation
        (``adapt_online``) carries its state through all the inputs: one chunk."""
        samples = self.predictive_samples(samples)
        seed = check_seed(seed, f"seed = {seed!r}")
        options = None if adapt is None else adaptation_options(adapt, adapt_online)
        online = getattr(options, "online", False) is True  # Tent's state runs through the inputs
        if isinstance(inputs, Iterator) and (labels is not None or online):
            raise ValueError(
                "inputs given as an iterator of chunks take neither labels nor adapt_online: "
                "give them whole"
            )
        state = SteppedRandomState()

        @contextmanager
        def step() -> Iterator[None]:  # a step of this work, between the caller's
            with float32_default(), no_thread_left(), local_params(), state.step():
                yield

        with step():
            draws = self.posterior_samples(samples, seed)
            pyro.set_rng_seed(seed)  # the local randomness, as in evaluation
            batch = self.inference_spec.predictive.batch_size
            fitted = self.feature_scores()
            sites = ("features",) if fitted is not None else ()

            def predictive(
                part: DataSplit, adapted: bool = False
            ) -> tuple[np.ndarray, dict[str, np.ndarray] | None]:
                common = dict(draws=draws, extra_sites=sites, progress=progress)
                if adapted and options is not None:
                    out = adapted_predictive(
                        self.classifier, None, part, options, samples, batch, self.device, **common
                    )
                else:
                    out = sample_predictive(
                        self.classifier, None, part, samples, batch, self.device, **common
                    )
                # probs (S, N, C), the feature scores of the features averaged over the S draws
                given = None if fitted is None else fitted.scores(out["features"].mean(0))
                return out["probs"], given

            kept = self.kept_predictives()
            if kept is not None and (fitted is None or "val" in kept.features):
                validation, references = kept.probs[PLAIN]["val"], kept.features.get("val")
            else:
                validation, references = predictive(self.data.val)
            reference = metrics.predictive_entropy(validation)
            pyro.set_rng_seed(seed)  # the inputs' local randomness, as in evaluation
        if isinstance(inputs, Iterator):
            pieces: Iterator[tuple[Any, np.ndarray | None]] = ((c, None) for c in inputs)
        else:
            rows = max(len(inputs), 1) if online else PREDICT_CHUNK_ROWS
            pieces = (
                (
                    inputs[start : start + rows],
                    None if labels is None else labels[start : start + rows],
                )
                for start in range(0, max(len(inputs), 1), rows)  # no input: one empty chunk
            )

        def chunks() -> Iterator[dict[str, np.ndarray]]:
            first = 0  # the row of the inputs that starts the chunk, for messages
            for chunk, chosen in pieces:
                with step():
                    split = (
                        chunk if isinstance(chunk, DataSplit) else self.as_split(chunk, first=first)
                    )
                    first += len(chunk)
                    probs, given = predictive(split, adapted=True)
                    names = self.data.class_names
                    columns = prediction_columns(probs, names, reference, chosen, given, references)
                yield columns

        return chunks()

    def kept_predictives(self) -> KeptPredictives | None:
        """What the run's ``probs.npz`` keeps (the validation predictive and scores), if any. A
        ``probs.npz`` computed from another checkpoint than the run's (copied from another run)
        is ignored with a note: the caller computes the validation predictive again. One
        written before ``probs.npz`` kept its checkpoint's fingerprint is read, with a note
        that it cannot be checked (:func:`~probtrans.runs.kept.probs_origin`)."""
        path = self.path / "probs.npz"
        if not path.is_file():
            return None
        kept = read_probs(path)
        origin = probs_origin(self.path, kept)
        if origin == "another run":
            print(
                f"note: {path} was not computed from this run's checkpoint.pt (copied from "
                f"another run?): ignored, the validation predictive is computed again; "
                f"probtrans evaluate {self.path} rewrites it",
                file=sys.stderr,
            )
            return None
        if origin == "unknown":
            print(
                f"note: {path} keeps no fingerprint of the checkpoint it was computed from "
                f"(written before probtrans kept one), so it cannot be checked against this run; "
                f"read as it is (probtrans evaluate {self.path} rewrites it)",
                file=sys.stderr,
            )
        return kept

    def feature_scores(self) -> FittedScores | None:
        """The feature-space scores fitted on the run's training split (its
        ``feature_scores.npz``), or None: not asked for (``[predictive] feature_scores =
        false``), or a run written before they were fitted (with a note: ``probtrans evaluate``
        fits them)."""
        path = self.path / FEATURE_FILE
        if path.is_file():
            try:
                return read_feature_scores(path, *self.feature_shape())
            except DamagedFile as err:
                raise DamagedFile(
                    path, f"{err.reason}; probtrans evaluate {self.path} fits them again"
                ) from None
        if self.inference_spec.predictive.feature_scores:
            print(
                f"note: {self.path} has no feature scores ({FEATURE_FILE}: written before runs "
                f"fitted them); probtrans evaluate {self.path} fits them",
                file=sys.stderr,
            )
        return None

    def feature_shape(self) -> tuple[int, int | None]:
        """The classes and the width of the features the run's network gives (the width: None
        for a head that is not a linear map)."""
        return len(self.data.class_names), getattr(self.classifier.head, "in_features", None)

    def as_split(
        self, inputs: list[str] | torch.Tensor | np.ndarray, what: str = "inputs", first: int = 0
    ) -> DataSplit:
        """``inputs`` as an unlabelled split of this run's kind (see :meth:`predict`); errors
        name them as ``what``, a bad text by its row counted from ``first``."""
        return new_inputs(self.data, inputs, what, self.text_columns(), first)

    def text_columns(self) -> tuple[str, ...]:
        """The columns the run reads texts from (``data.text_column``, and
        ``data.text_pair_column`` for pairs): a DataFrame given to :meth:`predict` or
        :meth:`module` gives those, by name."""
        spec = self.model_spec.data
        return (spec.text_column,) + ((spec.text_pair_column,) if spec.text_pair_column else ())

    def module(self, draw: str | int = "mean") -> TrainedNetwork:
        """The trained network as a plain module: the classifier with every random weight fixed
        at the posterior mean (``draw="mean"``: the guide's median, the mean of a Normal guide; the
        mean of the kept draws for a guide given in Python) or at posterior draw number ``draw``
        of :meth:`posterior_samples` (seed 0), as a
        :class:`~probtrans.runs.network.TrainedNetwork`: ``module(inputs)`` takes new inputs as
        :meth:`predict` does, prepared and checked as the training inputs were, and returns
        logits (N, C) in one pass; stochastic attention still draws its weights on each call.
        In eval mode."""
        if draw == "mean":
            if self.guide is not None and hasattr(self.guide, "median"):
                _, inputs, mask, labels = next(self.data.val.batches(2))
                with local_params():
                    values = self.guide.median(inputs, mask, labels)
            else:
                draws = self.posterior_samples(self.predictive_samples())
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
        network.prior_sites, network.prior_scales, network.refuses_prior_draws = {}, {}, False
        return TrainedNetwork(keep_params_local(network), self.data, self.text_columns()).eval()


def seeded_draws(
    guide: Callable,
    samples: int,
    split: DataSplit,
    seed: int,
    device: str = "cpu",
    head_draws: int = 1,
) -> dict[str, torch.Tensor]:
    """S draws of the guide's global sites, seeded: those :meth:`Run.posterior_samples` gives,
    and those a run folder keeps for a guide given in Python (the guide's parameters and
    ``device`` alike); ``head_draws`` as :func:`~probtrans.inference.predictive.posterior_draws`
    takes it."""
    pyro.set_rng_seed(seed)
    return posterior_draws(guide, samples, split, device, head_draws)


def check_attention_options(path: Path, state: dict[str, Any], classifier: Classifier) -> None:
    """Refuse a network rebuilt with attention options other than those the checkpoint was
    trained with (a default that changed since: a swapped block's unset temperature, say),
    naming the first option and the value to write in the model spec. An option the checkpoint
    does not name (one added since) was built with its default. Checkpoints from before runs
    kept their options are not checked."""
    if "attention_options" not in state:
        return
    kept = json.loads(state["attention_options"])
    built = classifier.attention_options()
    for layer, options in kept.items():
        rebuilt = built.get(layer, {})
        fields = ATTENTION_OPTIONS.get(options["kind"], "kind").model_fields
        older = {name: field.default for name, field in fields.items() if name not in options}
        for name, value in {**options, **older}.items():
            if rebuilt.get(name) != value:
                raise ProbtransError(
                    f"{path}: {layer} was trained with {name} = {value!r}, and its model spec "
                    f"now builds {name} = {rebuilt.get(name)!r} (a default changed since the "
                    f"fit): the weights are not used under another network; refit it, with "
                    f"{name} = {value!r} in the spec's attention table to train the same one"
                )


@float32_default()
@caller_random_state()
def load_run(run_dir: str | Path, device: str = "cpu", data: DataBundle | None = None) -> Run:
    """Rebuild the classifier and guide of a run folder from its checkpoint, with the spec texts
    the checkpoint keeps (the folder's copies are for reading; a note says if they differ). The
    caller's random state is restored on return (building the network draws initial weights that
    the checkpoint then replaces).

    The data come from the folder (:mod:`probtrans.data.saved`); ``data`` replaces them. A run
    written before runs kept their data, or holding another run's, reads its model spec's
    ``[data]`` as :func:`~probtrans.runs.fitting.fit` read them: texts by the backbone's
    tokenizer, images standardised as its image processor does (the backbone must be found)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ProbtransError(f"{run_dir}: no such run folder")
    device = check_device(device, f"device = {device!r}")
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
    foreign = None  # saved data of another checkpoint: said once the checkpoint is read
    if data is None:
        try:
            data = load_saved_bundle(run_dir, checkpoint_fingerprint(run_dir))
        except ForeignData as err:
            if "data" in state:
                raise ProbtransError(
                    f"{err}; the run was fitted on the in-memory data set {state['data']!r}, "
                    f"which no other file holds: pass it, Run.load(path, data=...)"
                ) from None
            foreign = (
                f"note: {err}: ignored, the data are read from the model spec's [data]; "
                f"probtrans evaluate {run_dir} saves them again"
            )
    if "data" in state and data is None:
        raise ProbtransError(
            f"{run_dir}: fitted on the in-memory data set {state['data']!r}, which no file "
            f"holds; pass it: Run.load(path, data=...)"
        )
    with in_file(model_spec.file):
        if data is None:  # as ``fit`` read them: texts by the backbone's tokenizer
            data, _ = read_as_backbone(model_spec)
        kept = kept_backbone(run_dir) if model_spec.network.backbone is not None else None
        classifier = build_classifier(model_spec, data, kept).to(device)
    check_attention_options(path, state, classifier)
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
    if foreign is not None:
        print(foreign, file=sys.stderr)
    run = Run(model_spec, inference_spec, data, classifier, guide, run_dir, draws)
    # a guide given in Python: its label (before runs kept one, the name its identity ends in)
    run.guide_name = state.get("guide_label", state.get("guide", "").rpartition(".")[2])
    return run
