"""Every private name of a dependency that probtrans uses, fenced in one module per dependency
with the versions it was checked against: :mod:`~probtrans.internals.pyro` and
:mod:`~probtrans.internals.transformers`."""
