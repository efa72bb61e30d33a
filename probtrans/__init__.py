"""probtrans: transformers that estimate their own uncertainty, in Pyro.

Stochastic attention (STO-TRANS, H-STO-TRANS; Pei et al. 2022), sparse Gaussian-process
attention (SGPA; Chen & Li 2023) and Probabilistic Transformers (Movellan & Gabbur 2020), trained
by SVI on an ELBO, evaluated with ``pyro.infer.Predictive`` and ArviZ. ``ARCHITECTURE.md`` maps
the package.

The Python API: :func:`fit` (a spec pair, or a model spec and a guide → a run folder),
:func:`compare_guides` (guides given in Python × seeds → table, figure, ``arviz.compare``; not
``compare``, the name of the command's module), :class:`Run` (``Run.load``, ``.predict``,
``.module``, ``.posterior_samples``), :func:`self_guided` (your own model, ready for a guide),
:class:`DataBundle` (in-memory data), :func:`swap_attention` (probtrans attention in a
pretrained Hugging Face model), :func:`to_inference_data` (your own model and guide → ArviZ
InferenceData, laid out as a run's ``predictive.nc``), the metrics on your own arrays —
:func:`ece`, :func:`ood_detection` (one score, in- vs out-of-domain), :func:`ood_report` (every
score of the class probabilities), :func:`heldout_elpd` — and the layers in :mod:`probtrans.nn`.
Importing probtrans loads none of them until one is used, and changes nothing in Pyro's settings
(nor Python's ``random``, which a dependency draws from on import).
"""

from __future__ import annotations

import importlib
import random
from typing import Any

__version__ = "0.1.0"

#: public name → the module that defines it (imported on first use)
_API = {
    "fit": "probtrans.runs",
    "compare_guides": "probtrans.runs.guide_comparison",
    "Run": "probtrans.runs",
    "self_guided": "probtrans.inference.objective",
    "DataBundle": "probtrans.data",
    "swap_attention": "probtrans.backbone.swap",
    "to_inference_data": "probtrans.inference.arviz_data",
    "ece": "probtrans.analysis.metrics",
    "ood_detection": "probtrans.analysis.metrics",
    "ood_report": "probtrans.analysis.metrics",
    "heldout_elpd": "probtrans.analysis.elpd",
}

__all__ = [*_API, "nn", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "nn":
        return _imported("probtrans.nn")
    if name not in _API:
        raise AttributeError(f"module 'probtrans' has no attribute {name!r}")
    return getattr(_imported(_API[name]), name)


def _imported(module: str) -> Any:
    """``module``, imported with Python's ``random`` left as it was: a dependency imported on
    the way may draw from it (scikit-learn's progress bars import ``rich``, which does)."""
    state = random.getstate()
    try:
        return importlib.import_module(module)
    finally:
        random.setstate(state)
