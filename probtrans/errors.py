"""User-facing errors: one clear message naming the file, field or shape."""


class ProbtransError(Exception):
    """A problem with the user's input (spec, file, data); the CLI prints it without a traceback."""


class ConfigError(ProbtransError):
    """A model or inference spec is invalid; the message names the file and the field."""
