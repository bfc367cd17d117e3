"""The embedding routes: OpenAI's POST /v1/embeddings, Ollama's POST /api/embed and
/api/embeddings. Bodies are parsed and tokenized on a worker thread; the vectors come from
the model's EmbeddingService (batched, no chat slot used); the model the request names is
held loaded meanwhile. Every error answers in the
route's own protocol shape."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import trio
from quart import Response, request
from quart_trio import QuartTrio

from ds4d.api import ollama_embed, openai_embeddings
from ds4d.api.common import ApiError, refusal_error
from ds4d.api.embeddings import EmbedRequest
from ds4d.api.request_body import parse_json_body
from ds4d.chat.errors import PromptRefused, Refused
from ds4d.daemon.embeddings import EmbeddingService
from ds4d.daemon.served import ServedModel
from ds4d.daemon.server import Daemon, _require_ready

log = logging.getLogger("ds4d")

ErrorBody = Callable[[ApiError], dict[str, Any]]


def _json(
    body: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    resp = Response(json.dumps(body) + "\n", status=status, content_type="application/json")
    for k, v in (headers or {}).items():
        resp.headers[k] = v
    return resp


def _vectors_of(served: ServedModel) -> EmbeddingService:
    service = served.embeddings
    refusal = service.refusal()
    if refusal is not None:
        raise PromptRefused(refusal, "model")
    return service


def add_embedding_routes(app: QuartTrio, daemon: Daemon) -> None:
    async def serve(
        kind: str,
        parse: Callable[[Any], EmbedRequest],
        answer: Callable[[EmbedRequest, Any, int, str, float], dict[str, Any]],
        error_body: ErrorBody,
    ) -> Response:
        t0 = time.perf_counter()
        try:
            data = await request.get_data(as_text=False)
            assert isinstance(data, bytes)
            req = await trio.to_thread.run_sync(lambda: parse(parse_json_body(data)))
            # the model is held (not unloaded) until its vectors are out
            lease = await _require_ready(daemon).acquire(req.model)
            try:
                service = _vectors_of(lease.model)
                tokens = await trio.to_thread.run_sync(service.tokenize, req)
                vectors = await service.embed(tokens)
            finally:
                lease.release(req.keep_alive_s)
            n_tokens = sum(len(t) for t in tokens)
            name = req.model or lease.name
            body = await trio.to_thread.run_sync(
                lambda: answer(req, vectors, n_tokens, name, time.perf_counter() - t0)
            )
        except (ApiError, Refused) as refused:
            err = refused if isinstance(refused, ApiError) else refusal_error(refused)
            daemon.metrics.requests[(kind, str(err.status))] += 1
            return _json(error_body(err), err.status, err.headers)
        daemon.metrics.requests[(kind, "200")] += 1
        return _json(body)

    @app.post("/v1/embeddings")
    async def openai_embed() -> Response:
        return await serve(
            "embeddings",
            openai_embeddings.parse,
            lambda req, v, n, name, _s: openai_embeddings.response(req, v, n, name),
            openai_embeddings.error_body,
        )

    @app.post("/api/embed")
    async def ollama_embed_route() -> Response:
        return await serve(
            "ollama_embed",
            ollama_embed.parse_embed,
            lambda req, v, n, name, s: ollama_embed.embed_response(req, v, n, name, s),
            ollama_embed.error_body,
        )

    @app.post("/api/embeddings")
    async def ollama_embeddings_route() -> Response:
        return await serve(
            "ollama_embeddings",
            ollama_embed.parse_embeddings,
            lambda _req, v, _n, _name, _s: ollama_embed.embeddings_response(v),
            ollama_embed.error_body,
        )
