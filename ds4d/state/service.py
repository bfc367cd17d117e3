"""The state layer as the daemon uses it: built from config values, handed to the
model's server at construction (ds4d.serving.model.ModelServer: prompt preparation, the
engine loop's slot syncs and decodes) and to the metrics as one of their sources.

    state = StateService.create(tokenizer=..., fingerprint=..., ctx=..., kv_dir=...)
    ModelServer(..., state=state); Metrics(sources=[state])
    state.prepare_request(request)          # before rendering: byte-stable history
    SlotSync(session, text, tokens, plan, state.kv, tool_call_ids(request))  # ds4d.state.sync
    state.kv.after_token(session)           # decode loop
    state.trace_finished(record, prompt)    # one trace line per finished request
    state.shutdown(sessions)                # SIGTERM, after draining

This layer imports nothing above it: the daemon's objects reach it as the neutral types
of ds4d.chat and ds4d.state (ChatRequest, Event, GenerationRecord).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ds4d.chat.types import (
    ChatRequest,
    Event,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallEnd,
    ToolCallStart,
)
from ds4d.engine.engine import Session
from ds4d.engine.tokenizer_api import ModelTokenizer
from ds4d.state.diskcache import DiskCache
from ds4d.state.kvstate import KVState
from ds4d.state.normalize import strip_billing_header
from ds4d.state.savepolicy import SavePolicy
from ds4d.state.toolmemory import ToolMemory
from ds4d.state.trace import GenerationRecord, TraceRecord, TraceWriter
from ds4d.state.writer import CheckpointWriter

log = logging.getLogger("ds4d.kvcache")

MIB = 1024 * 1024
# The daemon asks its service manager for 60 s more when it starts the shutdown saves:
# the queued writes get most of it, the slots' own shutdown saves the rest.
SHUTDOWN_DRAIN_S = 45.0


def tool_call_ids(request: ChatRequest) -> list[str]:
    """Every tool-call id a conversation mentions (assistant calls and tool results)."""
    ids: list[str] = []
    for m in request.messages:
        ids += [c.id for c in m.tool_calls if c.id]
        if m.tool_call_id:
            ids.append(m.tool_call_id)
    return ids


class StateService:
    def __init__(
        self,
        kv: KVState,
        trace: TraceWriter | None = None,
        *,
        normalize: bool | Callable[[], bool] = True,
        tool_replay: bool = True,
    ) -> None:
        self.kv = kv
        self.disk = kv.disk
        self.tool_memory = kv.tool_memory
        self.trace = trace if trace is not None else TraceWriter()
        self._normalize = normalize if callable(normalize) else (lambda: normalize)
        self.tool_replay = tool_replay

    @classmethod
    def create(
        cls,
        *,
        tokenizer: ModelTokenizer,
        fingerprint: str,
        ctx: int,
        kv_dir: Path | None,
        space_mb: int = 8192,
        write_budget_mb: int | None = None,
        background: bool = True,
        policy: dict[str, int | None] | None = None,
        tool_memory_max_ids: int = 100_000,
        tool_replay: bool = True,
        normalize: bool | Callable[[], bool] = True,
        trace_path: str | None = None,
        trace_content: bool = False,
        trace: TraceWriter | None = None,
        steering_key: str = "",
    ) -> StateService:
        """`kv_dir` None turns the disk cache off; `policy` holds the kv-cache-* knobs
        (None or missing = the default fitted to `ctx`). `steering_key`: the steering
        the disk cache's checkpoints are computed under ('' for none; the fingerprint
        must name it too): sessions steered otherwise keep off the disk (kvstate.py). `write_budget_mb`: MiB written
        per 24 h (0 = unlimited, None = the disk cache's default); `background`: saves go
        through a writer thread."""
        pol = SavePolicy.for_context(ctx, **(policy or {}))
        disk = None
        if kv_dir is not None:
            daily = None if write_budget_mb is None else write_budget_mb * MIB  # 0: none
            disk = DiskCache(kv_dir, budget_bytes=space_mb * MIB, fingerprint=fingerprint,
                             ctx=ctx, min_tokens=pol.min_tokens, daily_write_bytes=daily,
                             writer=CheckpointWriter() if background else None)  # fmt: skip
        memory = ToolMemory(tool_memory_max_ids if tool_replay else 0)
        kv = KVState(tokenizer, ctx, disk=disk, policy=pol, tool_memory=memory,
                     steering_key=steering_key)  # fmt: skip
        if trace is None:  # else the writer the control plane switches at runtime
            trace = TraceWriter(trace_path or None, trace_content)
        return cls(kv, trace, normalize=normalize, tool_replay=tool_replay)

    # ---- before rendering --------------------------------------------------------------

    def prepare_request(self, request: ChatRequest) -> ChatRequest:
        """A copy of `request` whose history renders byte-stably: Claude Code's billing
        line dropped from system text, earlier tool calls' arguments replaced by the
        exact text the model sampled (looked up in the KV files after a restart)."""
        normalize = self._normalize()
        calls = [c for m in request.messages for c in m.tool_calls] if self.tool_replay else []
        if not normalize and not calls:
            return request
        if calls and self.disk is not None:
            missing = {c.id for c in calls if c.id and c.id not in self.tool_memory}
            if missing:
                self.tool_memory.update(self.disk.tool_maps(missing))
        messages = []
        for m in request.messages:
            if normalize and m.role == "system" and m.content:
                m = dataclasses.replace(m, content=_strip_billing(m.content))
            if self.tool_replay and m.tool_calls:
                m = dataclasses.replace(m, tool_calls=[self._replayed(c) for c in m.tool_calls])
            messages.append(m)
        return dataclasses.replace(request, messages=messages)

    def _replayed(self, call: ToolCall) -> ToolCall:
        sampled = self.tool_memory.get(call.id) if call.id else None
        if sampled is None or sampled == call.arguments:
            return call
        return dataclasses.replace(call, arguments=sampled)

    def remember_tool_call(self, session: Session, call_id: str, arguments: str) -> None:
        """A call the model just produced (id handed to the client, arguments as sampled)."""
        if self.tool_replay:
            self.kv.remember_tool_call(session, call_id, arguments)

    # ---- what a generation reports -----------------------------------------------------

    def record_output(self, record: GenerationRecord, event: Event) -> None:
        """Collect a request's output for the trace, only when text tracing is on."""
        if not (self.trace.enabled and self.trace.include_text):
            return
        if isinstance(event, TextDelta | ReasoningDelta):
            piece = event.text
        elif isinstance(event, ToolCallStart):
            piece = f"\n[tool call {event.id} {event.name}] "
        elif isinstance(event, ToolCallEnd):
            piece = event.arguments
        else:
            return
        record.output = (record.output or "") + piece

    def trace_finished(self, record: GenerationRecord, prompt: str) -> None:
        """The trace line of a request that had a slot (blocking: a file write)."""
        if not self.trace.enabled:
            return
        extra: dict[str, object] = {"prefilled_tokens": record.prefilled_tokens}
        if record.ttft_s is not None:
            extra["ttft_s"] = record.ttft_s
        if record.miss_reason:
            extra["miss_reason"] = record.miss_reason
        if record.drafted_tokens:
            extra["drafted_tokens"] = record.drafted_tokens
            extra["accepted_tokens"] = record.accepted_tokens
        self.trace.write(
            TraceRecord(
                api=record.api,
                slot=record.slot,
                prompt_tokens=record.prompt_tokens,
                cache_source=record.cache_source,
                cached_tokens=record.cached_tokens,
                prefill_s=record.prefill_s,
                decode_s=record.decode_s,
                generated_tokens=record.generated_tokens,
                finish_reason=record.finish,
                disk_file=record.disk_file,
                extra=extra,
            ),
            prompt=prompt,
            output=record.output,
        )

    def metrics_lines(self) -> list[str]:
        lines: list[str] = []
        memory = self.tool_memory
        lines += _family(
            "ds4d_tool_memory_ids",
            "gauge",
            "tool-call ids remembered for replay",
            [f"ds4d_tool_memory_ids {len(memory)}"],
        )
        if self.disk is None:
            return lines
        s = self.disk.stats_dict()
        for key, kind, text in (
            ("bytes_used", "gauge", "bytes of KV checkpoints on disk"),
            ("budget_bytes", "gauge", "disk budget of the KV cache"),
            ("entries", "gauge", "KV checkpoint files"),
            ("bytes_written", "counter", "bytes of KV checkpoints written"),
            ("files_written", "counter", "KV checkpoint files written"),
            ("evictions", "counter", "KV checkpoint files evicted"),
            ("evicted_bytes", "counter", "bytes of KV checkpoints evicted"),
            ("hits", "counter", "disk KV checkpoints loaded"),
            ("misses", "counter", "disk lookups without a usable checkpoint"),
            ("load_failures", "counter", "checkpoints rejected when loading"),
            ("shortfalls", "counter", "disk hits that reused fewer tokens than promised"),
            ("quarantined", "counter", "files moved aside as corrupt or foreign"),
            ("skipped_budget", "counter", "saves skipped: larger than the budget"),
            ("skipped_daily_budget", "counter", "saves skipped: daily write budget reached"),
            # background writes and delta checkpoints
            ("bytes_written_today", "gauge", "bytes of KV checkpoints written in the last 24 h"),
            ("daily_write_bytes", "gauge", "daily write budget of KV checkpoints (0 = none)"),
            ("pending_writes", "gauge", "KV checkpoint writes queued or in progress"),
            ("pending_bytes", "gauge", "memory held by KV snapshots waiting to be written"),
            ("dropped_queue_full", "counter", "KV checkpoint saves dropped: write queue full"),
            ("deltas_written", "counter", "delta KV checkpoint files written (new rows only)"),
            ("delta_entries", "gauge", "delta KV checkpoint files on disk"),
            ("delta_base_missing", "counter", "delta saves skipped: their base file was gone"),
            ("snapshot_seconds", "counter", "engine-thread time copying sessions to save"),
        ):
            name = f"ds4d_kv_disk_{key}" + ("_total" if kind == "counter" else "")
            lines += _family(name, kind, text, [f"{name} {s[key] or 0}"])
        return lines

    def shutdown(
        self, sessions: Iterable[Session], timeout: float | None = SHUTDOWN_DRAIN_S
    ) -> int:
        """Finish the queued checkpoint writes (within `timeout`), then save every
        session worth keeping (SIGTERM/SIGINT, after draining); blocking."""
        if self.disk is None:
            return 0
        n = self.kv.shutdown(sessions, timeout)
        log.info("kv cache: %d shutdown checkpoint(s) written", n)
        return n

    def close(self) -> None:
        self.trace.close()


def _strip_billing(text: str) -> str:
    out = strip_billing_header(text)
    # the line usually opens the system text: do not leave the blank line after it
    return out.lstrip("\n") if out != text and not text.startswith("\n") else out


def _family(name: str, kind: str, text: str, samples: list[str]) -> list[str]:
    return [f"# HELP {name} {text}", f"# TYPE {name} {kind}", *samples]


class CacheView:
    """The disk cache's admin surface before (and after) the model is loaded: the cache
    needs the model's fingerprint, the admin socket is up earlier. Every method reads or
    changes the directory: blocking, run it on a worker thread."""

    def __init__(self, get: Callable[[], DiskCache | None]) -> None:
        self._get = get
        self._budget: int | None = None

    def _cache(self) -> DiskCache:
        cache = self._get()
        if cache is None:
            raise RuntimeError(
                "the disk KV cache is not available (model loading or kv_disk = false)"
            )
        return cache

    def ls(self) -> list[dict[str, Any]]:
        return self._cache().ls()

    def evict(
        self,
        prefix: str | None = None,
        *,
        everything: bool = False,
        older_than_s: float | None = None,
    ) -> list[str]:
        return self._cache().evict(prefix, everything=everything, older_than_s=older_than_s)

    def stats_dict(self) -> dict[str, Any]:
        return self._cache().stats_dict()

    @property
    def budget(self) -> int:
        cache = self._get()
        return cache.budget if cache is not None else (self._budget or 0)

    def set_budget(self, value: int) -> list[str]:
        """A new size limit in bytes, evicting what no longer fits; the names removed."""
        self._budget = value
        cache = self._get()
        if cache is None:
            return []
        return cache.set_budget(value)
