"""Why a request is refused, in protocol-neutral terms.

The daemon (the engine loop, prompt preparation, the HTTP face) raises these; `ds4d.api` alone turns
them into `ApiError`, each protocol's error shape (`ds4d.api.common.refusal_error`), so
no layer below the API decides what an HTTP error looks like.
"""

from __future__ import annotations


class Refused(Exception):
    """A request the server will not run; `message` is what the client is told."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class PromptRefused(Refused):
    """The prompt cannot be run as sent (the chat template refused the conversation, or
    it renders to no tokens); `param` names the request field it came from."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class ContextExceeded(PromptRefused):
    """The prompt does not fit the configured context: `size` of it, counted in `unit`
    ("tokens", or "bytes" when it was refused before tokenizing), against `n_ctx` tokens."""

    def __init__(self, message: str, param: str, *, size: int, unit: str, n_ctx: int) -> None:
        super().__init__(message, param)
        self.size = size
        self.unit = unit
        self.n_ctx = n_ctx


class Overloaded(Refused):
    """Every slot is busy and the wait queue is full: retry after `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Unavailable(Refused):
    """The server cannot take requests now (model loading or failed, shutting down);
    `retry_after_s` when it is worth retrying."""

    def __init__(self, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class UnknownModel(Refused):
    """The request names a model this server does not have; `known` are the names it has."""

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(f"model '{name}' not found; this server has: {', '.join(known)}")
        self.name = name
        self.known = known
