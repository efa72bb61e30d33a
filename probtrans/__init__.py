"""probtrans: transformers that estimate their own uncertainty, in Pyro.

Stochastic attention (STO-TRANS, H-STO-TRANS; Pei et al. 2022) as ``RelaxedOneHotCategorical``
sample sites, trained by SVI on an ELBO, evaluated with ``pyro.infer.Predictive`` and ArviZ.
"""

__version__ = "0.1.0"
