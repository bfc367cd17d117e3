"""OpenAI's POST /v1/embeddings: `input` as a string, a list of strings, a token list or a
list of token lists; `encoding_format` float or base64 (little-endian float32, what the
`openai` SDK asks for by default); `dimensions`; `usage.prompt_tokens`. An input longer
than the context is a 400 that says by how much (OpenAI has no truncation switch; ds4d's
`truncate: true` extension cuts it instead)."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from ds4d.api.common import ApiError
from ds4d.api.embeddings import (
    EmbedRequest,
    check_count,
    check_dimensions,
    check_text,
    token_list,
    with_dimensions,
)
from ds4d.api.openai_chat import error_body as error_body

ENCODINGS = ("float", "base64")


def parse(body: Any) -> EmbedRequest:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    if "input" not in body:
        raise ApiError(400, "missing required parameter 'input'", param="input")
    raw = body["input"]
    inputs: list[str | list[int]]
    if isinstance(raw, str):
        inputs = [check_text(raw, "input")]
    elif isinstance(raw, list):
        single = token_list(raw, "input")
        if single is not None:
            inputs = [single]
        else:
            inputs = []
            for i, item in enumerate(raw):
                where = f"input[{i}]"
                ids = token_list(item, where)
                inputs.append(ids if ids is not None else check_text(item, where))
    else:
        raise ApiError(400, "input must be a string, an array of strings, an array of token"
                       " ids or an array of arrays of token ids", param="input")  # fmt: skip
    model = body.get("model", "")
    if not isinstance(model, str):
        raise ApiError(400, "model must be a string", param="model")
    encoding = body.get("encoding_format", "float")
    if encoding is None:
        encoding = "float"
    if encoding not in ENCODINGS:
        raise ApiError(400, "encoding_format must be 'float' or 'base64'",
                       param="encoding_format")  # fmt: skip
    truncate = body.get("truncate", False)
    if not isinstance(truncate, bool):
        raise ApiError(400, "truncate must be a boolean", param="truncate")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise ApiError(400, "user must be a string", param="user")
    return EmbedRequest(
        inputs=check_count(inputs, "input"),
        model=model,
        dimensions=check_dimensions(body.get("dimensions")),
        truncate=truncate,
        encoding_format=encoding,
    )


def response(req: EmbedRequest, vectors: np.ndarray, n_tokens: int, model: str) -> dict[str, Any]:
    vectors = with_dimensions(vectors, req.dimensions, "dimensions")
    data = []
    for i, vec in enumerate(vectors):
        value: Any
        if req.encoding_format == "base64":
            value = base64.b64encode(vec.astype("<f4").tobytes()).decode("ascii")
        else:
            value = vec.tolist()
        data.append({"object": "embedding", "index": i, "embedding": value})
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }
