"""Inference: the ELBO with self-guided attention (:mod:`~probtrans.inference.objective`),
guides made ready (:mod:`~probtrans.inference.guide_builder`), SVI training
(:mod:`~probtrans.inference.train`), the posterior predictive
(:mod:`~probtrans.inference.predictive`) and its post-hoc variants
(:mod:`~probtrans.inference.posthoc`, :mod:`~probtrans.inference.laplace`)."""
