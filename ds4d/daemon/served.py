"""One loaded model as the daemon serves it: its `ModelServer` (engine, slots, state
layer, engine loop) and what the registry needs to know of it. `open_served` builds one
(blocking parts on worker threads, progress in the log) and starts its engine loop in the
nursery it is given; the registry (`ds4d.daemon.models`) decides when, and calls `unload`
when it is no longer wanted.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from ds4d.chat.formats import chat_format_for
from ds4d.daemon.config import Config, kv_dir
from ds4d.daemon.embeddings import EmbeddingService
from ds4d.daemon.metrics import Metrics
from ds4d.daemon.models import ModelSpec
from ds4d.daemon.state_config import state_from_config
from ds4d.engine.engine import Engine
from ds4d.engine.steering import SteeringError, parse_layer_range, parse_scaled
from ds4d.serving.draft import DraftModel, check_same_vocabulary
from ds4d.serving.gate import ComputeGate
from ds4d.serving.model import ModelServer
from ds4d.serving.slots import SlotPool
from ds4d.serving.steering import SteeringVectors, VectorSpec
from ds4d.state.recent import RecentStates
from ds4d.state.service import StateService
from ds4d.state.slots import Slot
from ds4d.state.trace import TraceWriter

log = logging.getLogger("ds4d")


class ServedModel:
    def __init__(
        self,
        spec: ModelSpec,
        server: ModelServer,
        embeddings: EmbeddingService,
        file_bytes: int,
        loop_scope: trio.CancelScope,
        loop_done: trio.Event,
    ) -> None:
        """`loop_scope` cancels the model's engine loop; `loop_done` is set once it has
        returned (no engine call runs after it)."""
        self.spec = spec
        self.server = server
        self.embeddings = embeddings  # its vectors (a refusal for a model that cannot)
        self.file_bytes = file_bytes  # the weights as mapped
        self.loaded_at = time.time()  # wall clock, for listings
        self._loop_scope = loop_scope
        self._loop_done = loop_done

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def engine(self) -> Engine:
        return self.server.engine

    @property
    def ctx(self) -> int:
        return self.server.ctx

    @property
    def pool(self) -> SlotPool:
        return self.server.pool

    @property
    def state(self) -> StateService:
        return self.server.state

    def memory_bytes(self) -> int:
        kv = sum(s.session.kv_bytes + (s.recent.nbytes if s.recent else 0)
                 for s in self.pool.slots)  # fmt: skip
        disk = self.state.disk
        pending = disk.writer.pending_bytes if disk is not None and disk.writer else 0
        draft = self.server.draft
        if draft is not None:
            kv += draft.engine.info.file_bytes + draft.kv_bytes
        return self.file_bytes + kv + pending

    async def unload(self) -> None:
        """The engine loop stops (the registry unloads only a model no request holds);
        every slot worth keeping becomes a checkpoint in this model's disk namespace (a
        later load restores from it), then the engine is released, on a worker."""
        self._loop_scope.cancel()
        await self._loop_done.wait()

        def work() -> None:
            sessions = [s.session for s in self.pool.slots]
            try:
                self.state.shutdown(sessions)
            finally:
                disk = self.state.disk
                if disk is not None and disk.writer is not None:
                    disk.writer.close()
                for session in sessions:
                    session.close()
                if self.server.draft is not None:
                    self.server.draft.close()
                self.engine.close()

        await trio.to_thread.run_sync(work)


async def open_served(
    spec: ModelSpec,
    config: Config,
    *,
    nursery: trio.Nursery,
    gate: ComputeGate,
    metrics: Metrics,
    trace: TraceWriter,
    current: Callable[[], Config],
    kv_namespace: str | None,
) -> ServedModel:
    """Load `spec`'s model with the daemon's settings: the engine, `config.slots` KV
    slots, the state layer (its disk checkpoints under `kv_namespace`, a subdirectory of
    the KV directory, when several models share it), and its engine loop, started in
    `nursery` (serving once this returns)."""
    cfg = config
    path = spec.path
    t0 = time.perf_counter()
    engine = await trio.to_thread.run_sync(
        lambda: Engine.open(
            path,
            cfg.threads or None,
            cfg.kv_type,
            rope_scaling=cfg.rope_scaling,
            n_ctx=cfg.ctx,
            weights=cfg.weights,
            precision=cfg.precision,
            pooling=cfg.pooling,
        )
    )
    if cfg.control_vectors:
        await trio.to_thread.run_sync(lambda: _steer_engine(engine, cfg))
        log.info("steering: %s", engine.steering.describe() if engine.steering else "none")
    info = engine.info
    vectors = await trio.to_thread.run_sync(
        lambda: SteeringVectors.load(vector_specs(cfg.steering_vectors), info.n_layer, info.n_embd)
    )
    if vectors.names:
        log.info("steering vectors a request may choose: %s", ", ".join(vectors.names))
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
    draft = None
    if cfg.speculative == "draft":
        draft = await trio.to_thread.run_sync(lambda: _open_draft(engine, cfg, ctx))
        log.info("draft model %s (%s, %s) loaded beside %s", draft.engine.info.name,
                 draft.engine.info.architecture, draft.engine.info.quant, spec.name)  # fmt: skip
    sessions = []
    for i in range(cfg.slots):
        sessions.append(await trio.to_thread.run_sync(engine.new_session, ctx))
        log.info("%s: slot %d/%d ready", spec.name, i + 1, cfg.slots)
    states = cfg.completion_states_mb << 20
    slots = [Slot(i, s, ctx, recent=RecentStates(states)) for i, s in enumerate(sessions)]
    state_cfg = cfg
    if kv_namespace is not None and cfg.kv_disk:
        state_cfg = dataclasses.replace(cfg, kv_disk_dir=str(kv_dir(cfg) / kv_namespace))
    # the disk cache's scan reads every checkpoint's header: on a worker
    state = await trio.to_thread.run_sync(
        lambda: state_from_config(state_cfg, engine=engine, ctx=ctx, trace=trace, current=current)
    )
    server = ModelServer(
        engine,
        chat_format_for(engine, ctx),
        ctx,
        slots,
        state,
        gate,
        metrics,
        completion_slots=cfg.completion_slots,
        speculative=cfg.speculative,
        draft=draft,
        queue_size=cfg.queue_size,
        chunk_target_s=cfg.prefill_chunk_ms / 1000,
        vectors=vectors,
        steering_about=steering_about(
            [parse_scaled(s) for s in cfg.control_vectors],
            parse_layer_range(cfg.control_vector_layer_range),
            "config",
        ),
    )
    scope, done = trio.CancelScope(), trio.Event()

    async def serve(task_status: trio.TaskStatus[None]) -> None:
        try:
            with scope:
                await server.run(task_status=task_status)
        finally:
            done.set()

    await nursery.start(serve)
    file_bytes = await trio.to_thread.run_sync(lambda: Path(path).stat().st_size)
    log.info("model %s loaded in %.1fs; serving", spec.name, time.perf_counter() - t0)
    embeddings = EmbeddingService(engine, gate, ctx)
    return ServedModel(spec, server, embeddings, file_bytes, scope, done)


def vector_specs(items: list[str]) -> list[VectorSpec]:
    """`steering_vectors` entries, NAME=FILE[:SCALE], as (name, file, scale)."""
    out: list[VectorSpec] = []
    for item in items:
        name, sep, spec = item.partition("=")
        if not sep or not name.strip() or not spec:
            raise SteeringError(f"steering_vectors: {item!r} is not NAME=FILE[:SCALE]")
        path, scale = parse_scaled(spec)
        out.append((name.strip(), str(Path(path).expanduser()), scale))
    return out


def steering_about(files: list[tuple[str, float]], layer_range: tuple[int, int] | None,
                   origin: str) -> dict[str, Any]:  # fmt: skip
    """What a steering was made from, as `ds4ctl steer show` reports it."""
    return {
        "files": [{"path": str(p), "scale": s} for p, s in files],
        "layer_range": list(layer_range) if layer_range else None,
        "set_by": origin,
    }


def _open_draft(engine: Engine, cfg: Config, ctx: int) -> DraftModel:
    """The config's draft model, for `engine`'s slots of `ctx` tokens; ModelLoadError
    (and the target closed) when it cannot load or its vocabulary differs."""
    try:
        draft = Engine.open(Path(cfg.draft_model).expanduser(), cfg.threads or None,
                            cfg.kv_type, weights=cfg.weights, precision=cfg.precision)  # fmt: skip
        try:
            check_same_vocabulary(engine, draft)
        except BaseException:
            draft.close()
            raise
    except BaseException:
        engine.close()
        raise
    return DraftModel(draft, ctx)


def _steer_engine(engine: Engine, cfg: Config) -> None:
    """The config's control vectors as the steering of every slot (docs/steering.md)."""
    from ds4d.engine.steering import load_control_vectors

    steering = load_control_vectors(
        [parse_scaled(spec) for spec in cfg.control_vectors],
        engine.info.n_layer,
        engine.info.n_embd,
        parse_layer_range(cfg.control_vector_layer_range),
        attn_scale=cfg.directional_steering_attn,
        ffn_scale=cfg.directional_steering_ffn,
    )
    engine.set_steering(steering)
