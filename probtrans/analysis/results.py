"""A run's ``metrics.json`` as values: :class:`RunMetrics` holds one :class:`PredictiveMetrics`
per predictive (the plain one, then each post-hoc variant) and the run's own keys (posterior
samples, PSIS-LOO, the training-set ELBO, seed and epochs, ...). This module is the one place
that knows how they are laid out in the file:

- the plain predictive's metrics are top-level keys (:func:`probtrans.analysis.summary.summarise`
  gives them: every metric of :data:`~probtrans.analysis.metrics.METRICS`, the held-out ELPD,
  the temperature, ``ood``, ``torch_uncertainty``), its temperature-scaled ones prefixed
  ``ts_`` (:data:`TEMPERATURE_SCALED`);
- a post-hoc variant's are the same keys prefixed ``{variant}.``;
- a predictive that gives one class to every validation example has a ``constant_note``
  (``{variant}.constant_note``), after every predictive's metrics;
- then the run's keys, in the order they were written.

:meth:`RunMetrics.to_json` writes this layout and :meth:`RunMetrics.from_json` reads it, so a
file read and written again is the same file, and the files of older runs read as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from probtrans.analysis.metrics import METRICS

#: the name of the predictive without post-hoc changes
PLAIN = "plain"
#: the prefix of a metric after temperature scaling (``ts_nll``)
TEMPERATURE_SCALED = "ts_"
#: what separates a post-hoc variant's name from its metric's key (``laplace.nll``)
VARIANT_SEPARATOR = "."
#: the key of a predictive that gives one class to every validation example, with what to try
CONSTANT_NOTE = "constant_note"
#: the keys of one predictive's metrics besides the registered metrics (``summarise``'s)
PREDICTIVE_KEYS = ("test_elpd", "test_elpd_se", "temperature", "ood", "torch_uncertainty")


def is_predictive_key(key: str) -> bool:
    """Whether ``key`` (unprefixed by a variant) is one of a predictive's metrics."""
    name = key.removeprefix(TEMPERATURE_SCALED)
    return key in PREDICTIVE_KEYS or name in METRICS


@dataclass
class PredictiveMetrics:
    """The metrics of one predictive: ``values`` as :func:`~probtrans.analysis.summary.summarise`
    gives them (metric key → value; ``None`` where a metric has no value), and the note of a
    constant predictor."""

    values: dict[str, Any]
    constant_note: str | None = None

    def get(self, key: str) -> Any:
        """The metric ``key`` (``None`` where it is absent or has no value)."""
        return self.values.get(key)

    def scaled(self, key: str) -> Any:
        """The metric ``key`` after temperature scaling (``None`` where it is not scaled)."""
        return self.values.get(TEMPERATURE_SCALED + key)

    def has(self, key: str) -> bool:
        return key in self.values

    @property
    def ood(self) -> dict[str, dict[str, Any]]:
        """Out-of-domain set → its report (every uncertainty score, labelled metrics)."""
        return self.values.get("ood") or {}


@dataclass
class RunMetrics:
    """Everything a run's ``metrics.json`` holds: ``predictives`` (``"plain"`` first, then the
    post-hoc variants by name) and the run's own keys ``run``, in file order."""

    predictives: dict[str, PredictiveMetrics]
    run: dict[str, Any] = field(default_factory=dict)

    @property
    def plain(self) -> PredictiveMetrics:
        return self.predictives[PLAIN]

    @property
    def variants(self) -> list[str]:
        """The post-hoc variants, by name."""
        return [name for name in self.predictives if name != PLAIN]

    @property
    def posterior_samples(self) -> int | None:
        """The posterior draws S of every predictive (``None`` in a file that does not say)."""
        return self.run.get("posterior_samples")

    def to_json(self) -> dict[str, Any]:
        """The ``metrics.json`` layout (module docstring)."""
        data = dict(self.plain.values)
        for name in self.variants:
            for key, value in self.predictives[name].values.items():
                data[f"{name}{VARIANT_SEPARATOR}{key}"] = value
        for name in sorted(self.predictives):  # as evaluate has always written them
            note = self.predictives[name].constant_note
            if note is not None:
                data[CONSTANT_NOTE if name == PLAIN else f"{name}.{CONSTANT_NOTE}"] = note
        return data | self.run

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunMetrics:
        """Read the layout of :meth:`to_json` (and of every earlier probtrans)."""
        values: dict[str, dict[str, Any]] = {PLAIN: {}}
        notes: dict[str, str] = {}
        run: dict[str, Any] = {}
        for key, value in data.items():
            variant, separator, name = key.partition(VARIANT_SEPARATOR)
            if not separator:
                variant, name = PLAIN, key
            if name == CONSTANT_NOTE:
                notes[variant] = value
            elif separator or is_predictive_key(key):
                values.setdefault(variant, {})[name] = value
            else:
                run[key] = value
        predictives = {
            name: PredictiveMetrics(values.get(name, {}), notes.get(name))
            for name in [PLAIN, *sorted((values.keys() | notes.keys()) - {PLAIN})]
        }
        return cls(predictives, run)
