"""Named implementations that specs choose from: one :class:`Registry` per extension point.

The registries live next to what they register: attention kinds
(:data:`probtrans.attention.ATTENTION`), weight guides (:data:`probtrans.guides.weights.GUIDES`),
inducing-variable guides (:data:`probtrans.guides.inducing.INDUCING_GUIDES`), data sources
(:data:`probtrans.data.sources.DATA_SOURCES`), metrics (:data:`probtrans.analysis.metrics.METRICS`),
uncertainty scores (:data:`probtrans.analysis.metrics.UNCERTAINTY_SCORES`), feature scores
(:data:`probtrans.analysis.feature_scores.FEATURE_SCORES`) and post-hoc predictives
(:data:`probtrans.specs.inference.POSTHOC`, below the module that registers them). A spec holds
only the name;
:mod:`probtrans.resolve` checks every name of a spec against its registry.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from probtrans.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Names → implementations of one kind (``what``: e.g. ``"guide"``).

    ``builtins``: the modules that register built-in entries from a layer above the registry's
    (the feature-space scores register uncertainty scores), imported when the registry is
    first read, so that every reader sees them."""

    def __init__(self, what: str, builtins: tuple[str, ...] = ()) -> None:
        self.what = what
        self._entries: dict[str, T] = {}
        self._builtins = builtins

    def _load_builtins(self) -> None:
        modules, self._builtins = self._builtins, ()  # once; their registrations come back here
        for module in modules:
            importlib.import_module(module)

    def register(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.what} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def get(self, name: str, field: str) -> T:
        """The entry called ``name``; ``field`` says where the name came from, e.g.
        ``"inference/map.toml: guide.name"``, for the error an unknown name raises."""
        self._load_builtins()
        if name not in self._entries:
            raise ConfigError(
                f"{field} = {name!r}: unknown {self.what} (known: {', '.join(self.names())})"
            )
        return self._entries[name]

    def names(self) -> list[str]:
        """The names, sorted (for messages and the schema's choices)."""
        self._load_builtins()
        return sorted(self._entries)

    def entries(self) -> list[T]:
        """The entries in the order they were registered."""
        self._load_builtins()
        return list(self._entries.values())

    def items(self) -> list[tuple[str, T]]:
        """(name, entry) in the order they were registered."""
        self._load_builtins()
        return list(self._entries.items())

    def __iter__(self) -> Iterator[str]:
        """The names in the order they were registered."""
        self._load_builtins()
        return iter(self._entries)

    def __len__(self) -> int:
        self._load_builtins()
        return len(self._entries)

    @contextmanager
    def restored(self) -> Iterator[None]:
        """A ``with`` block after which the registry holds again what it held before: what a
        plugin's test registers inside it is forgotten."""
        self._load_builtins()
        saved = dict(self._entries)
        try:
            yield
        finally:
            self._entries = saved
