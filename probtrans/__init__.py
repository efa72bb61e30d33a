"""probtrans: transformers that estimate their own uncertainty, in Pyro.

Stochastic attention (STO-TRANS, H-STO-TRANS; Pei et al. 2022), sparse Gaussian-process
attention (SGPA; Chen & Li 2023) and Probabilistic Transformers (Movellan & Gabbur 2020), trained
by SVI on an ELBO, evaluated with ``pyro.infer.Predictive`` and ArviZ. ``ARCHITECTURE.md`` maps
the package; importing it loads nothing but this version string.
"""

__version__ = "0.1.0"
