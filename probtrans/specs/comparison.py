"""Comparison presets (``results/presets/*.toml``): methods × seeds for ``probtrans compare``."""

from __future__ import annotations

from pydantic import Field

from probtrans.specs.base import PositiveInt, Seed, Spec, SpecFile
from probtrans.specs.inference import RECOMMENDED_OOD_SCORE


class Method(Spec):
    """``[[method]]``: one row of the table."""

    name: str
    model: str
    """Model spec; relative paths are tried from the working folder, then the project's."""
    inference: str
    """Inference spec; found as ``model`` is."""
    variant: str = "plain"
    """The predictive the method reads from its runs: ``plain``, or a post-hoc variant listed in
    the inference spec's ``[predictive] posthoc``."""
    ensemble: bool = False
    """All seeds' runs as one predictive (a deep ensemble)."""
    temperature: bool = False
    """Temperature scaling fitted on validation NLL."""
    paper: str = ""
    """The paper's number, printed beside ours."""
    seeds: list[Seed] | None = None
    """This method's seeds instead of the comparison's."""
    epochs: PositiveInt | None = None
    """This method's epochs instead of the comparison's; methods sharing a run must agree."""


class Comparison(SpecFile):
    """A comparison: the cross product of specs on the command line, or a preset file."""

    title: str = "comparison"
    seeds: list[Seed] = Field([0], min_length=1)
    id_metric: str = "accuracy"
    """In-domain metric heading the table (and of each labelled out-of-domain set): any metric
    of ``probtrans.analysis.metrics.METRICS`` that is better higher or lower (accuracy, mcc, nll,
    ...)."""
    ood_score: str = RECOMMENDED_OOD_SCORE
    """The uncertainty score of the out-of-domain columns: one of
    ``probtrans.analysis.metrics.UNCERTAINTY_SCORES`` (msp, entropy, ..., energy, mahalanobis, ...);
    default the recommended one."""
    epochs: PositiveInt | None = None
    """Override every inference spec's ``train.epochs``."""
    method: list[Method] = Field([], min_length=1)

    def seeds_of(self, method: Method) -> list[int]:
        return self.seeds if method.seeds is None else method.seeds

    def epochs_of(self, method: Method) -> int | None:
        return self.epochs if method.epochs is None else method.epochs
