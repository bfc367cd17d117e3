"""One loaded model as the daemon serves it: its engine, its slots, its state layer (disk
KV namespace, tool memory) and the generator that runs requests on them. `open_served`
builds one (blocking parts on worker threads, progress in the log); the registry
(`ds4d.daemon.models`) decides when, and calls `unload` when it is no longer wanted.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from ds4d.chat.formats import chat_format_for
from ds4d.daemon.chunking import ChunkSizer
from ds4d.daemon.config import Config
from ds4d.daemon.generation import Generator
from ds4d.daemon.metrics import Metrics
from ds4d.daemon.models import ModelSpec
from ds4d.daemon.scheduler import EngineGate, SlotPool
from ds4d.daemon.state_config import state_from_config
from ds4d.engine.engine import Engine
from ds4d.state.service import StateService
from ds4d.state.slots import Slot
from ds4d.state.trace import TraceWriter

log = logging.getLogger("ds4d")


@dataclass
class ServedModel:
    spec: ModelSpec
    engine: Engine
    generator: Generator
    pool: SlotPool
    state: StateService
    ctx: int
    file_bytes: int  # the weights as mapped
    loaded_at: float  # wall clock, for listings

    @property
    def name(self) -> str:
        return self.spec.name

    def memory_bytes(self) -> int:
        kv = sum(s.session.kv_bytes for s in self.pool.slots)
        disk = self.state.disk
        pending = disk.writer.pending_bytes if disk is not None and disk.writer else 0
        return self.file_bytes + kv + pending

    async def unload(self) -> None:
        """Every slot worth keeping becomes a checkpoint in this model's disk namespace
        (a later load restores from it), then the engine is released; on a worker."""

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
                self.engine.close()

        await trio.to_thread.run_sync(work)


async def open_served(
    spec: ModelSpec,
    config: Config,
    *,
    gate: EngineGate,
    metrics: Metrics,
    trace: TraceWriter,
    current: Callable[[], Config],
    kv_namespace: str | None,
) -> ServedModel:
    """Load `spec`'s model with the daemon's settings: the engine, `config.slots` KV
    slots, the state layer (its disk checkpoints under `kv_namespace`, a subdirectory of
    the KV directory, when several models share it) and the generator."""
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
        log.info("%s: slot %d/%d ready", spec.name, i + 1, cfg.slots)
    pool = SlotPool([Slot(i, s, ctx) for i, s in enumerate(sessions)], cfg.queue_size)
    state_cfg = cfg
    if kv_namespace is not None and cfg.kv_disk:
        from ds4d.daemon.config import kv_dir

        state_cfg = dataclasses.replace(cfg, kv_disk_dir=str(kv_dir(cfg) / kv_namespace))
    # the disk cache's scan reads every checkpoint's header: on a worker
    state = await trio.to_thread.run_sync(
        lambda: state_from_config(state_cfg, engine=engine, ctx=ctx, trace=trace, current=current)
    )
    generator = Generator(
        engine,
        chat_format_for(engine, ctx),
        ctx,
        pool,
        gate,
        metrics,
        state,
        chunks=ChunkSizer(target_s=cfg.prefill_chunk_ms / 1000),
    )
    file_bytes = await trio.to_thread.run_sync(lambda: Path(path).stat().st_size)
    log.info("model %s loaded in %.1fs", spec.name, time.perf_counter() - t0)
    return ServedModel(spec, engine, generator, pool, state, ctx, file_bytes, time.time())
