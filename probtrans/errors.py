"""User-facing errors: one clear message naming the file, field or shape."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class ProbtransError(Exception):
    """A problem with the user's input (spec, file, data); the CLI prints it without a traceback."""


class ConfigError(ProbtransError):
    """A model or inference spec is invalid; the message names the file and the field."""


@contextmanager
def in_file(source: str) -> Iterator[None]:
    """Start the message of a ConfigError raised inside the block with ``source`` (the spec
    file) unless it already does, e.g. a data loader's ``data.patch_size = 3: ...``."""
    try:
        yield
    except ConfigError as err:
        if str(err).startswith(f"{source}:"):
            raise
        raise ConfigError(f"{source}: {err}") from None
