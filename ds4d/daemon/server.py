"""The daemon's state and its HTTP face (Quart on Hypercorn's trio worker).

`Daemon` owns the engine, the slots, the metrics and the config; the admin channel and
other control-plane parts read it through `status()` / `slots()` / `stop()`.
`create_app(daemon)` builds the Quart app: one handler per route, each protocol module
doing the translation, `ds4d.daemon.generation` doing the work.
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

from ds4d.api import anthropic_messages, openai_chat, openai_completions, openai_responses
from ds4d.api.common import (
    ApiError,
    ApiProtocol,
    Completion,
    EventStream,
    force_tool_choice,
    refusal_error,
)
from ds4d.api.request_body import parse_json_body
from ds4d.chat.errors import Refused, Unavailable
from ds4d.chat.formats import chat_format_for
from ds4d.chat.types import ChatRequest, Event, Sampling
from ds4d.daemon import wire
from ds4d.daemon.chunking import ChunkSizer
from ds4d.daemon.config import Config, model_path
from ds4d.daemon.generation import Generator
from ds4d.daemon.metrics import Gauge, GaugeValue, Metrics
from ds4d.daemon.scheduler import EngineGate, SlotPool
from ds4d.daemon.state_config import state_from_config
from ds4d.engine.engine import Engine
from ds4d.state.service import CacheView, StateService
from ds4d.state.slots import Slot
from ds4d.state.trace import TraceWriter

log = logging.getLogger("ds4d")

CONSUMER_START_S = 30.0  # a stream whose body is not read by then is abandoned
CREATED = 1767225600


class _StateMetrics:
    """The state layer's series once the model is loaded (none before)."""

    def __init__(self, daemon: Daemon) -> None:
        self._daemon = daemon

    def metrics_lines(self) -> list[str]:
        state = self._daemon.state
        return state.metrics_lines() if state is not None else []


class Daemon:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.started = time.time()
        self.engine: Engine | None = None
        self.generator: Generator | None = None
        self.pool: SlotPool | None = None
        self.metrics = Metrics(self._gauges(), sources=[_StateMetrics(self)])
        self.ctx = 0
        self.model_id = ""
        self.load_error: str | None = None
        self.nursery: trio.Nursery | None = None
        self.shutdown = trio.Event()
        self.gate = EngineGate()  # the control plane sets gate.pace (power throttling)
        # State layer (disk KV cache, tool replay, trace): built once the model is known;
        # the trace writer and the cache view exist earlier for the control plane.
        self.state: StateService | None = None
        self.trace = TraceWriter()
        self.cache_view = CacheView(lambda: self.state.disk if self.state else None)

    def _gauges(self) -> list[Gauge]:
        def per_slot(read: Callable[[Slot], int]) -> Callable[[], GaugeValue]:
            def value() -> GaugeValue:
                return {
                    f'slot="{s.index}"': read(s) for s in (self.pool.slots if self.pool else [])
                }

            return value

        return [
            Gauge("ds4d_requests_running", "requests generating on a slot",
                  lambda: self.pool.busy if self.pool else 0),
            Gauge("ds4d_requests_waiting", "requests queued for a slot",
                  lambda: self.pool.waiting if self.pool else 0),
            Gauge("ds4d_slot_busy", "1 while the slot runs a request",
                  per_slot(lambda s: int(s.busy))),
            Gauge("ds4d_slot_tokens", "tokens held in the slot's KV",
                  per_slot(lambda s: s.session.n_tokens)),
            Gauge("ds4d_model_loaded", "1 once the model is loaded",
                  lambda: int(self.generator is not None)),
        ]  # fmt: skip

    @property
    def ready(self) -> bool:
        return self.generator is not None

    # -- model loading (outside ASGI startup: it can take longer than its timeout) --------

    async def load_model(self) -> None:
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
            )
        )
        if cfg.control_vectors:
            await trio.to_thread.run_sync(lambda: _steer_engine(engine, cfg))
            log.info("steering: %s", engine.steering.describe() if engine.steering else "none")
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
        self.pool = SlotPool([Slot(i, s, ctx) for i, s in enumerate(sessions)], cfg.queue_size)
        # the disk cache's scan reads every checkpoint's header: on a worker
        state = self.state = await trio.to_thread.run_sync(
            lambda: state_from_config(
                cfg, engine=engine, ctx=ctx, trace=self.trace, current=lambda: self.config
            )
        )
        generator = Generator(
            engine,
            chat_format_for(engine, ctx),
            ctx,
            self.pool,
            self.gate,
            self.metrics,
            state,
            chunks=ChunkSizer(target_s=cfg.prefill_chunk_ms / 1000),
        )
        self.generator = generator  # ready: requests are served from here on
        log.info("model loaded in %.1fs; serving", time.perf_counter() - t0)

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
                "total": len(self.pool.slots) if self.pool else self.config.slots,
                "busy": self.pool.busy if self.pool else 0,
            },
            "queue": {
                "waiting": self.pool.waiting if self.pool else 0,
                "limit": self.config.queue_size,
            },
        }

    def decode_batching(self) -> dict[str, int | float | None]:
        return self.metrics.decode_batching()

    def slots(self) -> list[dict[str, Any]]:
        return [s.describe() for s in self.pool.slots] if self.pool else []

    async def stop(self) -> None:
        self.shutdown.set()

    def save_on_shutdown(self) -> int:
        """After draining: every slot worth keeping becomes a `shutdown` KV checkpoint."""
        if self.state is None or self.pool is None:
            return 0
        return self.state.shutdown([s.session for s in self.pool.slots])

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
}


def _protocol_for_path(path: str) -> ApiProtocol:
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


def _require_ready(daemon: Daemon) -> Generator:
    """The generator, or a 503 while the model loads (or failed to) and during shutdown."""
    if daemon.generator is None:
        raise Unavailable(
            "the model is still loading"
            if not daemon.load_error
            else f"the model failed to load: {daemon.load_error}",
            retry_after_s=5,
        )
    if daemon.shutdown.is_set():
        raise Unavailable("server shutting down")
    return daemon.generator


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
            job = await gen.prepare(req, kind, param)
            job.ticket = gen.pool.request(job.tokens)
        except (ApiError, Refused) as refused:
            err = refused if isinstance(refused, ApiError) else refusal_error(refused)
            daemon.metrics.requests[(kind, str(err.status))] += 1
            return error_response(err, protocol)
        model_name = req.model or daemon.model_id
        send, recv = trio.open_memory_channel[Event](64)
        scope = trio.CancelScope()
        consumer_started = trio.Event()

        async def produce() -> None:
            with scope:
                async with trio.open_nursery() as nursery:
                    if req.stream:
                        nursery.start_soon(abandon_unless_consumed)
                    await gen.run(job, send)
                    nursery.cancel_scope.cancel()

        async def abandon_unless_consumed() -> None:
            # A client gone between the handler's return and the first body read never
            # runs the body's cleanup: without this the job would hold its slot forever.
            with trio.move_on_after(CONSUMER_START_S):
                await consumer_started.wait()
                return
            log.info("%s stream never read by its client; cancelled", kind)
            scope.cancel()

        assert daemon.nursery is not None
        daemon.nursery.start_soon(produce)
        daemon.metrics.requests[(kind, "200")] += 1
        if not req.stream:
            completion = Completion()
            try:
                async with recv:
                    async for ev in recv:
                        completion.add(ev)
            finally:
                scope.cancel()
            return Response(
                json.dumps(protocol.response(req, completion, model_name)),
                content_type="application/json",
            )
        encoder = protocol.Stream(req, model_name)
        return _sse_response(encoder, recv, scope, consumer_started)

    def _sse_response(
        encoder: EventStream,
        recv: trio.MemoryReceiveChannel[Event],
        scope: trio.CancelScope,
        started: trio.Event,
    ) -> Response:
        async def body() -> AsyncIterator[bytes]:
            started.set()
            try:
                for chunk in encoder.open():
                    yield chunk.encode()
                while True:
                    chunks = None
                    with trio.move_on_after(daemon.config.keepalive_s):
                        try:
                            ev = await recv.receive()
                        except trio.EndOfChannel:
                            return
                        chunks = encoder.feed(ev)
                    if chunks is None:  # nothing for a while (long prefill, queue)
                        yield encoder.keepalive().encode()
                        continue
                    for chunk in chunks:
                        yield chunk.encode()
            finally:
                scope.cancel()
                recv.close()

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


def _steer_engine(engine: Engine, cfg: Config) -> None:
    """The config's control vectors as the steering of every slot (docs/steering.md)."""
    from ds4d.engine.steering import load_control_vectors, parse_layer_range, parse_scaled

    steering = load_control_vectors(
        [parse_scaled(spec) for spec in cfg.control_vectors],
        engine.info.n_layer,
        engine.info.n_embd,
        parse_layer_range(cfg.control_vector_layer_range),
        attn_scale=cfg.directional_steering_attn,
        ffn_scale=cfg.directional_steering_ffn,
    )
    engine.set_steering(steering)
