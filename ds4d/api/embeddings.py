"""What the embedding APIs share: the neutral request (`EmbedRequest`) the daemon serves,
the checks every protocol makes of its inputs, and the `dimensions` truncation.

The protocol modules (openai_embeddings.py, ollama_embed.py) turn their JSON into an
`EmbedRequest` and the vectors back into their JSON; ds4d.daemon.embeddings computes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ds4d.api.common import ApiError

# One request's inputs at most: every input is a forward pass, and a client that indexes
# a codebase sends them in batches of tens to a few hundred.
MAX_INPUTS = 2048


@dataclass
class EmbedRequest:
    """Inputs as texts or token ids (each a non-empty list), in order."""

    inputs: list[str | list[int]]
    model: str = ""
    dimensions: int | None = None  # keep the first `dimensions` values, normalised again
    truncate: bool = False  # an input longer than the context is cut to it, not refused
    encoding_format: str = "float"
    param: str = "input"  # the request field the inputs came from, for errors
    keep_alive_s: float | None = None  # Ollama's: how long the model stays loaded after
    extra: dict[str, Any] = field(default_factory=dict)


def token_list(value: Any, where: str) -> list[int] | None:
    """value as token ids when it is a non-empty list of integers, None when it is not a
    list of integers at all; ApiError for an empty list or a negative id."""
    if not isinstance(value, list):
        return None
    if not value:
        raise ApiError(400, f"{where} is an empty array", param=where)
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return None
    if any(t < 0 for t in value):
        raise ApiError(400, f"{where} holds a negative token id", param=where)
    return list(value)


def check_text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ApiError(400, f"{where} must be a string", param=where)
    if not value:
        raise ApiError(400, f"{where} is an empty string; nothing to embed", param=where)
    return value


def check_count(inputs: list[str | list[int]], where: str) -> list[str | list[int]]:
    if not inputs:
        raise ApiError(400, f"{where} is an empty array; nothing to embed", param=where)
    if len(inputs) > MAX_INPUTS:
        raise ApiError(400, f"{where} holds {len(inputs)} inputs; at most {MAX_INPUTS}",
                       param=where)  # fmt: skip
    return inputs


def check_dimensions(value: Any, param: str = "dimensions") -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ApiError(400, f"{param} must be a positive integer", param=param)
    return value


def with_dimensions(vectors: np.ndarray, dimensions: int | None, param: str) -> np.ndarray:
    """The vectors cut to their first `dimensions` values and L2-normalised again (as
    Ollama does, and as a shortened OpenAI embedding is returned); ApiError when the
    model's vectors are shorter."""
    if dimensions is None or dimensions == vectors.shape[1]:
        return vectors
    if dimensions > vectors.shape[1]:
        raise ApiError(
            400,
            f"{param} {dimensions} is more than this model's {vectors.shape[1]} dimensions",
            param=param,
        )
    cut = vectors[:, :dimensions].astype(np.float64)
    norms = np.sqrt((cut * cut).sum(axis=1, keepdims=True))
    return (cut / np.where(norms > 0, norms, 1.0)).astype(np.float32)
