"""Ollama's POST /api/embed (`input` a string or a list of strings; `truncate`, on by
default; `dimensions`; `keep_alive`, as for generation; `options` accepted) and
its older POST /api/embeddings (`prompt`, one vector). Vectors are L2-normalised, and
normalised again after a `dimensions` cut, as Ollama's are. An empty input asks for no
vector (Ollama's way of loading a model): an empty answer. Errors are Ollama's
`{"error": "..."}`."""

from __future__ import annotations

from typing import Any

import numpy as np

from ds4d.api.common import ApiError
from ds4d.api.embeddings import (
    EmbedRequest,
    check_count,
    check_dimensions,
    check_text,
    with_dimensions,
)
from ds4d.api.ollama import keep_alive_seconds


def error_body(err: ApiError) -> dict[str, Any]:
    return {"error": err.message}


def _common(body: Any) -> tuple[str, dict[str, Any], float | None]:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model", "")
    if not isinstance(model, str):
        raise ApiError(400, "model must be a string", param="model")
    options = body.get("options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "options must be an object", param="options")
    return model, options or {}, keep_alive_seconds(body.get("keep_alive"))


def parse_embed(body: Any) -> EmbedRequest:
    model, _options, keep_alive_s = _common(body)
    raw = body.get("input")
    inputs: list[str | list[int]]
    if raw is None or raw == "":
        inputs = []
    elif isinstance(raw, str):
        inputs = [raw]
    elif isinstance(raw, list):
        inputs = [check_text(item, f"input[{i}]") for i, item in enumerate(raw)]
        check_count(inputs, "input")
    else:
        raise ApiError(400, "input must be a string or an array of strings", param="input")
    truncate = body.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ApiError(400, "truncate must be a boolean", param="truncate")
    return EmbedRequest(
        inputs=inputs,
        model=model,
        dimensions=check_dimensions(body.get("dimensions")),
        truncate=truncate,
        keep_alive_s=keep_alive_s,
    )


def parse_embeddings(body: Any) -> EmbedRequest:
    """The older single form: `prompt`, always truncated."""
    model, _options, keep_alive_s = _common(body)
    prompt = body.get("prompt", "")
    if not isinstance(prompt, str):
        raise ApiError(400, "prompt must be a string", param="prompt")
    return EmbedRequest(inputs=[prompt] if prompt else [], model=model, truncate=True,
                        param="prompt", keep_alive_s=keep_alive_s)  # fmt: skip


def embed_response(
    req: EmbedRequest, vectors: np.ndarray, n_tokens: int, model: str, seconds: float
) -> dict[str, Any]:
    vectors = with_dimensions(vectors, req.dimensions, "dimensions")
    return {
        "model": model,
        "embeddings": [v.tolist() for v in vectors],
        "total_duration": int(seconds * 1e9),
        "load_duration": 0,
        "prompt_eval_count": n_tokens,
    }


def embeddings_response(vectors: np.ndarray) -> dict[str, Any]:
    return {"embedding": vectors[0].tolist() if len(vectors) else []}
