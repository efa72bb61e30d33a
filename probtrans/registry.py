"""Named implementations that specs choose from: one :class:`Registry` per extension point.

The registries live next to what they register: attention kinds
(:data:`probtrans.attention.ATTENTION`), weight guides (:data:`probtrans.guides.GUIDES`),
inducing-variable guides (:data:`probtrans.gp.guides.INDUCING_GUIDES`), data sources
(:data:`probtrans.data.sources.DATA_SOURCES`), metrics (:data:`probtrans.metrics.METRICS`) and
uncertainty scores (:data:`probtrans.metrics.UNCERTAINTY_SCORES`). A spec holds only the name;
:mod:`probtrans.resolve` checks every name of a spec against its registry.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from probtrans.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Names → implementations of one kind (``what``: e.g. ``"guide"``)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.what} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def get(self, name: str, field: str) -> T:
        """The entry called ``name``; ``field`` says where the name came from, e.g.
        ``"inference/map.toml: guide.name"``, for the error an unknown name raises."""
        if name not in self._entries:
            raise ConfigError(
                f"{field} = {name!r}: unknown {self.what} (known: {', '.join(self.names())})"
            )
        return self._entries[name]

    def names(self) -> list[str]:
        """The names, sorted (for messages and the schema's choices)."""
        return sorted(self._entries)

    def entries(self) -> list[T]:
        """The entries in the order they were registered."""
        return list(self._entries.values())

    def __iter__(self) -> Iterator[str]:
        """The names in the order they were registered."""
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    @contextmanager
    def restored(self) -> Iterator[None]:
        """A ``with`` block after which the registry holds again what it held before: what a
        plugin's test registers inside it is forgotten."""
        saved = dict(self._entries)
        try:
            yield
        finally:
            self._entries = saved
