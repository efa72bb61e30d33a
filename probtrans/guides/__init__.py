"""The guides probtrans names in an inference spec: :mod:`~probtrans.guides.weights` (the
registry of weight guides: delta, normal, lowrank) and :mod:`~probtrans.guides.inducing` (the
registry of guides for SGPA's whitened inducing variables). They are built for a classifier by
:func:`probtrans.inference.guide_builder.build_guide`."""
