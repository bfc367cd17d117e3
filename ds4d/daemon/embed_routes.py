"""The embedding routes: OpenAI's POST /v1/embeddings, Ollama's POST /api/embed and
/api/embeddings. Bodies are parsed and tokenized on a worker thread; the vectors come from
the daemon's EmbeddingService (batched, no chat slot used). Every error answers in the
route's own protocol shape."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio
from quart import Response, request
from quart_trio import QuartTrio

from ds4d.api import ollama_embed, openai_embeddings
from ds4d.api.common import ApiError, refusal_error
from ds4d.api.embeddings import EmbedRequest
from ds4d.api.request_body import parse_json_body
from ds4d.chat.errors import PromptRefused, Refused, Unavailable
from ds4d.daemon.embeddings import EmbeddingService

if TYPE_CHECKING:
    from ds4d.daemon.server import Daemon

log = logging.getLogger("ds4d")

ErrorBody = Callable[[ApiError], dict[str, Any]]


def _json(
    body: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    resp = Response(json.dumps(body) + "\n", status=status, content_type="application/json")
    for k, v in (headers or {}).items():
        resp.headers[k] = v
    return resp


def _service(daemon: Daemon) -> EmbeddingService:
    service = daemon.embeddings
    if service is None:
        raise Unavailable(
            "the model is still loading"
            if not daemon.load_error
            else f"the model failed to load: {daemon.load_error}",
            retry_after_s=5,
        )
    if daemon.shutdown.is_set():
        raise Unavailable("server shutting down")
    refusal = service.refusal()
    if refusal is not None:
        raise PromptRefused(refusal, "model")
    return service


def add_embedding_routes(app: QuartTrio, daemon: Daemon) -> None:
    async def serve(
        kind: str,
        parse: Callable[[Any], EmbedRequest],
        answer: Callable[[EmbedRequest, Any, int, float], dict[str, Any]],
        error_body: ErrorBody,
    ) -> Response:
        t0 = time.perf_counter()
        try:
            data = await request.get_data(as_text=False)
            assert isinstance(data, bytes)
            req = await trio.to_thread.run_sync(lambda: parse(parse_json_body(data)))
            service = _service(daemon)
            tokens = await trio.to_thread.run_sync(service.tokenize, req)
            vectors = await service.embed(tokens)
            n_tokens = sum(len(t) for t in tokens)
            body = await trio.to_thread.run_sync(
                lambda: answer(req, vectors, n_tokens, time.perf_counter() - t0)
            )
        except (ApiError, Refused) as refused:
            err = refused if isinstance(refused, ApiError) else refusal_error(refused)
            daemon.metrics.requests[(kind, str(err.status))] += 1
            return _json(error_body(err), err.status, err.headers)
        daemon.metrics.requests[(kind, "200")] += 1
        return _json(body)

    def model_name(req: EmbedRequest) -> str:
        return req.model or daemon.model_id

    @app.post("/v1/embeddings")
    async def openai_embed() -> Response:
        return await serve(
            "embeddings",
            openai_embeddings.parse,
            lambda req, v, n, _s: openai_embeddings.response(req, v, n, model_name(req)),
            openai_embeddings.error_body,
        )

    @app.post("/api/embed")
    async def ollama_embed_route() -> Response:
        return await serve(
            "ollama_embed",
            ollama_embed.parse_embed,
            lambda req, v, n, s: ollama_embed.embed_response(req, v, n, model_name(req), s),
            ollama_embed.error_body,
        )

    @app.post("/api/embeddings")
    async def ollama_embeddings_route() -> Response:
        return await serve(
            "ollama_embeddings",
            ollama_embed.parse_embeddings,
            lambda _req, v, _n, _s: ollama_embed.embeddings_response(v),
            ollama_embed.error_body,
        )


def refuse_generation(daemon: Daemon) -> None:
    """A model made to embed (its file declares a pooling) is refused on the generation
    routes, in one line."""
    engine = daemon.engine
    if engine is not None and engine.is_embedding_model:
        raise PromptRefused(
            f"{daemon.model_id} is an embedding model: use /v1/embeddings or /api/embed", "model"
        )
