"""Analysis of predictive arrays (numpy, scikit-learn, matplotlib; no model): the metrics and
their registries, the expected log predictive density, temperature scaling, the metrics of one
predictive (a ``metrics.json`` row), the terminal tables, the figures, and the feature-space
uncertainty scores. Importing the package loads none of them."""
