"""probtrans: transformers that estimate their own uncertainty, in Pyro.

Stochastic attention (STO-TRANS, H-STO-TRANS; Pei et al. 2022) as ``RelaxedOneHotCategorical``
sample sites, trained by SVI on an ELBO, evaluated with ``pyro.infer.Predictive`` and ArviZ.
"""

import pyro

__version__ = "0.1.0"

# Every model and guide keeps its parameters in its own PyroModule, not in Pyro's global param
# store keyed by name: two classifiers or guides in one process never share parameters.
pyro.settings.set(module_local_params=True)
