"""`--trace FILE`: one JSON line per request with the cache decision and timings.

The file holds prompt-derived data, so it is created 0600 (and an existing file is
narrowed to 0600). Tracing can be switched on, off or to another file at runtime; writes
and switches are serialised by one lock, so a line is never torn.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO

CacheSource = Literal["memory-token", "memory-text", "disk-text", "none"]


@dataclass
class TraceRecord:
    api: str  # "chat" | "completions" | "responses" | "messages"
    slot: int
    prompt_tokens: int
    cache_source: CacheSource
    cached_tokens: int
    prefill_s: float
    decode_s: float
    generated_tokens: int
    finish_reason: str
    disk_file: str | None = None
    time: float = field(default_factory=time.time)
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. shortfall, tool_replay counts


@dataclass
class GenerationRecord:
    """One request's generation as it goes, from its slot to its end: the log line,
    /metrics and the trace line all read this one record, so they cannot disagree."""

    api: str  # "chat" | "completions" | "responses" | "messages"
    prompt_tokens: int  # as tokenized; once the slot is synced, the effective prompt's
    slot: int = -1
    cached_tokens: int = 0  # prompt tokens reused, not prefilled
    cache_source: CacheSource = "none"
    prefilled_tokens: int = 0
    prefill_s: float = 0.0
    generated_tokens: int = 0
    drafted_tokens: int = 0  # speculation: tokens drafted and verified
    accepted_tokens: int = 0  # of them, kept (each one a decode step saved)
    decode_s: float = 0.0
    finish: str = "error"  # a Finish reason, or "cancelled"
    ttft_s: float | None = None  # arrival to the first generated text or call
    miss_reason: str = ""  # why no cached state was reused, when none was
    disk_file: str | None = None  # the checkpoint a disk hit loaded
    malformed_call: str | None = None  # why a call block was dropped
    output: str | None = None  # what was generated (collected only for trace_content)


class TraceWriter:
    def __init__(
        self, path: str | os.PathLike[str] | None = None, include_text: bool = False
    ) -> None:
        self._lock = threading.Lock()
        self._file: TextIO | None = None
        self.path: Path | None = None
        self.include_text = include_text
        if path is not None:
            self.open(path, include_text)

    @property
    def enabled(self) -> bool:
        return self._file is not None

    def open(self, path: str | os.PathLike[str], include_text: bool | None = None) -> None:
        """Start (or move) tracing to `path`, appending; the file is made 0600."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)
        f = os.fdopen(fd, "a", encoding="utf-8", buffering=1)
        with self._lock:
            old, self._file, self.path = self._file, f, Path(path)
            if include_text is not None:
                self.include_text = include_text
        if old is not None:
            old.close()

    def close(self) -> None:
        with self._lock:
            old, self._file, self.path = self._file, None, None
        if old is not None:
            old.close()

    def write(
        self, record: TraceRecord, prompt: str | None = None, output: str | None = None
    ) -> None:
        """Append one line; `prompt`/`output` are written only when text is opted in."""
        if self._file is None:
            return
        data = asdict(record)
        extra = data.pop("extra")
        data["time"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.time)) + (
            f".{int(record.time % 1 * 1000):03d}Z"
        )
        data["prefill_s"] = round(record.prefill_s, 4)
        data["decode_s"] = round(record.decode_s, 4)
        data.update(extra)
        with self._lock:
            if self._file is None:
                return
            if self.include_text:
                data["prompt"] = prompt
                data["output"] = output
            self._file.write(json.dumps(data, ensure_ascii=False) + "\n")
