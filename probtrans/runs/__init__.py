"""The run layer: fit a model spec with an inference spec, evaluate it, and keep everything in
one folder; read it back as a :class:`Run`; compare runs; describe a model.

- :mod:`~probtrans.runs.folder` — the folder's files, the staging folder, ``timing.json``,
  :class:`~probtrans.runs.folder.RunInfo`, the run's saved data;
- :mod:`~probtrans.runs.kept` — ``probs.npz`` and ``feature_scores.npz``, checked against the
  run's checkpoint;
- :mod:`~probtrans.runs.run` — :class:`Run`, the public object, and :func:`load_run`;
- :mod:`~probtrans.runs.network` — the trained network as a plain module (``Run.module()``);
- :mod:`~probtrans.runs.prediction` — the columns of a prediction, written as they come;
- :mod:`~probtrans.runs.evaluation` — :func:`evaluate` (one draw of the posterior) and
  :func:`evaluate_run`;
- :mod:`~probtrans.runs.fitting` — :func:`fit`;
- :mod:`~probtrans.runs.compare` — ``probtrans compare``: methods × seeds → table, CSV, figure;
- :mod:`~probtrans.runs.guide_comparison` — ``probtrans.compare_guides``: guides given in
  Python × seeds;
- :mod:`~probtrans.runs.describe` — ``probtrans describe``: a model spec's Pyro sample sites.
"""

from probtrans.runs.evaluation import evaluate_run
from probtrans.runs.fitting import fit
from probtrans.runs.run import Run, load_run

__all__ = ["Run", "evaluate_run", "fit", "load_run"]
