"""Ollama's native API on the daemon: /api/chat, /api/generate, /api/tags, /api/show,
/api/ps, /api/version. Translation is `ds4d.api.ollama`; the models come from the
daemon's registry (`Daemon.models`), generations from `server.prepare_generation`, the
same path (engine loop, slots, prefix reuse, disk KV) every other protocol takes; a
`suffix` goes through the fill-in-the-middle assembly /infill uses.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from typing import Any

import trio
from quart import Response, request
from quart_trio import QuartTrio

from ds4d.api import ollama
from ds4d.api.common import ApiError, refusal_error, request_object
from ds4d.api.request_body import parse_json_body
from ds4d.chat.errors import Overloaded, Refused
from ds4d.chat.types import Finish, Sampling
from ds4d.daemon.model_card import CardCache, ModelCard
from ds4d.daemon.models import Entry, ModelSpec
from ds4d.daemon.served import ServedModel
from ds4d.daemon.server import (
    Daemon,
    Generation,
    _require_ready,
    error_response,
    log,
    prepare_generation,
)

JSON = "application/json; charset=utf-8"
NDJSON = "application/x-ndjson"
# What /api/ps shows for a model kept until the budget needs the room.
_FOREVER = datetime(2318, 1, 1, tzinfo=timezone.utc)


def _iso(t: datetime) -> str:
    return ollama.created_at(t)


def add_ollama_routes(app: QuartTrio, daemon: Daemon) -> None:
    cards = CardCache()

    def defaults() -> Sampling:
        c = daemon.config
        return Sampling(temperature=c.temperature, top_p=c.top_p, top_k=c.top_k, min_p=c.min_p)

    async def body_json() -> dict[str, Any]:
        data = await request.get_data(as_text=False)
        assert isinstance(data, bytes)
        return request_object(await trio.to_thread.run_sync(parse_json_body, data))

    async def card_of(spec: ModelSpec) -> ModelCard:
        return await trio.to_thread.run_sync(cards.get, spec.path)

    def json_response(obj: Any, status: int = 200) -> Response:
        return Response(json.dumps(obj, ensure_ascii=False), status=status, content_type=JSON)

    def fail(err: ApiError | Refused) -> Response:
        e = err if isinstance(err, ApiError) else refusal_error(err)
        return error_response(e, ollama)

    # -- generation ------------------------------------------------------------------------

    async def generate(chat: bool) -> Response:
        kind = "ollama_chat" if chat else "ollama_generate"
        t0 = time.perf_counter_ns()
        try:
            body = await body_json()
            parse = ollama.parse_chat if chat else ollama.parse_generate
            sampling = defaults()
            parsed = await trio.to_thread.run_sync(lambda: parse(body, sampling))
            registry = _require_ready(daemon)
            spec = registry.resolve(parsed.request.model)
            name = parsed.request.model or spec.name
            now = datetime.now(timezone.utc)
            if parsed.load_only:  # Ollama's way to load (or with keep_alive 0 unload)
                if parsed.keep_alive_s == 0:
                    await registry.unload(spec.name)
                    return json_response(ollama.done_object(name, now, chat, "unload"))
                lease = await registry.acquire(spec.name)
                lease.release(parsed.keep_alive_s)
                return json_response(ollama.done_object(name, now, chat, "load"))
            req = parsed.request
            gen = await prepare_generation(
                daemon,
                req,
                kind,
                "messages" if chat else "prompt",
                keep_alive_s=parsed.keep_alive_s,
                num_ctx=parsed.num_ctx,
            )
            if not req.stream:
                completion = await gen.collect()  # Overloaded: the queue filled meanwhile
        except (ApiError, Refused) as err:
            e = err if isinstance(err, ApiError) else refusal_error(err)
            daemon.metrics.requests[(kind, str(e.status))] += 1
            return fail(err)
        daemon.metrics.requests[(kind, "200")] += 1
        load_ns = int(gen.load_s * 1e9)

        def timings() -> ollama.Timings:
            r = gen.record
            return ollama.Timings(
                total_ns=time.perf_counter_ns() - t0,
                load_ns=load_ns,
                prompt_eval_ns=int(r.prefill_s * 1e9),
                eval_ns=int(r.decode_s * 1e9),
            )

        if not req.stream:
            if completion.finish.reason == "error":
                return json_response({"error": completion.finish.error or "failed"}, 500)
            respond = ollama.chat_response if chat else ollama.generate_response
            return json_response(respond(completion, name, datetime.now(timezone.utc), timings()))
        return ndjson(ollama.Stream(name, chat, timings), gen)

    def ndjson(encoder: ollama.Stream, gen: Generation) -> Response:
        """Submitted when the client starts reading, cancelled when it goes away."""

        async def body() -> AsyncIterator[bytes]:
            try:
                async with gen.events() as events:
                    async for ev in events:
                        for line in encoder.feed(ev):
                            yield line.encode()
            except Overloaded:  # the queue filled since the request was admitted
                for line in encoder.feed(Finish("error", "all slots are busy; retry later")):
                    yield line.encode()

        resp = Response(body(), content_type=NDJSON)
        resp.headers["Cache-Control"] = "no-cache"
        resp.headers["X-Accel-Buffering"] = "no"
        resp.timeout = None
        return resp

    @app.post("/api/chat")
    async def api_chat() -> Response:
        return await generate(chat=True)

    @app.post("/api/generate")
    async def api_generate() -> Response:
        return await generate(chat=False)

    # -- listings --------------------------------------------------------------------------

    def context_of(entry: Entry[ServedModel], card: ModelCard) -> int:
        if entry.model is not None:
            return entry.model.ctx
        return daemon.config.ctx or card.context_length

    async def listed(
        entries: list[Entry[ServedModel]],
    ) -> list[tuple[Entry[ServedModel], ModelCard]]:
        out = []
        for e in entries:
            try:
                out.append((e, await card_of(e.spec)))
            except Exception as exc:  # noqa: BLE001 - a broken file is left out, and logged
                log.warning("cannot read %s for the model list: %s", e.spec.path, exc)
        return out

    def tag(entry: Entry[ServedModel], card: ModelCard) -> dict[str, Any]:
        modified = datetime.fromtimestamp(card.modified, timezone.utc)
        return {
            "name": entry.spec.name,
            "model": entry.spec.name,
            "modified_at": _iso(modified),
            "size": card.file_bytes,
            "digest": card.digest,
            "details": card.details,
            "state": entry.state,  # ds4d's own: loaded, unloaded, loading, unloading
        }

    @app.get("/api/tags")
    async def api_tags() -> Response:
        registry = _require_ready(daemon)
        return json_response({"models": [tag(e, c) for e, c in await listed(registry.entries())]})

    @app.get("/api/ps")
    async def api_ps() -> Response:
        registry = _require_ready(daemon)
        loaded = [e for e in registry.entries() if e.model is not None]
        now_trio, now = trio.current_time(), datetime.now(timezone.utc)
        models = []
        for e, card in await listed(loaded):
            m = e.model
            if m is None:  # unloaded while the cards were read
                continue
            left = e.expires_at - now_trio
            expires = _FOREVER if math.isinf(left) else now + timedelta(seconds=max(0.0, left))
            models.append(
                {
                    **tag(e, card),
                    "size": m.memory_bytes(),
                    "expires_at": _iso(expires),
                    "size_vram": 0,
                    "context_length": m.ctx,
                }
            )
        return json_response({"models": models})

    @app.post("/api/show")
    async def api_show() -> Response:
        try:
            body = await body_json()
            registry = _require_ready(daemon)
            entry = registry.entry(ollama.model_name(body))
            card = await card_of(entry.spec)
        except (ApiError, Refused) as err:
            return fail(err)
        ctx = context_of(entry, card)
        info = {
            **card.metadata,
            "general.architecture": card.architecture,
            "general.parameter_count": card.parameters,
            f"{card.architecture}.context_length": ctx,
        }
        template = card.chat_template
        if card.fim is not None:
            # Continue tells a model that fills in the middle by `.Suffix` in its (Go)
            # template; this line says how ds4d assembles such a prompt.
            pre, suf, mid = card.fim
            template += f"\n{{{{/* suffix: {pre}{{{{ .Prompt }}}}{suf}{{{{ .Suffix }}}}{mid} */}}}}"
        return json_response(
            {
                "license": "",
                "modelfile": f"# ds4d serves {card.path}\nFROM {card.path}\n",
                "parameters": f"num_ctx {ctx}",
                "template": template,
                "details": card.details,
                "model_info": info,
                "capabilities": card.capabilities,
                "modified_at": _iso(datetime.fromtimestamp(card.modified, timezone.utc)),
            }
        )

    @app.get("/api/version")
    async def api_version() -> Response:
        return json_response({"version": ollama.OLLAMA_VERSION})
