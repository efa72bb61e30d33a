"""``probtrans.compare_guides``: guides given in Python × seeds on one model spec → the table and
figure of ``probtrans compare`` (:mod:`probtrans.runs.compare`) and ``arviz.compare``, every row,
line and index labelled by the name the caller gives each guide.

The command compares what spec files name; this compares guides that no spec names (autoguide
classes, ``functools.partial`` of them, hand-written guides and factories), each trained with
the same inference (an inference spec, or the :class:`~probtrans.specs.InferenceSpec` defaults,
and the ``elbo``/``optim``/``train``/``predictive`` keywords of :func:`probtrans.runs.fit`).
The function is ``probtrans.compare_guides``, not ``probtrans.runs.compare``: that name is the
module of the command, which importing it sets as the package's attribute ``compare``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import arviz as az
from matplotlib.figure import Figure

from probtrans.analysis.metrics import UNCERTAINTY_SCORES, ranked_metric
from probtrans.data import DataBundle
from probtrans.errors import ProbtransError
from probtrans.inference.guide_builder import GuideChoice
from probtrans.runs.compare import Folders, check_output_folder, write_results
from probtrans.runs.fitting import SpecSource, TableSource, fit, inference_source
from probtrans.runtime.caller_state import float32_default
from probtrans.specs import Comparison, SpecFile, parse
from probtrans.specs.base import check_seed
from probtrans.storage.io import TemporaryFolder

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class GuideComparison(TemporaryFolder):
    """What :func:`compare_guides` returns; the files of ``path`` hold the same.

    ``runs``: name → the run folders, one per seed (``path/runs/NAME-seedSEED``). ``rows``: the
    table's rows, column → text (``table.csv``), ``table`` the Markdown table (``table.md``):
    the ``id_metric``, the compared metrics (NLL, Brier, ECE, …), the held-out ELPD with its
    rank and the paired standard error of its difference to the best, PSIS-LOO with its Pareto
    k̂ flag, and the out-of-domain AUROC/AUPR by ``ood_score``. ``figure``: ``figure.png``
    (:func:`probtrans.analysis.comparison_figure.comparison_figure`). ``az_compare``:
    ``arviz.compare`` (PSIS-LOO over the training examples) of each name's first-seed run's
    ``predictive.nc``, indexed by name; None where a run keeps no pointwise training log-likelihood
    (``[predictive] loo_samples = 0``, or draws that differ inside the network: ``metrics.json``'s
    ``loo_note``). ArviZ flags the k̂ of a point mass (``AutoDelta``: equal draws) in its
    ``warning`` column, where the table's † says that k̂ does not apply.

    A comparison written into a temporary folder of its own (no ``out``) removes it when it is
    closed (:meth:`close`, or leaving ``with``) or collected; a folder given as ``out`` stays.
    """

    path: Path
    runs: Folders
    rows: list[dict[str, str]]
    table: str
    figure: Figure
    az_compare: pd.DataFrame | None


def check_names(guides: Mapping[str, GuideChoice]) -> None:
    """Each guide's name becomes a row, a legend entry and a folder name."""
    if not guides:
        raise ProbtransError("guides: give at least one guide, as {name: guide or factory}")
    for name in guides:
        if not isinstance(name, str) or name in ("", ".", "..") or {"/", "\\"} & set(name):
            raise ProbtransError(
                f"guides: the name {name!r} must be a text usable as a folder name (no / or \\)"
            )


@float32_default()
def compare_guides(
    model: SpecSource,
    guides: Mapping[str, GuideChoice],
    seeds: Sequence[int] = (0,),
    *,
    inference: SpecSource | None = None,
    elbo: TableSource | None = None,
    optim: TableSource | None = None,
    train: TableSource | None = None,
    predictive: TableSource | None = None,
    data: DataBundle | None = None,
    out: str | Path | None = None,
    title: str = "guides",
    id_metric: str = "accuracy",
    ood_score: str | None = None,
    device: str = "cpu",
    progress: bool = True,
) -> GuideComparison:
    """Fit ``model`` (a model spec file or object) with every guide of ``guides`` (name → a
    Pyro guide or a factory ``model -> guide``, as ``fit``'s ``guide``) and every seed, then
    compare them: returns a :class:`GuideComparison` labelled by the names.

    Each (name, seed) is ``probtrans.fit(model, inference, guide=..., seed=seed, elbo=...,
    optim=..., train=..., predictive=..., data=data, out=OUT/runs/NAME-seedSEED)``: every guide
    sees the same inference (``inference``, or the ``InferenceSpec`` defaults, with the
    keywords' fields; :func:`probtrans.runs.fit` says what each gives) and the same data.
    ``OUT`` is ``out`` — absent, empty or a folder ``probtrans compare``/``compare_guides``
    wrote (:func:`probtrans.runs.compare.check_output_folder`) — or by default a new temporary
    folder, removed when the result is closed. Every run is fitted anew (a finished run in
    ``OUT`` is replaced; an interrupted one continues). ``OUT`` gets ``table.md``,
    ``table.csv``, ``figure.png`` and ``comparison.json``, as the command writes them.
    ``id_metric`` (a metric of :data:`probtrans.analysis.metrics.METRICS` better higher or lower:
    ``accuracy``, ``mcc``, ``nll``, …) heads the table; ``ood_score`` (one of
    :data:`probtrans.analysis.metrics.UNCERTAINTY_SCORES`) scores the out-of-domain columns, by
    default the inference's ``predictive.ood_score``. Names, seeds and every spec field are checked
    before anything trains.
    """
    check_names(guides)
    seeds = [check_seed(seed, f"seeds: {seed!r}") for seed in seeds]
    if len(set(seeds)) != len(seeds):
        raise ProbtransError(f"seeds = {seeds}: a seed given twice")
    tables = {"elbo": elbo, "optim": optim, "train": train, "predictive": predictive}
    _, spec = inference_source(inference, next(iter(guides.values())), tables)  # checked now
    score = spec.predictive.ood_score if ood_score is None else ood_score
    UNCERTAINTY_SCORES.get(score, "ood_score")
    ranked_metric(id_metric, "compare_guides: id_metric")
    model_file = model.file if isinstance(model, SpecFile) else str(model)
    methods = [{"name": n, "model": model_file, "inference": spec.file} for n in guides]
    table = {"title": title, "seeds": seeds, "id_metric": id_metric, "ood_score": score}
    comparison = parse(Comparison, {**table, "method": methods}, "compare_guides")
    comparison = comparison.located("compare_guides")
    temporary = out is None
    path = Path(tempfile.mkdtemp(prefix="probtrans-compare-") if out is None else out)
    if not temporary:
        check_output_folder(path)
    runs = {name: [path / "runs" / f"{name}-seed{seed}" for seed in seeds] for name in guides}
    try:
        for name, guide in guides.items():
            for seed, folder in zip(seeds, runs[name], strict=True):
                if progress:
                    print(f"fit {name}, seed {seed} → {folder}", flush=True)
                fit(
                    model,
                    inference,
                    out=folder,
                    seed=seed,
                    guide=guide,
                    data=data,
                    device=device,
                    progress=progress,
                    **tables,
                )
        rows, text, drawn = write_results(comparison, path, runs)
        result = GuideComparison(path, runs, rows, text, drawn, arviz_comparison(runs))
    except BaseException:
        if temporary:
            shutil.rmtree(path, ignore_errors=True)
        raise
    if temporary:
        result.own_temporary_folder()
    return result


def arviz_comparison(runs: Folders) -> pd.DataFrame | None:
    """``arviz.compare`` of each name's first run's ``predictive.nc`` (its ``log_likelihood``
    of the training examples: PSIS-LOO), indexed by name; None, with a note, where a run keeps
    no pointwise log-likelihood."""
    kept = {}
    with az.rc_context({"data.load": "eager"}):  # read whole: no file left open
        for name, folders in runs.items():
            kept[name] = az.from_netcdf(folders[0] / "predictive.nc")
            if "log_likelihood" not in kept[name].groups():
                print(
                    f"note: {folders[0]} keeps no pointwise log-likelihood (its metrics.json "
                    f"loo_note says why), so there is no arviz.compare (az_compare is None)",
                    file=sys.stderr,
                )
                return None
    return az.compare(kept)
