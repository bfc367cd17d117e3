"""The daemon's state and its HTTP face (Quart on Hypercorn's trio worker).

`Daemon` owns the engine, the slots, the metrics and the config; the admin channel and
other control-plane parts read it through `status()` / `slots()` / `stop()`.
`create_app(daemon)` builds the Quart app: one handler per route, each protocol module
doing the translation, the model's `ds4d.serving.model.ModelServer` doing the work.
"""

from __future__ import annotations

import functools
import hmac
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import trio
from quart import Response, has_request_context, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from ds4d.api import (
    anthropic_messages,
    infill,
    openai_chat,
    openai_completions,
    openai_responses,
)
from ds4d.api.common import (
    ApiError,
    ApiProtocol,
    Completion,
    EventStream,
    force_tool_choice,
    refusal_error,
)
from ds4d.api.request_body import parse_json_body
from ds4d.chat.errors import Overloaded, Refused, Unavailable
from ds4d.chat.fim import assemble_request
from ds4d.chat.formats import chat_format_for
from ds4d.chat.types import ChatRequest, Finish, Sampling
from ds4d.daemon import wire
from ds4d.daemon.config import Config, model_path
from ds4d.daemon.metrics import Gauge, GaugeValue, Metrics
from ds4d.daemon.state_config import state_from_config
from ds4d.engine.engine import Engine
from ds4d.serving.gate import ComputeGate, Pace
from ds4d.serving.model import ModelServer
from ds4d.serving.prompt import Prepared
from ds4d.state.service import CacheView, StateService
from ds4d.state.slots import Slot
from ds4d.state.trace import TraceWriter

log = logging.getLogger("ds4d")

CREATED = 1767225600


class _StateMetrics:
    """The state layer's series once the model is loaded (none before)."""

    def __init__(self, daemon: Daemon) -> None:
        self._daemon = daemon

    def metrics_lines(self) -> list[str]:
        state = self._daemon.state
        return state.metrics_lines() if state is not None else []


class Daemon:
    def __init__(self, config: Config, pace: Pace | None = None) -> None:
        """`pace`: the power governor's rest after each engine step (the control plane's)."""
        self.config = config
        self.started = time.time()
        self.engine: Engine | None = None
        self.model: ModelServer | None = None  # set once the model is loaded and served
        self.metrics = Metrics(self._gauges(), sources=[_StateMetrics(self)])
        self.ctx = 0
        self.model_id = ""
        self.load_error: str | None = None
        self.shutdown = trio.Event()
        self.gate = ComputeGate(pace)  # every model's engine loop takes turns through it
        # State layer (disk KV cache, tool replay, trace): built once the model is known;
        # the trace writer and the cache view exist earlier for the control plane.
        self.state: StateService | None = None
        self.trace = TraceWriter()
        self.cache_view = CacheView(lambda: self.state.disk if self.state else None)

    def reload_config(self, config: Config) -> None:
        """Live reload: the keys marked reloadable take effect from the next request."""
        self.config = config

    @property
    def busy(self) -> int:
        return self.model.busy if self.model is not None else 0

    @property
    def waiting(self) -> int:
        return self.model.waiting if self.model is not None else 0

    def _slots(self) -> list[Slot]:
        return self.model.pool.slots if self.model is not None else []

    def _gauges(self) -> list[Gauge]:
        def per_slot(read: Callable[[Slot], int]) -> Callable[[], GaugeValue]:
            def value() -> GaugeValue:
                return {f'slot="{s.index}"': read(s) for s in self._slots()}

            return value

        return [
            Gauge("ds4d_requests_running", "requests generating on a slot",
                  lambda: self.busy),
            Gauge("ds4d_requests_waiting", "requests queued for a slot",
                  lambda: self.waiting),
            Gauge("ds4d_slot_busy", "1 while the slot runs a request",
                  per_slot(lambda s: int(s.busy))),
            Gauge("ds4d_slot_tokens", "tokens held in the slot's KV",
                  per_slot(lambda s: s.session.n_tokens)),
            Gauge("ds4d_model_loaded", "1 once the model is loaded",
                  lambda: int(self.model is not None)),
        ]  # fmt: skip

    @property
    def ready(self) -> bool:
        return self.model is not None

    # -- model loading (outside ASGI startup: it can take longer than its timeout) --------

    async def run_model(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Load the model, then serve it: its engine loop runs until the daemon's nursery
        is cancelled. Reports started once requests are served; raises if loading fails."""
        try:
            model = await self.load_model()
        except Exception as e:
            self.load_error = str(e)  # /health and 503s say why
            raise
        async with trio.open_nursery() as nursery:
            await nursery.start(model.run)
            self.model = model  # ready: requests are served from here on
            task_status.started()

    async def load_model(self) -> ModelServer:
        from ds4d.engine import Engine

        cfg = self.config
        path = model_path(cfg)  # `~` expanded, or the embedded default model
        log.info("loading model %s", path)
        t0 = time.perf_counter()
        threads = cfg.threads or None
        engine = await trio.to_thread.run_sync(
            lambda: Engine.open(
                path,
                threads,
                cfg.kv_type,
                rope_scaling=cfg.rope_scaling,
                n_ctx=cfg.ctx,
                weights=cfg.weights,
                precision=cfg.precision,
            )
        )
        info = engine.info
        ctx = cfg.ctx or info.n_ctx_train
        if info.rope_stretch:
            log.info("RoPE positions stretched with %s", info.rope_stretch)
        elif ctx > info.n_ctx_train:
            hint = (
                "the file's own RoPE scaling is kept"
                if cfg.rope_scaling
                else "--rope-scaling yarn stretches the positions to --ctx"
            )
            log.warning(
                "--ctx %d is above the model's trained context %d: quality may drop past it (%s)",
                ctx,
                info.n_ctx_train,
                hint,
            )
        log.info(
            "model %s (%s, %s) mapped in %.1fs; creating %d slots of %d tokens",
            info.name,
            info.architecture,
            info.quant,
            time.perf_counter() - t0,
            cfg.slots,
            ctx,
        )
        sessions = []
        for i in range(cfg.slots):
            sessions.append(await trio.to_thread.run_sync(engine.new_session, ctx))
            log.info("slot %d/%d ready", i + 1, cfg.slots)
        self.engine = engine
        self.ctx = ctx
        self.model_id = Path(info.path).stem if info.path else info.name
        slots = [Slot(i, s, ctx) for i, s in enumerate(sessions)]
        # the disk cache's scan reads every checkpoint's header: on a worker
        state = self.state = await trio.to_thread.run_sync(
            lambda: state_from_config(
                cfg, engine=engine, ctx=ctx, trace=self.trace, current=lambda: self.config
            )
        )
        model = ModelServer(
            engine,
            chat_format_for(engine, ctx),
            ctx,
            slots,
            state,
            self.gate,
            self.metrics,
            completion_slots=cfg.completion_slots,
            queue_size=cfg.queue_size,
            chunk_target_s=cfg.prefill_chunk_ms / 1000,
        )
        log.info("model loaded in %.1fs; serving", time.perf_counter() - t0)
        return model

    # -- what the admin channel reads ------------------------------------------------------

    def status(self) -> dict[str, Any]:
        info = self.engine.info if self.engine is not None else None
        return {
            "model": self.model_id or None,
            "model_path": info.path if info else None,
            "loaded": self.ready,
            "ctx": self.ctx,
            "uptime_s": round(time.time() - self.started, 1),
            "pid": os.getpid(),
            "http": f"{self.config.host}:{self.config.port}",
            "slots": {
                "total": len(self._slots()) if self.model else self.config.slots,
                "busy": self.busy,
            },
            "queue": {
                "waiting": self.waiting,
                "limit": self.config.queue_size,
            },
        }

    def decode_batching(self) -> dict[str, int | float | None]:
        return self.metrics.decode_batching()

    def slots(self) -> list[dict[str, Any]]:
        return [s.describe() for s in self._slots()]

    async def stop(self) -> None:
        self.shutdown.set()

    def save_on_shutdown(self) -> int:
        """After draining: every slot worth keeping becomes a `shutdown` KV checkpoint."""
        if self.state is None or self.model is None:
            return 0
        return self.state.shutdown([s.session for s in self._slots()])

    def model_object(self, model_id: str | None = None) -> dict[str, Any]:
        return {
            "id": model_id or self.model_id,
            "object": "model",
            "created": CREATED,
            "owned_by": "ds4d",
            "context_length": self.ctx,
            "max_model_len": self.ctx,
        }


PROTOCOLS: dict[str, tuple[ApiProtocol, str]] = {
    "chat": (openai_chat, "messages"),
    "completions": (openai_completions, "prompt"),
    "responses": (openai_responses, "input"),
    "messages": (anthropic_messages, "messages"),
    "infill": (infill, "input_prefix"),
}


def _protocol_for_path(path: str) -> ApiProtocol:
    if path.startswith("/infill"):
        return infill
    return anthropic_messages if path.startswith("/v1/messages") else openai_chat


def _request_line() -> tuple[str, str]:
    if not has_request_context():
        return "?", "?"
    return request.method, request.path


def error_response(err: ApiError, protocol: ApiProtocol | None = None) -> Response:
    protocol = protocol or _protocol_for_path(_request_line()[1])
    resp = Response(
        json.dumps(protocol.error_body(err)) + "\n",
        status=err.status,
        content_type="application/json",
    )
    for k, v in err.headers.items():
        resp.headers[k] = v
    return resp


def create_app(daemon: Daemon) -> QuartTrio:
    """The HTTP app: error handlers, the API-key check, the informational routes and the
    four generation APIs, each group added by its own function below."""
    app = QuartTrio("ds4d")
    app.config["MAX_CONTENT_LENGTH"] = daemon.config.max_body_bytes
    app.config["RESPONSE_TIMEOUT"] = None  # generations take as long as they take
    app.config["BODY_TIMEOUT"] = 120
    app.asgi_app = wire.wrap(app.asgi_app)  # type: ignore[method-assign]
    _add_error_handlers(app, daemon)
    _add_api_key_check(app, daemon)
    _add_info_routes(app, daemon)
    _add_generation_routes(app, daemon)
    return app


def _require_ready(daemon: Daemon) -> ModelServer:
    """The model's server, or a 503 while the model loads (or failed to) and during shutdown."""
    if daemon.model is None:
        raise Unavailable(
            "the model is still loading"
            if not daemon.load_error
            else f"the model failed to load: {daemon.load_error}",
            retry_after_s=5,
        )
    if daemon.shutdown.is_set():
        raise Unavailable("server shutting down")
    return daemon.model


def _add_error_handlers(app: QuartTrio, daemon: Daemon) -> None:
    """Every error answers in the protocol's JSON shape; none leaks exception text."""

    @app.errorhandler(ApiError)
    async def on_api_error(err: ApiError) -> Response:
        return error_response(err)

    @app.errorhandler(Refused)
    async def on_refused(err: Refused) -> Response:
        return error_response(refusal_error(err))

    @app.errorhandler(HTTPException)
    async def on_http_error(err: HTTPException) -> Response:
        status = err.code or 500
        method, path = _request_line()
        message = {
            404: f"unknown endpoint {method} {path}",
            405: f"method {method} not allowed on {path}",
            413: f"request body larger than {daemon.config.max_body_bytes} bytes",
        }.get(status, err.name)
        kind = "invalid_request_error" if status < 500 else "server_error"
        return error_response(ApiError(status, message, kind=kind))

    @app.errorhandler(Exception)
    async def on_unexpected(err: Exception) -> Response:
        # The traceback goes to the log; the client learns only that it was our fault.
        method, path = _request_line()
        log.exception("unhandled error in %s %s", method, path)
        return error_response(
            ApiError(500, "internal error (details are in the server log)", kind="server_error")
        )


def _add_api_key_check(app: QuartTrio, daemon: Daemon) -> None:
    """With api_keys configured, every route but / and /health needs one of them."""

    @app.before_request
    async def check_api_key() -> Response | None:
        keys = daemon.config.api_keys
        if not keys or request.path in ("/", "/health") or request.method == "OPTIONS":
            return None
        auth = request.headers.get("Authorization", "")
        given = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        given = given or request.headers.get("x-api-key")
        if given and any(hmac.compare_digest(given.encode(), k.encode()) for k in keys):
            return None
        return error_response(
            ApiError(
                401,
                "invalid or missing API key (send 'Authorization: Bearer KEY' or 'x-api-key: KEY')",
                kind="authentication_error",
                code="invalid_api_key",
            )
        )


def _add_info_routes(app: QuartTrio, daemon: Daemon) -> None:
    """/, /health, /metrics and the model list."""

    @app.route("/", methods=["GET", "HEAD"])
    async def root() -> Response:
        return Response(
            json.dumps({"name": "ds4d", "model": daemon.model_id or None}),
            content_type="application/json",
        )

    @app.get("/health")
    async def health() -> Response:
        if daemon.ready:
            body, status = {"status": "ok", "model": daemon.model_id}, 200
        elif daemon.load_error:
            body, status = {"status": "error", "error": daemon.load_error}, 503
        else:
            body, status = {"status": "loading"}, 503
        return Response(json.dumps(body), status=status, content_type="application/json")

    @app.get("/metrics")
    async def metrics() -> Response:
        # the daemon's own series where they change; the disk cache's read off the loop
        own = daemon.metrics.own_lines()
        rest = await trio.to_thread.run_sync(daemon.metrics.source_lines)
        return Response(
            "\n".join(own + rest) + "\n", content_type="text/plain; version=0.0.4; charset=utf-8"
        )

    @app.get("/v1/models")
    async def models() -> Response:
        data = [daemon.model_object()] if daemon.ready else []
        return Response(
            json.dumps({"object": "list", "data": data}), content_type="application/json"
        )

    @app.get("/v1/models/<path:model_id>")
    async def model(model_id: str) -> Response:
        # Any name is an alias of the loaded model.
        _require_ready(daemon)
        return Response(json.dumps(daemon.model_object(model_id)), content_type="application/json")


def _add_generation_routes(app: QuartTrio, daemon: Daemon) -> None:
    """The four generation APIs (and Anthropic's token count): parse off the event loop,
    prepare and queue a job, then stream or collect its events."""

    def defaults() -> Sampling:
        c = daemon.config
        return Sampling(temperature=c.temperature, top_p=c.top_p, top_k=c.top_k, min_p=c.min_p)

    async def _parsed(parse: Callable[[Any, Sampling], ChatRequest]) -> ChatRequest:
        """The body read, decoded and translated on a worker thread: a large request
        must not hold the event loop (other requests, /health) while it is parsed."""
        data = await request.get_data(as_text=False)
        assert isinstance(data, bytes)  # as_text=False: the raw body
        sampling = defaults()
        return await trio.to_thread.run_sync(lambda: parse(parse_json_body(data), sampling))

    @app.post("/v1/messages/count_tokens")
    async def count_tokens() -> Response:
        gen = _require_ready(daemon)
        req = await _parsed(functools.partial(anthropic_messages.parse, count_only=True))
        n = await trio.to_thread.run_sync(gen.count_tokens, req)
        return Response(json.dumps({"input_tokens": n}), content_type="application/json")

    async def _generate(kind: str) -> Response:
        protocol, param = PROTOCOLS[kind]
        try:
            req = await _parsed(protocol.parse)
            gen = _require_ready(daemon)
            if req.max_tokens is None and daemon.config.max_tokens:
                req.max_tokens = daemon.config.max_tokens
            if force_tool_choice(req, daemon.config.force_tool_choice):
                log.info(
                    "%s: tool_choice forced to %s (force_tool_choice)",
                    kind,
                    req.tool_choice.name or req.tool_choice.mode,
                )
            if req.fim is not None:  # fill-in-the-middle: the prompt's ids, assembled
                fim, spm = gen.engine.fim, daemon.config.infill_order == "spm"
                await trio.to_thread.run_sync(
                    lambda: assemble_request(
                        req, gen.engine.tokenizer, fim, gen.ctx, suffix_first=spm
                    )  # fmt: skip
                )
            prepared = await gen.prepare(req, kind, param)
            if not req.stream:
                completion = Completion()
                async with gen.generate(prepared) as events:  # Overloaded: a full queue
                    daemon.metrics.requests[(kind, "200")] += 1
                    async for ev in events:
                        completion.add(ev)
                return Response(
                    json.dumps(protocol.response(req, completion, req.model or daemon.model_id)),
                    content_type="application/json",
                )
            gen.loop.admit(req.priority)  # a full queue is a 503, before the stream opens
        except (ApiError, Refused) as refused:
            err = refused if isinstance(refused, ApiError) else refusal_error(refused)
            daemon.metrics.requests[(kind, str(err.status))] += 1
            return error_response(err, protocol)
        daemon.metrics.requests[(kind, "200")] += 1
        encoder = protocol.Stream(req, req.model or daemon.model_id)
        return _sse_response(encoder, gen, prepared)

    def _sse_response(encoder: EventStream, gen: ModelServer, prepared: Prepared) -> Response:
        """The stream's body submits the request when the client starts reading it, and
        cancels it when the client goes away: a body never read never runs anything."""

        async def body() -> AsyncIterator[bytes]:
            for chunk in encoder.open():
                yield chunk.encode()
            try:
                async with gen.generate(prepared) as events:
                    while True:
                        chunks = None
                        with trio.move_on_after(daemon.config.keepalive_s):
                            try:
                                ev = await events.receive()
                            except trio.EndOfChannel:
                                return
                            chunks = encoder.feed(ev)
                        if chunks is None:  # nothing for a while (long prefill, queue)
                            yield encoder.keepalive().encode()
                            continue
                        for chunk in chunks:
                            yield chunk.encode()
            except Overloaded:  # the queue filled since the request was admitted
                for chunk in encoder.feed(Finish("error", "all slots are busy; retry later")):
                    yield chunk.encode()

        resp = Response(body(), content_type="text/event-stream")
        resp.headers["Cache-Control"] = "no-cache"
        resp.headers["X-Accel-Buffering"] = "no"
        resp.timeout = None
        return resp

    @app.post("/v1/chat/completions")
    async def chat() -> Response:
        return await _generate("chat")

    @app.post("/v1/completions")
    async def completions() -> Response:
        return await _generate("completions")

    @app.post("/v1/responses")
    async def responses() -> Response:
        return await _generate("responses")

    @app.post("/v1/messages")
    async def messages() -> Response:
        return await _generate("messages")

    @app.post("/infill")
    async def infill_route() -> Response:
        return await _generate("infill")
