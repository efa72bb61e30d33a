"""``probtrans compare``: methods × seeds → one table (Markdown and CSV) and one figure.

A comparison is either the cross product of model specs and inference specs given on the
command line, or a preset file (``results/presets/*.toml``)::

    title = "H-STO Table 2: CoLA"
    seeds = [0, 1, 2]
    id_metric = "mcc"          # any ranked metric (accuracy, nll, ...); also for labelled OOD sets
    ood_score = "entropy"      # the uncertainty score of the OOD columns, one of
                               # probtrans.analysis.metrics.UNCERTAINTY_SCORES (msp, entropy, ...)
    epochs = 5                 # optional: override every inference spec's train.epochs

    [[method]]
    name = "TRANS"
    model = "models/cola/trans.toml"
    inference = "inference/text/map.toml"
    variant = "plain"          # or a post-hoc variant listed in the inference spec's
                               # [predictive] posthoc: "mc_dropout", "laplace"
    ensemble = false           # true: all seeds' runs as one predictive (deep ensemble)
    seeds = [0]                # optional: this method's seeds instead of the comparison's
    epochs = 8                 # optional: this method's epochs instead of the comparison's;
                               # methods that share a run must agree
    temperature = false        # true: temperature scaling fitted on validation
    paper = "20.09 / 16.46"    # the paper's number, printed beside ours

Every (model, inference, seed) is trained once into ``OUT/runs/`` and shared by the methods
that use it. A complete run is reused only if the spec texts its checkpoint keeps are the spec
files' texts today, and its seed and epochs are those asked (:func:`reuse_note`); otherwise it
is trained again, with a note saying why. A run interrupted during training continues from its
last finished epoch (:func:`probtrans.runs.fit`), so an interrupted comparison resumes where it
stopped. A method given twice, and methods whose data cannot share a table (images against
texts, other out-of-domain sets), are refused before anything is trained.
Each row is the mean ± standard deviation over seeds of
:func:`probtrans.analysis.summary.summarise`, computed from the runs' ``probs.npz``: the
``id_metric``, the metrics marked ``compared``
(:func:`probtrans.analysis.summary.comparison_metrics`), the held-out ELPD and the out-of-domain
columns. Under torchrun every run is trained by all the processes together, and rank 0 decides what
to train and writes the table and the figure.

``OUT`` is written into only if it is compare's own (:func:`check_output_folder`): absent or
empty, or holding the ``comparison.json`` that compare writes beside its table (or, from before
compare wrote one, nothing but ``table.md``, ``table.csv``, ``figure.png`` and ``runs/``, with
``runs/`` or all three of the others). A folder of the user's, holding anything else, is refused
unless ``force`` (``--force``): then compare writes its files into it, replacing those of the
same names, and leaves the others as they are. One compare at a time writes into ``OUT``: it
holds the lock ``OUT.lock`` from its checks to its last file, and a second one is refused,
naming the process that holds it. The table, the CSV, the figure and ``comparison.json`` are
published as one set: whatever signal stops compare, they are all the earlier ones or all new.

The table and the figure read each method's runs from folders given by method name
(:data:`Folders`): those under ``OUT/runs/`` here, those of guides given in Python in
:func:`probtrans.runs.guide_comparison.compare_guides`.
"""

from __future__ import annotations

import contextlib
import csv
import io
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from probtrans.analysis import calibration, comparison_figure
from probtrans.analysis.elpd import POINT_MASS, UNRELIABLE, heldout_elpd, standard_error
from probtrans.analysis.metrics import METRICS, UNCERTAINTY_SCORES, ranked_metric
from probtrans.analysis.results import PLAIN, RunMetrics
from probtrans.analysis.summary import comparison_metrics, constant_note, summarise
from probtrans.data.sources import is_image, ood_set_names
from probtrans.errors import ConfigError, ProbtransError
from probtrans.resolve import load_inference_spec, load_model_spec
from probtrans.runs.fitting import fit
from probtrans.runs.folder import RunInfo, read_timing, run_name, spec_label
from probtrans.runs.kept import check_samples, probs_origin, read_probs
from probtrans.runtime import distributed
from probtrans.runtime.caller_state import float32_default
from probtrans.runtime.progress import no_thread_left
from probtrans.specs import Comparison, Method, read_spec, read_spec_text
from probtrans.specs.inference import POSTHOC
from probtrans.storage.checkpoint import load_checkpoint, require
from probtrans.storage.io import (
    is_temporary_file,
    json_text,
    png_writer,
    read_json,
    text_writer,
    write_together,
)
from probtrans.storage.lock import folder_lock


def load_preset(path: str | Path) -> Comparison:
    """A comparison file; its methods' spec paths are resolved from the working folder, or else
    from the project folder (presets live in ``results/presets/``)."""
    comparison = read_spec(Comparison, path)
    root = Path(path).resolve().parents[2]
    for method in comparison.method:
        for name in ("model", "inference"):
            spec = Path(getattr(method, name))
            if not spec.is_absolute() and not spec.is_file():
                spec = root / spec
            if not spec.is_file():
                what = "is a folder, not a file" if spec.is_dir() else "no such file"
                raise ConfigError(f"{path}: method {method.name!r}: {name} {spec}: {what}")
            setattr(method, name, str(spec))
    return comparison


def missing_variant(method: Method) -> ConfigError:
    return ConfigError(
        f"{method.inference}: [predictive] posthoc does not list {method.variant!r}, "
        f"needed by method {method.name!r}"
    )


#: the file by which compare knows its own output folder, written beside the table
MARKER = "comparison.json"
#: what compare writes into its output folder
OUTPUTS = frozenset({MARKER, "table.md", "table.csv", "figure.png", "runs"})


def is_own_marker(path: Path) -> bool:
    """Whether ``path`` is a ``comparison.json`` that compare wrote."""
    try:
        kept = read_json(path, expect=dict)
    except ProbtransError:
        return False
    return kept.get("written_by") == "probtrans compare"


def check_output_folder(out: Path, force: bool = False) -> None:
    """Refuse to write into ``out`` unless it is absent, empty or compare's own output folder
    (module docstring), or ``force``; a file is refused even then."""
    if not out.exists() and not out.is_symlink():
        above = next(p for p in out.parents if p.exists() or p == Path(p.anchor))
        if not above.is_dir():
            raise ProbtransError(f"{out}: cannot be created, {above} is a file")
        return
    if not out.is_dir():
        raise ProbtransError(f"{out}: exists and is not a folder; choose another --out")
    names = {entry.name for entry in out.iterdir() if not is_temporary_file(entry)}
    if not names or force or is_own_marker(out / MARKER):
        return
    earlier = names <= OUTPUTS - {MARKER} and (
        (out / "runs").is_dir() or {"table.md", "table.csv", "figure.png"} <= names
    )
    if not earlier:
        shown = sorted(names)
        listed = ", ".join(shown[:3]) + (f" and {len(shown) - 3} more" if len(shown) > 3 else "")
        raise ProbtransError(
            f"{out}: not a folder probtrans compare wrote (it holds {listed}, and no "
            f"{MARKER} of compare's); choose another --out, or pass --force to write the "
            f"table, figure and runs/ into it, replacing files of those names"
        )


def check_methods(comparison: Comparison) -> None:
    """Before anything is trained: read every method's specs and check its variant; refuse a
    method given twice, methods that share a run but not its epochs, and methods whose data
    cannot share one table (images against texts, other out-of-domain sets)."""
    UNCERTAINTY_SCORES.get(comparison.ood_score, f"{comparison.file}: ood_score")  # or ConfigError
    ranked_metric(comparison.id_metric, f"{comparison.file}: id_metric")
    sharing: dict[tuple[str, str], Method] = {}  # (model, inference) → first method training it
    seen: dict[str, Method] = {}  # a method's definition, its name aside → the method
    data: dict[tuple[bool, tuple[str, ...]], Method] = {}  # (images, OOD sets) → first method
    for index, method in enumerate(comparison.method):
        if method.variant != PLAIN:
            POSTHOC.get(method.variant, f"{comparison.file}: method[{index}].variant")
        model = load_model_spec(method.model)
        inference = load_inference_spec(method.inference)
        if method.variant != PLAIN and method.variant not in inference.predictive.posthoc:
            raise missing_variant(method)
        definition = method.model_copy(update={"name": "", "paper": ""}).model_dump_json()
        twin = seen.get(definition) or next(
            (m for m in seen.values() if m.name == method.name), None
        )
        if twin is not None:
            raise ConfigError(
                f"{comparison.file}: methods {twin.name!r} and {method.name!r}: "
                + ("the same method twice" if definition in seen else "one name twice")
                + "; each row of the table must be a method of its own"
            )
        seen[definition] = method
        first = sharing.setdefault((method.model, method.inference), method)
        if comparison.epochs_of(first) != comparison.epochs_of(method):
            raise ConfigError(
                f"{comparison.file}: methods {first.name!r} and {method.name!r} share the runs "
                f"of {Path(method.model).name} + {Path(method.inference).name} but ask for "
                f"{comparison.epochs_of(first)} and {comparison.epochs_of(method)} epochs"
            )
        data.setdefault((is_image(model.data), tuple(ood_set_names(model.data))), method)
    if len(data) > 1:
        (kind_a, sets_a), (kind_b, sets_b) = list(data)[:2]
        a, b = data[kind_a, sets_a], data[kind_b, sets_b]

        def words(image: bool, sets: tuple[str, ...]) -> str:
            return f"{'images' if image else 'texts'}, out-of-domain sets {list(sets)}"

        raise ConfigError(
            f"{comparison.file}: methods {a.name!r} ({a.model}: {words(kind_a, sets_a)}) and "
            f"{b.name!r} ({b.model}: {words(kind_b, sets_b)}) cannot share one table; compare "
            f"them separately"
        )


def cross_product(
    models: list[str], inferences: list[str], seeds: list[int], title: str = "comparison"
) -> Comparison:
    methods = [
        Method(name=f"{spec_label(m)} + {Path(i).stem}", model=m, inference=i)
        for m in models
        for i in inferences
    ]
    return Comparison(title=title, seeds=seeds, method=methods).located("<command line>")


def run_dir(out: Path, method: Method, seed: int) -> Path:
    return out / "runs" / f"{run_name(method.model, method.inference, '__')}__s{seed}"


#: method name → the folders of its runs, one per seed: what the table and the figure read
Folders = dict[str, list[Path]]


def method_folders(comparison: Comparison, out: Path) -> Folders:
    """The folders of the comparison's runs under ``OUT/runs/`` (:func:`run_dir`)."""
    return {
        method.name: [run_dir(out, method, seed) for seed in comparison.seeds_of(method)]
        for method in comparison.method
    }


def reuse_note(folder: Path, method: Method, seed: int, epochs: int) -> str | None:
    """None if ``folder`` holds a complete run of the method's spec texts (as its checkpoint
    keeps them), ``seed`` and ``epochs``, and whose ``probs.npz`` was computed from its
    checkpoint (:func:`~probtrans.runs.kept.probs_origin`; one too old to tell is reused with
    a note), which ``compare`` reuses; else why it is trained ("" for a new run). Committed
    results keep metrics only, no checkpoint: those are trained. A damaged run file is an error
    naming it."""
    if not folder.exists():
        return ""
    files = [folder / name for name in ("metrics.json", "probs.npz", "checkpoint.pt")]
    if files[0].is_file():
        trained = RunInfo.read(read_json(files[0], expect=dict))
    missing = [path.name for path in files if not path.is_file()]
    if missing:
        return f"it has no {', '.join(missing)}"
    kept = require(load_checkpoint(files[2]), files[2], ["model_spec", "inference_spec", "seed"])
    for key, path in (("model_spec", method.model), ("inference_spec", method.inference)):
        if kept[key] != read_spec_text(Path(path)):
            return f"trained from another {path} (edited since)"
    if trained.get("seed", kept["seed"]) != seed:
        return f"trained with seed {trained.get('seed', kept['seed'])}, {seed} asked"
    if trained.get("epochs") != epochs:
        return f"trained for {trained.get('epochs')} epochs, {epochs} asked"
    origin = probs_origin(folder, read_probs(files[1]))
    if origin == "another run":
        return "its probs.npz was not computed from its checkpoint.pt"
    if origin == "unknown":
        print(
            f"note: {files[1]} keeps no fingerprint of the checkpoint it was computed from "
            f"(written before probtrans kept one), so it cannot be checked against the run; "
            f"reused as it is",
            file=sys.stderr,
        )
    return None


def ensure_runs(
    comparison: Comparison, out: Path, progress: bool = True, device: str = "cpu"
) -> None:
    """Train every missing (model, inference, seed) run; finished runs are left alone."""
    processes = distributed.current()
    for method in comparison.method:
        for seed in comparison.seeds_of(method):
            folder = run_dir(out, method, seed)
            epochs = (
                comparison.epochs_of(method) or load_inference_spec(method.inference).train.epochs
            )
            note = processes.share(lambda: reuse_note(folder, method, seed, epochs))  # noqa: B023
            if note is None:
                continue
            print(f"fit {folder.name}" + (f" ({note}: trained again)" if note else ""), flush=True)
            fit(
                method.model,
                method.inference,
                out=folder,
                epochs=epochs,
                seed=seed,
                device=device,
                progress=progress,
            )


@dataclass
class Instance:
    """One predictive of a method: a seed's run, or a deep ensemble of the seeds' runs."""

    probs: dict[str, np.ndarray]  # split → (S, N, C)
    labels: dict[str, np.ndarray]  # split → (N,)
    given: dict[str, dict[str, np.ndarray]]  # split → score → (N,): energy, feature scores
    seconds: float  # training
    eval_seconds: float  # evaluation (its run's, every variant of it)


def method_probs(method: Method, folders: list[Path]) -> list[Instance]:
    """The method's predictive per seed, or one deep ensemble combining the seeds' draws; the
    scores the network gives (free energy, feature scores) of an ensemble are the means over
    its seeds' runs of those every run has."""
    rows = []
    for folder in folders:
        kept = read_probs(folder / "probs.npz")
        check_samples(folder, read_json(folder / "metrics.json", expect=dict), kept.probs)
        if method.variant not in kept.probs:
            raise missing_variant(method)
        if not kept.features and fits_feature_scores(folder):
            print(
                f"note: {folder} keeps no feature scores (written before runs fitted them): "
                f"its feature-score OOD columns show –; probtrans evaluate {folder} fits them, "
                f"then compare again",
                file=sys.stderr,
            )
        timing = read_timing(folder)
        seconds = (timing.get("train_seconds", 0.0), timing.get("evaluate_seconds", 0.0))
        rows.append(
            Instance(kept.probs[method.variant], kept.labels, kept.given(method.variant), *seconds)
        )
    if method.ensemble:
        combined = {s: np.concatenate([r.probs[s] for r in rows]) for s in rows[0].probs}
        given = {  # the mean over all draws (equal S per seed), of the scores every run gives
            split: {
                score: np.mean([r.given[split][score] for r in rows], axis=0)
                for score in set.intersection(*(set(r.given.get(split, {})) for r in rows))
            }
            for split in rows[0].given
        }
        seconds = (sum(r.seconds for r in rows), sum(r.eval_seconds for r in rows))
        rows = [Instance(combined, rows[0].labels, given, *seconds)]
    if method.temperature:  # tempered logits are not kept: no energy; the features stay
        rows = [
            Instance(
                temperature_scaled_splits(r.probs, r.labels),
                r.labels,
                {s: {k: v for k, v in by.items() if k != "energy"} for s, by in r.given.items()},
                r.seconds,
                r.eval_seconds,
            )
            for r in rows
        ]
    return rows


def fits_feature_scores(folder: Path) -> bool:
    """Whether the run in ``folder`` asks for feature scores (its ``inference.toml``; False
    where it cannot be read)."""
    try:
        return load_inference_spec(folder / "inference.toml").predictive.feature_scores
    except ProbtransError:
        return False


def temperature_scaled_splits(
    probs: dict[str, np.ndarray], labels: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Every split's predictive tempered by the temperature fitted on the validation split."""
    temperature = calibration.fit_temperature(probs["val"], labels["val"])
    return {s: calibration.temperature_scaled(p, temperature) for s, p in probs.items()}


def mean_std(values: list[float | None], scale: float = 1.0) -> str:
    """A cell: mean ± sample std of ``values`` times ``scale``, "–" where one has no value."""
    if None in values:
        return "–"
    if len(values) == 1:
        return f"{values[0] * scale:.2f}"
    return f"{np.mean(values) * scale:.2f} ± {np.std(values, ddof=1) * scale:.2f}"


def loo_columns(method: Method, folders: list[Path]) -> dict[str, str]:
    """PSIS-LOO of the method's runs from their ``metrics.json``: ``LOO`` (mean ± std over
    seeds, marked † for a point mass's in-sample figure and ! where it is unreliable),
    ``p_loo`` and ``k̂ bad`` (the most training examples over the Pareto k̂ threshold in a seed).
    LOO is of a run's plain posterior: "–" for a post-hoc variant, a tempered predictive or a
    deep ensemble, and for runs evaluated before LOO was written."""
    if method.variant != PLAIN or method.temperature or method.ensemble:
        return {"LOO": "–", "p_loo": "–", "k̂ bad": "–"}
    runs = [RunMetrics.from_json(read_json(f / "metrics.json", expect=dict)).run for f in folders]
    if any(run.get("loo") is None for run in runs):
        return {"LOO": "–", "p_loo": "–", "k̂ bad": "–"}
    notes = [run.get("loo_note", "") for run in runs]
    point_mass = all(note.startswith(POINT_MASS) for note in notes)
    marker = "†" if point_mass else "!" if any(n.startswith(UNRELIABLE) for n in notes) else ""
    return {
        "LOO": mean_std([run["loo"] for run in runs]) + marker,
        "p_loo": f"{np.mean([run['p_loo'] for run in runs]):.1f}",
        "k̂ bad": "–" if point_mass else str(max(run["loo_k_bad"] for run in runs)),
    }


def rank_by_elpd(rows: list[dict[str, str]], tests: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """Fill ``ELPD rank`` (1: the highest test ELPD) and ``Δ ELPD (SE)``: the difference to the
    best method, Σ_n (elpd_n − best_n), with the standard error of the paired differences,
    sqrt(N · Var_n) (Vehtari, Gelman & Gabry 2017, Eq. 24). ``tests``: per method its test
    labels (N,) and seed-averaged pointwise held-out ELPD (N,); "–" where a method's test split
    is not the best's."""
    totals = [pointwise.sum() for _, pointwise in tests]
    best_labels, best = tests[int(np.argmax(totals))]
    for rank, index in enumerate(np.argsort(totals, kind="stable")[::-1], start=1):
        rows[index]["ELPD rank"] = str(rank)
    for row, (labels, pointwise) in zip(rows, tests, strict=True):
        difference = pointwise - best if np.array_equal(labels, best_labels) else None
        row["Δ ELPD (SE)"] = (
            "–"
            if difference is None
            else f"{difference.sum():.1f} ({standard_error(difference):.1f})"
        )


def table_rows(
    comparison: Comparison, folders: Folders, methods: dict[str, list[Instance]]
) -> list[dict[str, str]]:
    """One row per method, from its predictives (``methods``, :func:`method_instances`) and its
    runs' ``folders``: in-domain metrics, the held-out ELPD and its rank, PSIS-LOO
    (:func:`loo_columns`), then per out-of-domain set its ``id_metric`` (labelled sets) and the
    AUROC and AUPR of the comparison's ``ood_score``."""
    rows, tests = [], []
    metric, score = comparison.id_metric, comparison.ood_score
    shown = METRICS.get(metric, f"{comparison.file}: id_metric")
    for method in comparison.method:
        runs, instances = folders[method.name], methods[method.name]
        scores = [summarise(r.probs, r.labels, r.given) for r in instances]
        row = {"method": method.name, "seeds": str(len(runs))}
        # s.get: None for no value, or too few draws
        row[f"ID {metric} ({shown.unit})"] = mean_std([s.get(metric) for s in scores], shown.scale)
        for column in comparison_metrics():
            row[column.name] = mean_std([s.get(column.name) for s in scores], column.scale)
        row["test ELPD"] = mean_std([s["test_elpd"] for s in scores])
        row["ELPD SE"] = f"{np.mean([s['test_elpd_se'] for s in scores]):.1f}"
        row["ELPD rank"] = row["Δ ELPD (SE)"] = ""  # by rank_by_elpd, once every method is in
        labels = instances[0].labels["test"]  # the same test split for every seed
        pointwise = [heldout_elpd(r.probs["test"], labels)[2] for r in instances]
        tests.append((labels, np.mean(pointwise, axis=0)))
        row |= loo_columns(method, runs)
        for set_name, first in scores[0]["ood"].items():
            sets = [s["ood"][set_name] for s in scores]
            if metric in first:
                values = [r.get(metric) for r in sets]
                row[f"{set_name} {metric} ({shown.unit})"] = mean_std(values, shown.scale)
            for measure in ("auroc", "aupr"):
                values = [r[score][measure] if score in r else None for r in sets]
                row[f"{set_name} {measure.upper()} (%)"] = mean_std(values, 100)
        row["train s"] = f"{np.mean([r.seconds for r in instances]):.0f}"
        row["eval s"] = f"{np.mean([r.eval_seconds for r in instances]):.0f}"
        row["paper"] = method.paper
        rows.append(row)
    rank_by_elpd(rows, tests)
    return rows


def method_instances(comparison: Comparison, folders: Folders) -> dict[str, list[Instance]]:
    """method → its predictives (:func:`method_probs`), read once for the table, the notes and
    the figure."""
    return {method.name: method_probs(method, folders[method.name]) for method in comparison.method}


def constant_methods(methods: dict[str, list[Instance]]) -> dict[str, str]:
    """method → the note of its first seed (or ensemble) whose predictive gives one class to
    every validation example (:func:`probtrans.analysis.summary.constant_note`); methods that
    learned are left out."""
    notes = {}
    for name, instances in methods.items():
        for instance in instances:
            note = constant_note(instance.probs, [])
            if note is not None:
                notes[name] = note
                break
    return notes


def markdown(
    rows: list[dict[str, str]], comparison: Comparison, constant: dict[str, str] | None = None
) -> str:
    header = list(dict.fromkeys(h for row in rows for h in row))  # methods may differ in sets
    lines = [f"## {comparison.title}", "", "| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join("---" for _ in header) + "|")
    lines += ["| " + " | ".join(row.get(h, "–") for h in header) + " |" for row in rows]
    units: dict[str, list[str]] = {}
    for column in comparison_metrics():
        units.setdefault(column.unit, []).append(column.label)
    units.setdefault("%", []).extend(["AUROC", "AUPR"])
    in_units = "; ".join(f"{', '.join(labels)} in {unit}" for unit, labels in units.items())
    lines += [
        "",
        f"{in_units}. Out-of-domain detection of each set against the in-domain test split by "
        f"{comparison.ood_score} (higher = more uncertain; AUROC, AUPR with out-of-domain "
        f"positive). Mean ± std over seeds (a deep ensemble is one predictive over all seeds).",
        "",
        "Methods are ranked by the held-out ELPD, test ELPD = Σ_n log (1/S) Σ_s p(y_n | draw s) "
        "over the test split (nats; higher is better); ELPD SE = sqrt(N) · std of its pointwise "
        "values (the uncertainty of one seed's figure from the finite test split). Δ ELPD is "
        "the difference to the best method with, in brackets, the standard error of the paired "
        "pointwise differences: a difference within about two of its SE is noise. LOO is "
        "PSIS-LOO over the training examples (nats; of a run's plain posterior), p_loo its "
        "effective number of parameters, k̂ bad the training examples whose Pareto k̂ exceeds "
        "min(1 − 1/log10 S, 0.7) (0.62 at S = 400 draws), where the estimate cannot be "
        "trusted; above 5 % of the examples the LOO as a whole is unreliable (!, the runs' "
        "metrics.json loo_note says why; also with too few draws). LOO of a posterior over the "
        "head alone is optimistic: the network below saw every example. † a point-mass "
        "posterior (MAP): its LOO is the in-sample log predictive density with p_loo = 0, "
        "optimistic too, and k̂ does not apply. Rank on the test ELPD. train s and eval s: "
        "the seconds of a run's training and of its evaluation (every variant of the run, "
        "their draws, feature scores and figures), mean over seeds (an ensemble: the sum).",
    ]
    unreliable = [row["method"] for row in rows if row.get("LOO", "").endswith("!")]
    if unreliable:
        lines += ["", f"**Warning**: the LOO of {', '.join(unreliable)} is unreliable."]
    for name, note in (constant or {}).items():
        lines += ["", f"**Warning**: {name}: {note}."]
    return "\n".join(lines) + "\n"


def figure(comparison: Comparison, methods: dict[str, list[Instance]]) -> Figure:
    """Every method overlaid, one panel per question
    (:func:`probtrans.analysis.comparison_figure.comparison_figure`): reliability, risk–coverage
    and OOD ROC of each method's first seed (or its ensemble), and the table's headline metrics as
    mean ± std over seeds; from their predictives (:func:`method_instances`)."""
    return comparison_figure.comparison_figure(
        comparison.title, methods, comparison.id_metric, comparison.ood_score
    )


@float32_default()
@no_thread_left()
def compare(
    comparison: Comparison,
    out: str | Path,
    progress: bool = True,
    device: str = "cpu",
    force: bool = False,
) -> str:
    """Train what is missing, then write ``OUT/table.md``, ``OUT/table.csv``,
    ``OUT/figure.png`` and ``OUT/comparison.json``; returns the Markdown table. ``OUT`` must be
    absent, empty or compare's own, unless ``force`` (:func:`check_output_folder`), and no
    other compare may be writing it: the lock ``OUT.lock`` is held throughout
    (:func:`~probtrans.storage.lock.folder_lock`)."""
    out = Path(out)
    start = time.perf_counter()
    processes = distributed.current()
    check_methods(comparison)
    processes.share(lambda: check_output_folder(out, force))
    with contextlib.ExitStack() as held:

        def lock() -> None:  # on rank 0: one compare at a time writes into OUT
            held.enter_context(folder_lock(out, "probtrans compare"))
            check_output_folder(out, force)  # again, now that no other compare writes it

        processes.share(lock)
        ensure_runs(comparison, out, progress, device)
        folders = method_folders(comparison, out)
        text = processes.share(lambda: write_results(comparison, out, folders)[1])
    print(f"compare: {time.perf_counter() - start:.0f} s (training included)")
    return text


def write_results(
    comparison: Comparison, out: Path, folders: Folders
) -> tuple[list[dict[str, str]], str, Figure]:
    """``OUT/table.md``, ``OUT/table.csv`` and ``OUT/figure.png`` of the finished runs in
    ``folders``, and ``OUT/comparison.json``, by which compare knows the folder as its own,
    written as one set (:func:`~probtrans.storage.io.write_together`: whatever stops compare, the
    four are all the earlier ones or all new); returns the table's rows, the Markdown table and
    the figure."""
    predictives = method_instances(comparison, folders)
    rows = table_rows(comparison, folders, predictives)
    constant = constant_methods(predictives)
    for name, note in constant.items():
        print(f"warning: {name}: {note}", file=sys.stderr)
    text = markdown(rows, comparison, constant)
    buffer = io.StringIO()
    header = list(dict.fromkeys(h for row in rows for h in row))
    writer = csv.DictWriter(buffer, fieldnames=header, restval="–")
    writer.writeheader()
    writer.writerows(rows)
    methods = [method.name for method in comparison.method]
    marker = {"written_by": "probtrans compare", "title": comparison.title, "methods": methods}
    drawn = figure(comparison, predictives)
    write_together(
        {
            out / MARKER: text_writer(json_text(marker)),
            out / "table.md": text_writer(text),
            out / "table.csv": text_writer(buffer.getvalue()),
            out / "figure.png": png_writer(drawn),
        }
    )
    return rows, text, drawn
