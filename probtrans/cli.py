"""The ``probtrans`` command: fit, evaluate, predict, describe, compare, corrections, schema.

User errors (missing file, unknown key, bad value) and writes the machine refuses (disk full,
read-only folder) print one ``error:`` line naming the file, field or folder and exit with
status 2; nothing already written is touched. Any other exception prints one ``error:`` line
with the command and a hint and exits with status 1 (``--debug`` shows the traceback). A
command interrupted by Ctrl-C exits with status 130, one stopped by SIGTERM or SIGHUP (a job
scheduler, ``timeout``) the same way with 143 or 129: the line says what was kept.

``fit`` and ``compare`` also run as N data-parallel processes started by ``torchrun
--nproc_per_node N -m probtrans ...`` (:mod:`probtrans.runtime.distributed`): rank 0 prints and
writes, the other processes print only errors of their own. Any other command runs on rank 0 alone;
the other processes exit at once with status 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from probtrans.analysis.metrics import UNCERTAINTY_SCORES
from probtrans.errors import ConfigError, ProbtransError, refused_write
from probtrans.storage.io import STOP_SIGNALS

if TYPE_CHECKING:  # the command imports what it runs on first use
    from probtrans.runs import Run

DEFAULT_MODEL = "models/digits/h_sto.toml"
DEFAULT_INFERENCE = "inference/map.toml"
DEFAULT_SEGMENTATION = "models/digits_segmentation/gaussian_mixture.toml"
SCHEMAS = ("model", "inference", "comparison", "segmentation")


def spec_path(path: str) -> Path:
    """``path`` as given, or else relative to the probtrans source checkout (for the defaults)."""
    given = Path(path)
    if given.exists() or given.is_absolute():
        return given
    in_checkout = Path(__file__).resolve().parents[1] / path
    return in_checkout if in_checkout.exists() else given


def warn_constant(scores: dict) -> None:
    """A ``warning:`` line for each predictive of the run (``metrics.json``'s content) that
    gives one class to every validation example (its ``constant_note``)."""
    from probtrans.analysis.results import RunMetrics

    for name, predictive in RunMetrics.from_json(scores).predictives.items():
        if predictive.constant_note:
            print(f"warning: the {name} predictive: {predictive.constant_note}", file=sys.stderr)


def print_metrics(scores: dict) -> None:
    """The headline in-domain metrics (:func:`probtrans.analysis.summary.headline`; a key the run
    lacks, ``disagreement`` of one sample, gets no row) of the plain, temperature-scaled and
    post-hoc predictives of the run (``metrics.json``'s content) side by side, then every
    out-of-domain set with every score, per predictive."""
    from probtrans.analysis.report import OOD_NOTE, format_ood_table, format_run_table
    from probtrans.analysis.results import RunMetrics
    from probtrans.analysis.summary import headline

    print(format_run_table(scores, headline()))
    run = RunMetrics.from_json(scores)
    if run.plain.ood:
        print(f"\n{OOD_NOTE}")
    for name, predictive in run.predictives.items():
        if predictive.ood:
            first = run.run.get("ood_score")
            print(f"{name} predictive:\n{format_ood_table(predictive.ood, first)}")


def check_run_options(args: argparse.Namespace) -> None:
    """``--seed``, ``--device`` and (``evaluate``, ``predict``) ``--samples``, checked before
    anything is loaded."""
    from probtrans.runs.run import check_device
    from probtrans.specs.base import check_count, check_seed

    check_seed(args.seed, f"--seed {args.seed}")
    check_device(args.device, f"--device {args.device}")
    samples = getattr(args, "samples", None)
    check_count(samples, f"--samples {samples}")


def ood_option(text: str) -> tuple[str, str]:
    """``--ood NAME=SOURCE``."""
    name, sep, source = text.partition("=")
    if not sep or not name or not source:
        raise ProbtransError(f"--ood {text!r}: must be NAME=SOURCE, e.g. questions=data/q.tsv")
    return name, source


def cmd_fit(args: argparse.Namespace) -> int:
    from probtrans.runs import fit
    from probtrans.runs.folder import read_timing, run_name
    from probtrans.runtime.distributed import current

    check_run_options(args)
    model, inference = spec_path(args.model), spec_path(args.inference)
    out = Path(args.out or f"runs/{run_name(model, inference)}")
    run = fit(
        model,
        inference,
        out=out,
        epochs=args.epochs,
        seed=args.seed,
        device=args.device,
        progress=not args.quiet,
        force=args.force,
    )
    args.done = f"the run was written to {out}/"  # a stop signal now loses nothing
    if not current().is_main:  # rank 0 reports
        return 0
    print_metrics(run.metrics)
    timing = read_timing(out)
    print(f"run written to {out}/ (metrics.json, predictive.nc, report.png, checkpoint.pt)")
    print(
        f"trained in {timing['train_seconds']:.1f} s, evaluated in "
        f"{timing['evaluate_seconds']:.1f} s{parts_in_words(timing)} (timing.json)"
    )
    warn_constant(run.metrics)
    return 0


def parts_in_words(timing: dict) -> str:
    """The three longest parts of an evaluation (``timing.json``'s ``evaluate_parts``), e.g.
    ``": mc_dropout 46 s, stochastic_attention 18 s, predictive 9 s"``; empty without them."""
    parts = sorted(timing.get("evaluate_parts", {}).items(), key=lambda part: -part[1])[:3]
    return (": " if parts else "") + ", ".join(f"{name} {sec:.0f} s" for name, sec in parts)


def cmd_evaluate(args: argparse.Namespace) -> int:
    from probtrans.runs import evaluate_run
    from probtrans.runs.folder import read_timing
    from probtrans.specs import parse
    from probtrans.specs.model import OodSetSpec

    check_run_options(args)
    if args.adapt_online and args.adapt is None:
        raise ProbtransError("--adapt-online: give --adapt tent too")
    sets = [ood_option(text) for text in args.ood]
    names = [name for name, _ in sets]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ProbtransError(f"--ood: the name {repeated[0]!r} is given twice")
    ood = [
        parse(OodSetSpec, {"name": name, "source": source}, f"--ood {name}={source}")
        for name, source in sets
    ]
    scores = evaluate_run(
        args.run_dir,
        samples=args.samples,
        device=args.device,
        seed=args.seed,
        progress=not args.quiet,
        ood=ood,
        adapt=args.adapt,
        adapt_online=args.adapt_online,
    )
    args.done = f"{args.run_dir} was re-evaluated"
    print_metrics(scores)
    adapted = f", adapted to each test batch by {args.adapt}" if args.adapt else ""
    timing = read_timing(Path(args.run_dir))
    print(
        f"re-evaluated {args.run_dir} with {scores['posterior_samples']} posterior samples"
        f"{adapted} in {timing['evaluate_seconds']:.1f} s{parts_in_words(timing)}"
    )
    warn_constant(scores)
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from probtrans.data.files import HF_PREFIX, check_data_file
    from probtrans.data.formats import find_format, formats, suffixes
    from probtrans.runs import load_run
    from probtrans.runs.prediction import write_predictions

    check_run_options(args)
    local = args.input != "-" and not args.input.startswith(HF_PREFIX)
    if local:  # before loading the run
        check_data_file(args.input)
    out = Path(args.out) if args.out else None
    if out is not None and find_format(out, formats(writable=True)) is None:
        raise ProbtransError(f"--out {out}: must end in {suffixes(formats(writable=True))}")
    if out is not None and local and out.resolve() == Path(args.input).resolve():
        raise ProbtransError(f"--out {out}: is the input; write the predictions elsewhere")
    if out is not None and out.is_dir():
        raise ProbtransError(f"--out {out}: is a folder; give the file to write")
    if out is not None and (out.exists() or out.is_symlink()) and not args.force:
        raise ProbtransError(
            f"--out {out}: exists, and predict replaces no file unasked; choose another --out, "
            f"or pass --force to replace it"
        )
    run = load_run(args.run_dir, args.device)
    table, count, cut = predicted_table(run, args)
    write_predictions(table, out)
    if out is not None and not args.quiet:
        print(f"wrote {count} predictions of {args.run_dir} to {out}")
    if cut:
        max_len = run.data.tokenizer.truncation["max_length"]
        print(
            f"note: {args.input}: {cut:,} of {count:,} texts ({100 * cut / count:.1f} %) fill "
            f"all data.max_len = {max_len} tokens of the run; those longer were predicted from "
            f"their first {max_len} tokens",
            file=sys.stderr,
        )
    return 0


def texts_filling_max_len(run: Run, texts: list[str]) -> int:
    """How many of ``texts`` fill every token that the run's tokenizer keeps (``data.max_len``):
    those longer are cut to them, without a word from the tokenizer."""
    from probtrans.data.tokenizer import filling_max_len

    truncation = run.data.tokenizer.truncation
    if truncation is None or not len(texts):
        return 0
    _, mask = run.data.encode(list(texts))
    return filling_max_len(mask, truncation["max_length"])


def predicted_table(
    run: Run, args: argparse.Namespace
) -> tuple[Iterator[dict[str, Any]], int, int]:
    """``predict``'s output a chunk of rows at a time, each row's input first (``text``, as Python
    strings, and ``text_pair`` for pairs of texts; ``row``, an image's position), the number of
    inputs, and how many texts fill all ``data.max_len`` tokens (:func:`texts_filling_max_len`; 0
    for images). A text file without ``--labels`` is read a chunk at a time, after a first pass that
    checks every row (:func:`~probtrans.data.files.input_text_chunks`); other inputs are read
    whole."""
    import numpy as np

    import probtrans.runs.run as run_module
    from probtrans.data.file_bundle import label_indices
    from probtrans.data.files import input_text_chunks, read_inputs
    from probtrans.runs.prediction import input_columns

    spec = run.model_spec.data
    texts = run.data.kind == "tokens"
    options = dict(samples=args.samples, seed=args.seed, progress=not args.quiet)
    rows = run_module.PREDICT_CHUNK_ROWS
    if texts and not args.labels:

        def parts() -> Iterator[list[str]] | None:
            return input_text_chunks(
                args.input,
                rows,
                text_column=spec.text_column,
                text_pair_column=spec.text_pair_column,
            )

        first = parts()
        if first is not None:
            count = cut = 0  # every row checked before any is predicted
            for part in first:
                count, cut = count + len(part), cut + texts_filling_max_len(run, part)
            current: list[list[str]] = []

            def remembered() -> Iterator[list[str]]:  # each part, kept for its output rows
                for part in parts() or ():
                    current[:] = [part]
                    yield part

            chunks = run.predict_chunks(remembered(), **options)
            table = ({**input_columns(current[0]), **c} for c in chunks)
            return table, count, cut
    read = read_inputs(
        args.input,
        "text" if texts else "image",
        text_column=spec.text_column,
        text_pair_column=spec.text_pair_column,
        image_column=spec.image_column,
        label_column=spec.label_column if args.labels else None,
        declared=spec.labels or (),
    )
    if args.labels and not read.labels:
        raise ProbtransError(
            f"{args.input}: --labels: no label column {spec.label_column!r} (the run's "
            f"data.label_column) to compare the predictions with"
        )
    what = "input; without --labels, its labels are not read"
    labels = label_indices(read, run.data, spec, what).numpy() if read.labels else None
    inputs = read.values  # texts are tokenised a chunk at a time (Run.predict_chunks)
    if not texts:
        try:
            inputs = run.as_split(read.values, what=args.input)
        except ProbtransError as err:
            raise ProbtransError(f"{args.input}: {err}") from None
    chunks = run.predict_chunks(inputs, labels=labels, **options)

    def with_inputs() -> Iterator[dict[str, Any]]:
        start = 0
        for columns in chunks:
            end = start + len(next(iter(columns.values())))
            if texts:
                first = input_columns(read.values[start:end])
            else:
                first = {"row": np.arange(start, end)}
            yield {**first, **columns}
            start = end

    cut = texts_filling_max_len(run, read.values) if texts else 0
    return with_inputs(), len(read), cut


def cmd_describe(args: argparse.Namespace) -> int:
    from probtrans.resolve import load_model_spec
    from probtrans.runs.describe import format_sites, site_table

    spec = load_model_spec(spec_path(args.model))
    print(f"Pyro sample sites of {args.model} (traced on a batch of 2 training examples):")
    print(format_sites(site_table(spec)))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from probtrans.runs.compare import compare, cross_product, load_preset
    from probtrans.specs import updated

    if args.preset:
        if args.models:
            raise ProbtransError("compare: give model specs or --preset, not both")
        comparison = load_preset(spec_path(args.preset))
    elif args.models:
        paths = [str(spec_path(m)) for m in args.models]
        comparison = cross_product(paths, [str(spec_path(i)) for i in args.inference], [0])
    else:
        raise ProbtransError("compare: give model specs (with --inference) or --preset FILE")
    if args.seeds:  # every method, whatever its preset says
        comparison = updated(comparison, {"seeds": args.seeds}, f"--seeds = {args.seeds}")
        comparison.method = [m.model_copy(update={"seeds": None}) for m in comparison.method]
    if args.epochs is not None:
        comparison = updated(comparison, {"epochs": args.epochs}, f"--epochs = {args.epochs}")
    if args.ood_score is not None:
        comparison = updated(comparison, {"ood_score": args.ood_score}, "--ood-score")
    table = compare(
        comparison, args.out, progress=not args.quiet, device=args.device, force=args.force
    )
    args.done = f"the comparison was written to {args.out}/"
    print(table)
    return 0


def cmd_corrections(args: argparse.Namespace) -> int:
    from probtrans.segmentation.corrections import format_table, run
    from probtrans.segmentation.spec import load_segmentation_spec
    from probtrans.specs import updated

    spec = load_segmentation_spec(spec_path(args.spec))
    if args.ks is not None:
        try:
            ks = [int(part) for part in args.ks.split(",")]
        except ValueError:
            raise ConfigError(f"--ks = {args.ks!r}: must be integers separated by commas") from None
        spec = updated(spec, {"corrections.ks": ks}, f"--ks = {ks}")
    if args.n_test is not None:
        spec = updated(spec, {"corrections.n_test": args.n_test}, f"--n-test = {args.n_test}")
    if args.seed is not None:
        spec = updated(spec, {"seed": args.seed}, f"--seed = {args.seed}")
    result = run(spec, Path(args.out))
    print(format_table(result))
    out = Path(args.out)
    print(
        f"wall time {result['wall_seconds']:.1f} s (training or reloading "
        f"{result['train_or_load_seconds']:.1f} s); wrote {out / 'corrections.json'} and "
        f"{out / 'corrections.png'}"
    )
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from probtrans.resolve import json_schema
    from probtrans.segmentation.spec import SegmentationSpec
    from probtrans.specs import Comparison, InferenceSpec, ModelSpec

    classes = dict(
        zip(SCHEMAS, (ModelSpec, InferenceSpec, Comparison, SegmentationSpec), strict=True)
    )
    schema = json_schema(classes[args.kind])
    schema["title"] = f"probtrans {args.kind} spec"
    print(json.dumps(schema, indent=2, ensure_ascii=False))
    return 0


def parser() -> argparse.ArgumentParser:
    from probtrans.data.formats import formats, suffixes

    top = argparse.ArgumentParser(
        prog="probtrans", description="Transformers that estimate their own uncertainty (Pyro)."
    )
    top.add_argument(
        "--debug", action="store_true", help="show the traceback of an unexpected error"
    )
    sub = top.add_subparsers(dest="command", required=True)

    fit = sub.add_parser("fit", help="train by SVI, evaluate, write a run folder")
    fit.add_argument("model", nargs="?", default=DEFAULT_MODEL, help="model spec (TOML)")
    fit.add_argument("--inference", default=DEFAULT_INFERENCE, help="inference spec (TOML)")
    fit.add_argument("--out", help="run folder (default runs/<model folder>-<model>-<inference>)")
    fit.add_argument("--epochs", type=int, help="override train.epochs")
    fit.add_argument("--seed", type=int, default=0)
    fit.add_argument("--device", default="cpu", help="cpu or cuda")
    fit.add_argument("--quiet", action="store_true", help="no progress bars")
    fit.add_argument(
        "--force", action="store_true", help="replace --out even if it is not a run folder"
    )
    fit.set_defaults(run=cmd_fit)

    evaluate = sub.add_parser("evaluate", help="re-evaluate a saved run folder")
    evaluate.add_argument("run_dir")
    evaluate.add_argument("--samples", type=int, help="posterior samples (default: the spec's)")
    evaluate.add_argument("--seed", type=int, default=0)
    evaluate.add_argument("--device", default="cpu", help="cpu or cuda")
    evaluate.add_argument("--quiet", action="store_true", help="no progress bar")
    evaluate.add_argument(
        "--ood",
        action="append",
        default=[],
        metavar="NAME=SOURCE",
        help=f"another out-of-domain set: a file ({suffixes(formats(labels=None))}) or "
        "hf:ID[:CONFIG][@SPLIT]; repeat for several",
    )
    evaluate.add_argument(
        "--adapt",
        metavar="METHOD",
        help="adapt the model to each test batch before predicting it: em (Gaussian-mixture "
        "attention's keys by EM, Movellan & Gabbur Eq. 29), tent (entropy minimisation over "
        "the LayerNorms, Wang et al. 2021), or another registered method",
    )
    evaluate.add_argument(
        "--adapt-online",
        action="store_true",
        help="tent: carry the adapted state from batch to batch (default: reset per batch)",
    )
    evaluate.set_defaults(run=cmd_evaluate)

    predict = sub.add_parser(
        "predict", help="predict new inputs with a run folder: classes, probabilities, uncertainty"
    )
    predict.add_argument("run_dir", metavar="RUN", help="a run folder written by fit")
    predict.add_argument(
        "input",
        metavar="INPUT",
        help=f"texts: '-' (stdin, one per line) or {suffixes(formats('text', labels=None))} "
        f"with the run's text column; images: {suffixes(formats('image', labels=None))}; or "
        "hf:ID[:CONFIG][@SPLIT] (default split: test)",
    )
    predict.add_argument(
        "--out",
        metavar="FILE",
        help=f"write {suffixes(formats(writable=True))} (default: a table on stdout); an "
        "existing file is replaced only with --force",
    )
    predict.add_argument("--force", action="store_true", help="replace an existing --out file")
    predict.add_argument(
        "--labels",
        action="store_true",
        help="read the input's label column (the run's data.label_column), check it against "
        "the run's classes and write it beside each prediction; without it, labels are ignored",
    )
    predict.add_argument(
        "--samples", metavar="S", type=int, help="posterior samples (default: the spec's)"
    )
    predict.add_argument("--seed", metavar="N", type=int, default=0)
    predict.add_argument("--device", default="cpu", help="cpu or cuda")
    predict.add_argument("--quiet", action="store_true", help="no progress bar, no closing note")
    predict.set_defaults(run=cmd_predict)

    describe = sub.add_parser("describe", help="list the Pyro sample sites of a model spec")
    describe.add_argument("model", help="model spec (TOML)")
    describe.set_defaults(run=cmd_describe)

    compare = sub.add_parser(
        "compare", help="train and compare methods × seeds: Markdown/CSV table and a figure"
    )
    compare.add_argument("models", nargs="*", help="model specs (TOML), crossed with --inference")
    compare.add_argument("--inference", nargs="+", default=[DEFAULT_INFERENCE])
    compare.add_argument("--preset", help="a comparison file (results/presets/*.toml) instead")
    compare.add_argument("--seeds", type=int, nargs="+", help="seeds (default: preset's, or 0)")
    compare.add_argument("--epochs", type=int, help="override train.epochs of every run")
    compare.add_argument(
        "--out",
        required=True,
        help="folder for runs/, table.md/csv, figure.png, comparison.json: new, empty, or one "
        "compare wrote",
    )
    compare.add_argument(
        "--force",
        action="store_true",
        help="write into --out even if compare did not write it (files of compare's names in "
        "it are replaced, the others left alone)",
    )
    compare.add_argument(
        "--ood-score",
        choices=UNCERTAINTY_SCORES,
        help="the uncertainty score of the out-of-domain columns (default: the preset's, or "
        "the recommended one, [predictive] ood_score's default)",
    )
    compare.add_argument("--device", default="cpu", help="cpu or cuda")
    compare.add_argument("--quiet", action="store_true", help="no progress bars")
    compare.set_defaults(run=cmd_compare)

    corrections = sub.add_parser(
        "corrections",
        help="Probabilistic Transformers: accuracy as annotator corrections propagate",
    )
    corrections.add_argument(
        "spec", nargs="?", default=DEFAULT_SEGMENTATION, help="segmentation spec (TOML)"
    )
    corrections.add_argument("--out", default="runs/corrections", help="output folder")
    corrections.add_argument("--ks", help="numbers of corrected pixels, e.g. 0,1,2,5,10,20")
    corrections.add_argument("--n-test", type=int, help="test images evaluated")
    corrections.add_argument("--seed", type=int, help="seed of training, test noise, annotator")
    corrections.set_defaults(run=cmd_corrections)

    schema = sub.add_parser("schema", help="JSON Schema of a spec kind, for editors")
    schema.add_argument("kind", choices=SCHEMAS)
    schema.set_defaults(run=cmd_schema)
    return top


#: the commands that may run as several processes under torchrun
DATA_PARALLEL = ("fit", "compare")


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP: a command stops as on Ctrl-C (the last finished epoch kept, the lock
    released) and exits with 128 + the signal's number."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


#: how long a stop signal that arrived inside a finaliser waits before it is sent again
STOP_RETRY_SECONDS = 0.01


#: the modules whose functions run as weak-reference callbacks (a dictionary's entry removed)
WEAKREF_MODULES = ("weakref.py", "_weakrefset.py")


def in_finaliser(frame: FrameType | None) -> bool:
    """Whether ``frame`` may run inside a finaliser, a ``__del__`` method or a weak-reference
    callback (``WeakValueDictionary``'s), where Python prints an exception and drops it
    ("Exception ignored in ...") instead of raising it."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or Path(code.co_filename).name in WEAKREF_MODULES:
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def stop_signals_as_interrupts() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`Stopped` in the block (a second one is ignored while
    the command cleans up); the previous handlers come back afterwards. A signal that arrives
    while a finaliser runs (a progress bar's ``__del__``) is sent again shortly after, since
    an exception raised there would be dropped and the command would go on."""
    if threading.current_thread() is not threading.main_thread():  # no handlers there
        yield
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        if in_finaliser(frame):
            threading.Timer(STOP_RETRY_SECONDS, os.kill, (os.getpid(), signum)).start()
            return
        for ignored in STOP_SIGNALS:
            signal.signal(ignored, signal.SIG_IGN)
        raise Stopped(signum)

    previous = {signum: signal.signal(signum, stop) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def processes_of(args: argparse.Namespace) -> Iterator[bool]:
    """The process group of a command started by torchrun (yields whether this process is rank
    0, the one that prints); a command that runs as one process joins none."""
    from probtrans.runtime import distributed

    if args.command not in DATA_PARALLEL:
        yield True
        return
    with distributed.process_group(getattr(args, "device", "cpu")) as processes:
        if processes.is_main:
            yield True
            return
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
            yield False


def one_process_only(command: str) -> bool:
    """Whether this process, started by torchrun, is one that a command running as one process
    leaves alone (rank ≥ 1); rank 0 runs it, with a note."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or command in DATA_PARALLEL:
        return False
    if int(os.environ.get("RANK", "0")) > 0:
        return True
    print(
        f"note: probtrans {command} runs as one process: rank 0 runs it, the other processes "
        f"torchrun started exit (only {' and '.join(DATA_PARALLEL)} train on several)",
        file=sys.stderr,
    )
    return False


def with_notes(err: BaseException) -> str:
    """The error's message and the notes added on its way up (what was kept, ...)."""
    return "; ".join([str(err), *getattr(err, "__notes__", [])])


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if one_process_only(args.command):
        return 0
    main_process = True
    try:
        with stop_signals_as_interrupts(), processes_of(args) as main_process:
            return args.run(args)
    except ProbtransError as err:
        if main_process:  # the other processes raise the errors rank 0 shares
            print(f"error: {with_notes(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        stopped = isinstance(err, Stopped)
        how = f"stopped by {err}" if stopped else "interrupted"
        if getattr(args, "done", None):  # the work was complete: nothing was lost
            print(f"note: probtrans {args.command}: {how} after {args.done}", file=sys.stderr)
            return 0
        err.args = ()  # the message is the notes alone
        print(f"error: probtrans {args.command}: {how}{with_notes(err)}", file=sys.stderr)
        return 128 + err.signum if stopped else 130
    except OSError as err:
        refused = refused_write(err)
        if refused is None:
            return unexpected(err, args)
        print(f"error: probtrans {args.command}: {with_notes(refused)}", file=sys.stderr)
        return 2
    except Exception as err:  # a fault of probtrans or of the machine, not of the input
        return unexpected(err, args)


def unexpected(err: Exception, args: argparse.Namespace) -> int:
    """An exception that is neither the input's fault nor the machine's: one line with a hint
    (``--debug``: the traceback), exit 1."""
    if args.debug:
        traceback.print_exc()
    first = (str(err).strip().splitlines() or [""])[0]
    hint = "" if args.debug else "; run again with --debug for the traceback"
    what = "out of memory" if isinstance(err, MemoryError) else f"{type(err).__name__}: {first}"
    print(
        f"error: probtrans {args.command} failed unexpectedly ({what}){hint}, and please "
        f"report it if the input looks right",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
