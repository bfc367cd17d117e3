"""Errors the engine raises for expected failures (bad files, bad input)."""


class EngineError(Exception):
    """An expected failure with a one-line, user-facing message (no traceback needed)."""


class ModelLoadError(EngineError):
    """The GGUF cannot be used: missing, truncated, not GGUF, or of an unsupported kind."""


class ContextFullError(EngineError):
    """A session was asked to hold more tokens than its n_ctx."""
