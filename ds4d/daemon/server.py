"""The daemon's state and its HTTP face (Quart on Hypercorn's trio worker).

`Daemon` owns the engine, the slots, the metrics and the config; the admin channel and
other control-plane parts read it through `status()` / `slots()` / `stop()`.
`create_app(daemon)` builds the Quart app: one handler per route, each protocol module
doing the translation, each model's `ds4d.serving.model.ModelServer` doing the work.
"""

from __future__ import annotations

import functools
import hmac
import json
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol

import trio
from quart import Response, has_request_context, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from ds4d.api import (
    anthropic_messages,
    infill,
    ollama,
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
from ds4d.chat.errors import ContextExceeded, Overloaded, PromptRefused, Refused, Unavailable
from ds4d.chat.fim import assemble_request
from ds4d.chat.types import ChatRequest, Event, Finish, Sampling
from ds4d.daemon import steer_control, wire
from ds4d.daemon.admin_protocol import AdminError
from ds4d.daemon.config import Config
from ds4d.daemon.metrics import Gauge, GaugeValue, Metrics
from ds4d.daemon.models import (
    ModelRegistry,
    ModelSpec,
    default_budget_bytes,
    model_specs,
)
from ds4d.daemon.served import ServedModel, open_served
from ds4d.engine.engine import Engine
from ds4d.serving.gate import ComputeGate, Pace
from ds4d.serving.prompt import Prepared
from ds4d.serving.slots import SlotPool
from ds4d.state.service import CacheView, StateService
from ds4d.state.slots import Slot
from ds4d.state.trace import GenerationRecord, TraceWriter

log = logging.getLogger("ds4d")

CREATED = 1767225600


class _StateMetrics:
    """The state layer's series of every loaded model (none before), each sample
    labelled with its model when several are configured."""

    def __init__(self, daemon: Daemon) -> None:
        self._daemon = daemon

    def metrics_lines(self) -> list[str]:
        registry = self._daemon.models
        if registry is None:
            return []
        loaded = [(e.spec.name, e.model) for e in registry.entries() if e.model is not None]
        if len(registry.specs) == 1:
            return loaded[0][1].state.metrics_lines() if loaded else []
        return merge_labelled([(name, m.state.metrics_lines()) for name, m in loaded])


def merge_labelled(parts: list[tuple[str, list[str]]]) -> list[str]:
    """Several parts' exposition lines as one: each family's HELP and TYPE once, then its
    samples from every part with a `model` label."""
    families: dict[str, list[str]] = {}
    for model, lines in parts:
        family = ""
        for line in lines:
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                family = line.split()[2]
                head = families.setdefault(family, [])
                if line not in head:
                    head.append(line)
                continue
            name, _, rest = line.partition(" ")
            label = f'model="{model}"'
            if "{" in name:
                name = name.replace("{", "{" + label + ",", 1)
            else:
                name = f"{name}{{{label}}}"
            families.setdefault(family, []).append(f"{name} {rest}")
    return [line for lines in families.values() for line in lines]


class Daemon:
    def __init__(self, config: Config, pace: Pace | None = None) -> None:
        """`pace`: the power governor's rest after each engine step (the control plane's)."""
        self.config = config
        self.started = time.time()
        self.models: ModelRegistry[ServedModel] | None = None  # once the names are read
        self.metrics = Metrics(self._gauges(), sources=[_StateMetrics(self)])
        self.load_error: str | None = None
        self.serving = False  # the first model loaded: requests are served
        self.shutdown = trio.Event()
        self.gate = ComputeGate(pace)  # every model's engine loop takes turns through it
        # The trace writer and the cache view exist before any model, for the control
        # plane; the cache view shows the default model's disk cache.
        self.trace = TraceWriter()
        self.cache_view = CacheView(lambda: self.state.disk if self.state else None)

    def reload_config(self, config: Config) -> None:
        """Live reload: the keys marked reloadable take effect from the next request."""
        self.config = config

    # -- the default model (the first), as the single-model parts read it ------------------

    @property
    def default(self) -> ServedModel | None:
        return self.models.resident(self.models.default.name) if self.models else None

    @property
    def engine(self) -> Engine | None:
        return self.default.engine if self.default else None

    @property
    def pool(self) -> SlotPool | None:
        return self.default.pool if self.default else None

    @property
    def state(self) -> StateService | None:
        return self.default.state if self.default else None

    @property
    def ctx(self) -> int:
        return self.default.ctx if self.default else 0

    @property
    def model_id(self) -> str:
        return self.models.default.name if self.models else ""

    @property
    def busy(self) -> int:
        return sum(m.server.busy for m in self.loaded())

    @property
    def waiting(self) -> int:
        return sum(m.server.waiting for m in self.loaded())

    def loaded(self) -> list[ServedModel]:
        if self.models is None:
            return []
        return [e.model for e in self.models.entries() if e.model is not None]

    def _gauges(self) -> list[Gauge]:
        def label(m: ServedModel) -> str:
            return f'model="{m.name}",' if self.models and len(self.models.specs) > 1 else ""

        def per_slot(read: Callable[[Slot], int]) -> Callable[[], GaugeValue]:
            def value() -> GaugeValue:
                return {
                    f'{label(m)}slot="{s.index}"': read(s)
                    for m in self.loaded()
                    for s in m.pool.slots
                }

            return value

        def per_model(read: Callable[[str], int | float]) -> Callable[[], GaugeValue]:
            def value() -> GaugeValue:
                specs = self.models.specs if self.models else []
                return {f'model="{s.name}"': read(s.name) for s in specs}

            return value

        def registry() -> ModelRegistry[ServedModel]:
            assert self.models is not None
            return self.models

        return [
            Gauge("ds4d_requests_running", "requests generating on a slot",
                  lambda: sum(m.pool.busy for m in self.loaded())),
            Gauge("ds4d_requests_waiting", "requests queued for a slot",
                  lambda: self.waiting),
            Gauge("ds4d_slot_busy", "1 while the slot runs a request",
                  per_slot(lambda s: int(s.busy))),
            Gauge("ds4d_slot_tokens", "tokens held in the slot's KV",
                  per_slot(lambda s: s.session.n_tokens)),
            Gauge("ds4d_model_loaded", "1 while the model is loaded",
                  per_model(lambda n: int(registry().resident(n) is not None))),
            Gauge("ds4d_model_loads", "times the model was loaded",
                  per_model(lambda n: registry().loads[n])),
            Gauge("ds4d_model_unloads", "times the model was unloaded (keep_alive, "
                  "budget, request)", per_model(
                      lambda n: sum(v for (m, _), v in registry().unloads.items() if m == n))),
            Gauge("ds4d_model_memory_bytes", "memory the loaded model holds (weights as "
                  "mapped, KV slots, pending checkpoints)", per_model(
                      lambda n: (m.memory_bytes() if (m := registry().resident(n)) else 0))),
            Gauge("ds4d_model_memory_budget_bytes", "memory budget of all loaded models",
                  lambda: self.models.budget_bytes if self.models else 0),
        ]  # fmt: skip

    @property
    def ready(self) -> bool:
        return self.serving

    # -- model loading (outside ASGI startup: it can take longer than its timeout) --------

    async def run_model(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Read the model names, load the default model and start the registry (preloads,
        keep_alive expiry); each loaded model's engine loop runs in this task's nursery
        until the daemon's is cancelled. Reports started once requests are served;
        raises if the default model fails to load."""
        try:
            async with trio.open_nursery() as nursery:
                await self._serve_models(nursery)
                task_status.started()
        except Exception as e:
            self.load_error = self.load_error or str(e)  # /health and 503s say why
            raise

    async def _serve_models(self, nursery: trio.Nursery) -> None:
        cfg = self.config
        specs = await trio.to_thread.run_sync(model_specs, cfg)
        several = len(specs) > 1

        async def load(spec: ModelSpec) -> ServedModel:
            return await open_served(
                spec,
                self.config,
                nursery=nursery,
                gate=self.gate,
                metrics=self.metrics,
                trace=self.trace,
                current=lambda: self.config,
                # one disk KV namespace per model when several share the directory (the
                # fingerprint already keeps their checkpoints apart; this keeps their
                # budgets and scans apart too)
                kv_namespace=spec.name if several and spec != specs[0] else None,
            )

        budget = cfg.memory_budget_mb * 2**20 or default_budget_bytes()
        registry = ModelRegistry(specs, load, budget_bytes=budget, keep_alive_s=cfg.keep_alive)
        self.models = registry
        if several:
            log.info("serving %d models: %s", len(specs), ", ".join(s.name for s in specs))
        try:
            await registry.load(specs[0].name)
        except Unavailable:
            self.load_error = registry.entry(specs[0].name).failure
            raise
        await nursery.start(registry.run)
        self.serving = True  # ready: requests are served from here on

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
                "waiting": self.waiting,
                "limit": self.config.queue_size,
            },
            "models": self.model_list(),
        }

    def model_list(self) -> list[dict[str, Any]]:
        """Every configured model: its state, what it holds, when it expires."""
        if self.models is None:
            return []
        now = trio.current_time()
        out = []
        for e in self.models.entries():
            m = e.model
            left = e.expires_at - now if m is not None and math.isfinite(e.expires_at) else None
            out.append(
                {
                    "name": e.spec.name,
                    "path": str(e.spec.path),
                    "aliases": list(e.spec.aliases),
                    "roles": list(e.spec.roles),
                    "state": e.state,
                    "requests": e.users,
                    "memory_bytes": m.memory_bytes() if m else 0,
                    "ctx": m.ctx if m else None,
                    "expires_in_s": None if left is None else round(max(0.0, left), 1),
                    "loads": self.models.loads[e.spec.name],
                }
            )
        return out

    def decode_batching(self) -> dict[str, int | float | None]:
        return self.metrics.decode_batching()

    def _listed(self, name: str) -> dict[str, Any]:
        return next(m for m in self.model_list() if m["name"] == name)

    async def load_named(self, name: str) -> dict[str, Any]:
        """`ds4ctl models load NAME`."""
        try:
            registry = _require_ready(self)
            entry = await registry.load(registry.resolve(name).name)
        except Refused as e:
            raise AdminError(
                e.message, "unavailable" if isinstance(e, Unavailable) else "bad_request"
            ) from None
        return self._listed(entry.spec.name)

    async def unload_named(self, name: str) -> dict[str, Any]:
        """`ds4ctl models unload NAME`: at once when idle, else when its requests end."""
        try:
            registry = _require_ready(self)
            spec = registry.resolve(name)
        except Refused as e:
            raise AdminError(
                e.message, "unavailable" if isinstance(e, Unavailable) else "bad_request"
            ) from None
        await registry.unload(spec.name, "admin")
        return self._listed(spec.name)

    def slots(self) -> list[dict[str, Any]]:
        return [s.describe() for s in self.pool.slots] if self.pool else []

    def _loaded_named(self, name: str | None) -> ServedModel:
        """The loaded model `name` (None: the default one), or an AdminError saying why not."""
        if name is not None and not isinstance(name, str):
            raise AdminError(f"a model is named by a string, not {name!r}")
        try:
            registry = _require_ready(self)
            spec = registry.resolve(name) if name else registry.default
        except Refused as e:
            raise AdminError(e.message) from None
        model = registry.resident(spec.name)
        if model is None:
            raise AdminError(f"model {spec.name!r} is not loaded (ds4ctl models load "
                             f"{spec.name})")  # fmt: skip
        return model

    def steering_show(self, model: str | None = None) -> list[dict[str, Any]]:
        """`ds4ctl steer show`: the steering of every loaded model (or of `model`)."""
        models = [self._loaded_named(model)] if model else self.loaded()
        return [steer_control.show(m) for m in models]

    async def steering_set(self, model: str | None = None, **args: Any) -> dict[str, Any]:
        """`ds4ctl steer set`: the steering of `model`'s next requests."""
        return await steer_control.set_live(self._loaded_named(model), **args)

    def steering_off(self, model: str | None = None) -> dict[str, Any]:
        """`ds4ctl steer off`: `model`'s next requests unsteered."""
        return steer_control.off(self._loaded_named(model))

    async def stop(self) -> None:
        self.shutdown.set()

    def save_on_shutdown(self) -> int:
        """After draining: every slot worth keeping becomes a `shutdown` KV checkpoint."""
        return sum(m.state.shutdown([s.session for s in m.pool.slots]) for m in self.loaded())

    def model_object(self, model_id: str | None = None) -> dict[str, Any]:
        return {
            "id": model_id or self.model_id,
            "object": "model",
            "created": CREATED,
            "owned_by": "ds4d",
            "context_length": self.ctx,
            "max_model_len": self.ctx,
        }


def openai_model(listed: dict[str, Any]) -> dict[str, Any]:
    """A model of `Daemon.model_list` as /v1/models lists it (plus its state)."""
    return {
        "id": listed["name"],
        "object": "model",
        "created": CREATED,
        "owned_by": "ds4d",
        "context_length": listed["ctx"],
        "max_model_len": listed["ctx"],
        "state": listed["state"],
        "aliases": listed["aliases"],
        "roles": listed["roles"],
    }


PROTOCOLS: dict[str, tuple[ApiProtocol, str]] = {
    "chat": (openai_chat, "messages"),
    "completions": (openai_completions, "prompt"),
    "responses": (openai_responses, "input"),
    "messages": (anthropic_messages, "messages"),
    "infill": (infill, "input_prefix"),
}


class ErrorShape(Protocol):
    """How a protocol writes an error body (every ApiProtocol module, and ds4d.api.ollama)."""

    def error_body(self, err: ApiError) -> dict[str, Any]: ...


def _protocol_for_path(path: str) -> ErrorShape:
    if path.startswith("/api/"):
        return ollama
    if path.startswith("/infill"):
        return infill
    return anthropic_messages if path.startswith("/v1/messages") else openai_chat


def _request_line() -> tuple[str, str]:
    if not has_request_context():
        return "?", "?"
    return request.method, request.path


def error_response(err: ApiError, protocol: ErrorShape | None = None) -> Response:
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
    # they build on this module
    from ds4d.daemon.embed_routes import add_embedding_routes
    from ds4d.daemon.ollama_routes import add_ollama_routes

    add_ollama_routes(app, daemon)
    add_embedding_routes(app, daemon)
    return app


def _require_ready(daemon: Daemon) -> ModelRegistry[ServedModel]:
    """The model registry, or a 503 while the first model loads (or failed to) and during
    shutdown."""
    if daemon.models is None or not daemon.serving:
        raise Unavailable(
            "the model is still loading"
            if not daemon.load_error
            else f"the model failed to load: {daemon.load_error}",
            retry_after_s=5,
        )
    if daemon.shutdown.is_set():
        raise Unavailable("server shutting down")
    return daemon.models


class Generation:
    """A request prepared on the model that will run it. `events()` submits it to that
    model's engine loop, holding the model loaded meanwhile; leaving the block cancels
    it. Nothing is held before: a stream body the client never reads runs nothing and
    pins nothing."""

    def __init__(
        self,
        registry: ModelRegistry[ServedModel],
        served: ServedModel,
        prepared: Prepared,
        prepare: Callable[[ServedModel], Any],
        *,
        keep_alive_s: float | None,
        load_s: float,
    ) -> None:
        """`prepare(model)` prepares the request again, should the model have been
        unloaded and loaded again since (its Prepared belongs to that load)."""
        self._registry = registry
        self.served = served
        self.prepared = prepared
        self.load_s = load_s  # how long this request waited for its model to load
        self._prepare = prepare
        self._keep_alive_s = keep_alive_s

    @property
    def record(self) -> GenerationRecord:
        return self.prepared.record

    @asynccontextmanager
    async def events(self) -> AsyncIterator[trio.MemoryReceiveChannel[Event]]:
        """Overloaded when the model's queue is full."""
        lease = await self._registry.acquire(self.served.name)
        try:
            if lease.model is not self.served:  # unloaded and loaded again since
                self.served = lease.model
                self.prepared = await self._prepare(lease.model)
            async with lease.model.server.generate(self.prepared) as events:
                yield events
        finally:
            lease.release(self._keep_alive_s)

    async def collect(self) -> Completion:
        """Every event into one reply (non-streaming responses)."""
        completion = Completion()
        async with self.events() as events:
            async for ev in events:
                completion.add(ev)
        return completion


async def prepare_generation(
    daemon: Daemon,
    req: ChatRequest,
    kind: str,
    param: str,
    *,
    keep_alive_s: float | None = None,
    num_ctx: int | None = None,
) -> Generation:
    """Load the model `req` names if need be and prepare `req` on it: every refusal
    (unknown model, a prompt too long, a full queue) is raised here, before any byte of
    the answer is sent. `num_ctx`: a context limit of this request's own, inside the
    model's (Ollama's); `keep_alive_s`: how long the model stays loaded after it."""
    registry = _require_ready(daemon)
    if req.max_tokens is None and daemon.config.max_tokens:
        req.max_tokens = daemon.config.max_tokens
    if force_tool_choice(req, daemon.config.force_tool_choice):
        log.info(
            "%s: tool_choice forced to %s (force_tool_choice)",
            kind,
            req.tool_choice.name or req.tool_choice.mode,
        )

    async def prepare(model: ServedModel) -> Prepared:
        server = model.server
        if server.engine.is_embedding_model:
            raise PromptRefused(
                f"{model.name} is an embedding model: use /v1/embeddings or /api/embed", "model"
            )
        if req.fim is not None:  # fill-in-the-middle: the prompt's ids, assembled
            fim, spm = server.engine.fim, daemon.config.infill_order == "spm"
            await trio.to_thread.run_sync(
                lambda: assemble_request(
                    req, server.engine.tokenizer, fim, server.ctx, suffix_first=spm
                )  # fmt: skip
            )
        prepared = await server.prepare(req, kind, param)
        if num_ctx is not None and num_ctx < server.ctx:
            limit_to_context(req, len(prepared.tokens), num_ctx, param)
        return prepared

    lease = await registry.acquire(req.model)
    try:
        prepared = await prepare(lease.model)
        lease.model.server.loop.admit(req.priority)  # a full queue: refused now
    finally:
        lease.release()  # the model stays loaded (keep_alive) until `events` holds it again
    return Generation(registry, lease.model, prepared, prepare, keep_alive_s=keep_alive_s,
                      load_s=lease.load_s)  # fmt: skip


def limit_to_context(req: ChatRequest, prompt_tokens: int, n_ctx: int, param: str) -> None:
    """A request's own context limit, smaller than the model's: the prompt must fit it
    and the output stops at it. Nothing is reloaded: the slots keep their size."""
    if prompt_tokens >= n_ctx:
        raise ContextExceeded(
            f"Prompt has {prompt_tokens} tokens, but the request's num_ctx is {n_ctx} tokens",
            param,
            size=prompt_tokens,
            unit="tokens",
            n_ctx=n_ctx,
        )
    room = n_ctx - prompt_tokens
    req.max_tokens = min(req.max_tokens, room) if req.max_tokens else room


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
        # What Ollama answers: clients probe it to find a server (ds4d's own status is
        # /health and `ds4ctl status`).
        return Response("Ollama is running", content_type="text/plain; charset=utf-8")

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
        data = [openai_model(m) for m in daemon.model_list()] if daemon.ready else []
        return Response(
            json.dumps({"object": "list", "data": data}), content_type="application/json"
        )

    @app.get("/v1/models/<path:model_id>")
    async def model(model_id: str) -> Response:
        # With one model any name is an alias of it; with several, unknown names are 404s.
        spec = _require_ready(daemon).resolve(model_id)
        listed = next(m for m in daemon.model_list() if m["name"] == spec.name)
        return Response(
            json.dumps({**openai_model(listed), "id": model_id}), content_type="application/json"
        )


def _add_generation_routes(app: QuartTrio, daemon: Daemon) -> None:
    """The generation APIs (and Anthropic's token count): parse off the event loop,
    prepare the request on its model, then stream or collect its events."""

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
        registry = _require_ready(daemon)
        req = await _parsed(functools.partial(anthropic_messages.parse, count_only=True))
        lease = await registry.acquire(req.model)
        try:
            n = await trio.to_thread.run_sync(lease.model.server.count_tokens, req)
        finally:
            lease.release()
        return Response(json.dumps({"input_tokens": n}), content_type="application/json")

    async def _generate(kind: str) -> Response:
        protocol, param = PROTOCOLS[kind]
        try:
            req = await _parsed(protocol.parse)
            if req.candidates > 1:
                return await _candidates(req, kind, param)
            gen = await prepare_generation(daemon, req, kind, param)
            model_name = req.model or gen.served.name
            if not req.stream:
                completion = await gen.collect()  # Overloaded: the queue filled meanwhile
                daemon.metrics.requests[(kind, "200")] += 1
                return Response(
                    json.dumps(protocol.response(req, completion, model_name)),
                    content_type="application/json",
                )
        except (ApiError, Refused) as refused:
            err = refused if isinstance(refused, ApiError) else refusal_error(refused)
            daemon.metrics.requests[(kind, str(err.status))] += 1
            return error_response(err, protocol)
        daemon.metrics.requests[(kind, "200")] += 1
        return _sse_response(protocol.Stream(req, model_name), gen)

    async def _relay(encoder: EventStream, gen: Generation) -> AsyncIterator[bytes]:
        """The generation's events in the stream's framing, submitted when this is first
        iterated and cancelled when it is left before the end."""
        try:
            async with gen.events() as events:
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

    def _sse_response(encoder: EventStream, gen: Generation) -> Response:
        """The stream's body submits the request when the client starts reading it, and
        cancels it when the client goes away: a body never read never runs anything."""

        async def body() -> AsyncIterator[bytes]:
            for chunk in encoder.open():
                yield chunk.encode()
            async for data in _relay(encoder, gen):
                yield data

        return _event_stream(body())

    def _event_stream(body: AsyncIterator[bytes]) -> Response:
        resp = Response(body, content_type="text/event-stream")
        resp.headers["Cache-Control"] = "no-cache"
        resp.headers["X-Accel-Buffering"] = "no"
        resp.timeout = None
        return resp

    async def _candidates(req: ChatRequest, kind: str, param: str) -> Response:
        """/infill's n_cmpl: the candidates one after another on the same prompt (its KV
        evaluated once, each later one restored from it), each prepared when its turn
        comes; one that ends in an error (superseded by the editor's next request) ends
        the answer. Refusals of the first are the route's; of a later one, its end."""
        reqs = [infill.candidate(req, i) for i in range(req.candidates)]
        first = await prepare_generation(daemon, reqs[0], kind, param)
        model_name = req.model or first.served.name
        if not req.stream:
            bodies = []
            for i, r in enumerate(reqs):
                gen = first if i == 0 else await prepare_generation(daemon, r, kind, param)
                completion = await gen.collect()
                bodies.append(infill.response(r, completion, model_name, i))
                if completion.finish.reason == "error":
                    break
            daemon.metrics.requests[(kind, "200")] += 1
            return Response(json.dumps(bodies), content_type="application/json")

        async def body() -> AsyncIterator[bytes]:
            for i, r in enumerate(reqs):
                encoder = infill.Stream(r, model_name, i)
                try:
                    gen = first if i == 0 else await prepare_generation(daemon, r, kind, param)
                except (ApiError, Refused) as refused:
                    err = refused if isinstance(refused, ApiError) else refusal_error(refused)
                    for piece in encoder.error(err):
                        yield piece.encode()
                    return
                async for data in _relay(encoder, gen):
                    yield data
                if encoder.times.finish.reason == "error":
                    return

        daemon.metrics.requests[(kind, "200")] += 1
        return _event_stream(body())

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
