"""The disk KV cache: a directory of checkpoint files, budgeted, scored, evictable.

* Index: built from the headers at start; files that are corrupt, truncated or written
  for another model are logged and moved into `quarantine/` (never a crash), stale
  temporary files of dead writers are removed.
* Lookup: the entry whose rendered text is the longest byte prefix of a new prompt
  (the file name is the SHA1 of that text, so a candidate is checked by hashing the
  prompt's prefix of the same length).
* Load: header, text, checksum, fingerprint and context re-checked; a bad file is moved
  aside and the caller goes on cold. On success the hit count and last-used time are
  rewritten in place.
* Save: size estimated first (budget and daily write budget), written atomically,
  then the budget is enforced by evicting the lowest scores:
      score = (decayed hits + 1) * tokens / bytes     (hits halve every 6 h)
  doubled for anchors (cold/evict/shutdown); the file just written is protected unless
  it alone exceeds the budget. Quarantined files count against the budget and go first.

* Deltas: a checkpoint extending an earlier one of the same session holds only the new
  rows and names its base file (kvfile). Loading one reads and verifies every link of its
  chain, base first; a delta whose base is gone is deleted with it (eviction, admin evict,
  quarantine and the startup scan remove a file's descendants too), so the budget counts
  exactly the files that can still be loaded.
* Background writes: with a `writer` (ds4d.state.writer) `submit` queues a save; until it
  is written its name is pending: a lookup may return it, and `load` waits for the write.
* Write budget: past `daily_write_bytes` in the last 24 h, only saves a later request is
  likely to reuse (`likely_reused`: continued sessions, prefixes already hit) are written.

Thread-safe: saves and loads run in worker threads, `ls`/`evict`/`stats` on the admin
channel. Large file I/O happens outside the lock.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ds4d.state import kvfile
from ds4d.state.kvfile import Header, KVFileError, PayloadWriter, Reason
from ds4d.state.writer import CheckpointWriter, JobValue

log = logging.getLogger("ds4d.kvcache")

HIT_HALF_LIFE_S = 6 * 3600
PENDING_WAIT_S = 120.0  # longest a load waits for the pending write of its file
# A lookup's match (and its chain) is not evicted until it is loaded or this has passed:
# the save of the slot it replaces is written meanwhile and makes room in the budget.
PIN_S = 120.0
ADMISSION_SLACK = 1.01
# Eviction scores this close count as equal: a conversation's files differ in tokens per
# byte only by alignment and the rendered text, which must not outweigh recency.
SCORE_TIE = 1.01  # a file must fit the budget with 1% to spare
QUARANTINE_DIR = "quarantine"
DAY_S = 86400


@dataclass
class Entry:
    name: str
    path: Path
    header: Header
    pending: threading.Event | None = None  # set when a queued write of it has ended

    @property
    def base(self) -> str | None:
        return self.header.base_name

    @property
    def tokens(self) -> int:
        return self.header.tokens

    @property
    def size(self) -> int:
        return self.header.file_size

    def score(self, now_ms: int) -> float:
        h = self.header
        used = h.last_used_ms or h.created_ms
        eff_hits = 0.0
        if used:
            eff_hits = h.hits * 2.0 ** (-max(0, now_ms - used) / (HIT_HALF_LIFE_S * 1000))
            if eff_hits < 0.01:
                eff_hits = 0.0
        score = (eff_hits + 1.0) * h.tokens / h.file_size
        return score * 2.0 if h.reason.is_anchor else score

    def describe(self, now_ms: int) -> dict[str, Any]:
        h = self.header
        return {
            "name": self.name,
            "reason": h.reason.name.lower(),
            "tokens": h.tokens,
            "text_bytes": h.text_bytes,
            "bytes": h.file_size,
            "hits": h.hits,
            "ctx": h.ctx,
            "created": h.created_ms / 1000,
            "last_used": h.last_used_ms / 1000,
            "tool_ids": bool(h.tool_map_bytes),
            "score": self.score(now_ms),
            "base": h.base_name,
        }


@dataclass(frozen=True)
class DiskMatch:
    """A lookup result: `entry`'s text is the first `text_bytes` bytes of the prompt."""

    entry: Entry
    text_bytes: int

    @property
    def tokens(self) -> int:
        return self.entry.tokens

    @property
    def path(self) -> Path:
        return self.entry.path


@dataclass(frozen=True)
class Loaded:
    """A verified checkpoint: feed `payload` to Session.load, then tokenize only
    `prompt_text[len(text):]`."""

    entry: Entry
    text: str
    payload: bytes  # this file's engine payload (a delta's own rows only)
    tool_map: dict[str, str]
    chain: tuple[bytes, ...] = ()  # payloads to load in order, base first, ending with payload

    @property
    def payloads(self) -> tuple[bytes, ...]:
        return self.chain or (self.payload,)


@dataclass
class Stats:
    hits: int = 0
    misses: int = 0
    load_failures: int = 0
    shortfalls: int = 0
    files_written: int = 0
    bytes_written: int = 0
    evictions: int = 0
    evicted_bytes: int = 0
    quarantined: int = 0
    skipped_budget: int = 0
    skipped_daily_budget: int = 0
    deltas_written: int = 0
    delta_base_missing: int = 0
    snapshot_seconds: float = 0.0  # engine-thread time copying sessions for the writer


class DiskCache:
    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        budget_bytes: int,
        fingerprint: str | bytes,
        ctx: int,
        min_tokens: int = 512,
        daily_write_bytes: int | None = None,
        clock: Callable[[], float] = time.time,
        writer: CheckpointWriter | None = None,
    ) -> None:
        """`budget_bytes` 0 means unlimited; `daily_write_bytes` (default 4x the budget,
        None with an unlimited budget; 0 for none) caps bytes written in any 24 h window.
        `writer`: saves through `submit` are written by it (else at once)."""
        self.dir = Path(directory)
        self.budget = budget_bytes
        self.fingerprint = kvfile.fingerprint_digest(fingerprint)
        self.ctx = ctx
        self.min_tokens = min_tokens
        if daily_write_bytes is None and budget_bytes:
            daily_write_bytes = 4 * budget_bytes
        self.daily_write_bytes = daily_write_bytes or None
        self.clock = clock
        self.stats = Stats()
        self.writer = writer
        self._lock = threading.RLock()
        self._entries: dict[str, Entry] = {}
        self._pending: dict[str, Entry] = {}
        self._pins: dict[str, float] = {}  # name -> time.monotonic() the pin ends
        self._writes: collections.deque[tuple[float, int]] = collections.deque()
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.dir, 0o700)
        self.scan(startup=True)
        self.enforce_budget()

    # ---- index ----------------------------------------------------------------------

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    @property
    def quarantine_dir(self) -> Path:
        return self.dir / QUARANTINE_DIR

    def scan(self, startup: bool = False) -> None:
        """(Re)build the index from the directory's file headers. At startup, temporary
        files carrying our own pid are stale too (a previous run with a recycled pid)."""
        entries: dict[str, Entry] = {}
        for item in sorted(os.scandir(self.dir), key=lambda d: d.name):
            pid = kvfile.tmp_owner_pid(item.name)
            stale = pid is not None and ((startup and pid == os.getpid()) or not _pid_alive(pid))
            if not item.is_file(follow_symlinks=False):
                if stale and item.is_dir(follow_symlinks=False):  # a quarantine moved aside
                    shutil.rmtree(item.path, ignore_errors=True)
                continue
            if pid is not None:
                if stale:
                    log.info("kv cache: removing unfinished write %s", item.name)
                    Path(item.path).unlink(missing_ok=True)
                continue
            if not kvfile.is_kv_name(item.name):
                continue
            path = Path(item.path)
            try:
                header = kvfile.read_header(path)
                if header.fingerprint != self.fingerprint:
                    raise kvfile.ForeignModel(f"written for model {header.fingerprint.hex()[:12]}")
            except (KVFileError, OSError) as e:
                self._quarantine(path, e)
                continue
            entries[item.name] = Entry(item.name, path, header)
        with self._lock:
            self._entries = entries
            self._drop_orphans()
        log.info(
            "kv cache: %d files, %d bytes in %s",
            len(entries),
            sum(e.size for e in entries.values()),
            self.dir,
        )

    def _quarantine(self, path: Path, why: Exception | str) -> None:
        log.warning("kv cache: rejected %s: %s (moved to %s/)", path.name, why, QUARANTINE_DIR)
        self.stats.quarantined += 1
        with self._lock:
            self._entries.pop(path.name, None)
            self._drop_orphans()
        try:
            self.quarantine_dir.mkdir(mode=0o700, exist_ok=True)
            os.replace(path, self.quarantine_dir / path.name)
        except FileNotFoundError:
            pass
        except OSError as e:  # cannot move it: do not let it be read again
            log.warning("kv cache: cannot quarantine %s (%s); deleting it", path.name, e)
            path.unlink(missing_ok=True)

    def _descendants(self, name: str, children: dict[str, list[Entry]] | None = None
                     ) -> list[Entry]:  # fmt: skip
        """The deltas built on `name`, directly or through other deltas (lock held)."""
        if children is None:
            children = self._children()
        out: list[Entry] = []
        todo, seen = [name], {name}
        while todo:
            for e in children.get(todo.pop(), []):
                if e.name not in seen:
                    seen.add(e.name)
                    out.append(e)
                    todo.append(e.name)
        return out

    def _children(self) -> dict[str, list[Entry]]:
        out: dict[str, list[Entry]] = {}
        for e in self._entries.values():
            if e.base:
                out.setdefault(e.base, []).append(e)
        return out

    def _chain(self, name: str) -> set[str]:
        """`name` and the bases it is built on (lock held)."""
        out: set[str] = set()
        e = self._entries.get(name)
        while e is not None and e.name not in out:
            out.add(e.name)
            e = self._entries.get(e.base) if e.base else None
        return out

    def _drop_orphans(self) -> None:
        """Move aside the deltas whose chain misses a link (lock held): they can never be
        loaded, and like any unusable file they are kept for inspection, not deleted."""
        while True:
            orphan = next((e for e in self._entries.values()
                           if e.base and e.base not in self._entries), None)  # fmt: skip
            if orphan is None:
                return
            self._quarantine(orphan.path, f"its base {orphan.base} is gone")

    def has(self, name: str) -> bool:
        """Stored or queued for writing: a delta may be built on it."""
        with self._lock:
            return name in self._entries or name in self._pending

    def _quarantined(self) -> list[tuple[float, int, Path]]:
        if not self.quarantine_dir.is_dir():
            return []
        out = []
        for item in os.scandir(self.quarantine_dir):
            if item.is_file(follow_symlinks=False):
                st = item.stat(follow_symlinks=False)
                out.append((st.st_mtime, st.st_size, Path(item.path)))
        return sorted(out)

    def entries(self) -> list[Entry]:
        with self._lock:
            return list(self._entries.values())

    def bytes_used(self) -> int:
        with self._lock:
            used = sum(e.size for e in self._entries.values())
        return used + sum(size for _, size, _ in self._quarantined())

    # ---- lookup and load --------------------------------------------------------------

    def lookup(self, prompt_text: str) -> DiskMatch | None:
        """The usable entry whose text is the longest byte prefix of `prompt_text`."""
        prompt = prompt_text.encode()
        with self._lock:
            candidates = [
                e
                for e in [*self._entries.values(), *self._pending.values()]
                if e.header.text_bytes <= len(prompt)
                and e.tokens >= self.min_tokens
                and e.header.ctx <= self.ctx
                and e.tokens < self.ctx
            ]
        candidates.sort(key=lambda e: e.header.text_bytes)
        sha, fed, best = hashlib.sha1(), 0, None
        for e in candidates:
            n = e.header.text_bytes
            sha.update(prompt[fed:n])
            fed = n
            if sha.hexdigest() + kvfile.SUFFIX == e.name:
                if best is None or (n, e.tokens) > (best.header.text_bytes, best.tokens):
                    best = e
        if best is None:
            self.stats.misses += 1
            return None
        with self._lock:
            until = time.monotonic() + PIN_S
            for name in self._chain(best.name) | {best.name}:
                self._pins[name] = until
        return DiskMatch(best, best.header.text_bytes)

    def load(self, match: DiskMatch, prompt_text: str) -> Loaded | None:
        """Read and verify `match`'s file, and for a delta every link of its chain; None
        (bad file moved aside, logged) if unusable. A match whose write is still queued
        waits for it first."""
        try:
            return self._load(match, prompt_text)
        finally:
            with self._lock:
                for name in self._chain(match.entry.name) | {match.entry.name}:
                    self._pins.pop(name, None)

    def _load(self, match: DiskMatch, prompt_text: str) -> Loaded | None:
        entry = match.entry
        if entry.pending is not None:
            if not entry.pending.wait(PENDING_WAIT_S):
                log.warning("kv cache: %s is still being written; going on without it",
                            entry.name)  # fmt: skip
                return None
            with self._lock:
                written = self._entries.get(entry.name)
            if written is None:  # dropped or failed
                self.stats.misses += 1
                return None
            entry = written
        prefix = prompt_text.encode()[: match.text_bytes]
        links: list[tuple[Entry, Header, kvfile.Body]] = []
        name: str | None = entry.name
        current = entry.path
        try:
            while name is not None:
                with self._lock:
                    link = self._entries.get(name)
                if link is None:
                    raise FileNotFoundError(name)
                current = link.path
                header = kvfile.read_header(link.path)
                kvfile.check_compatible(header, self.fingerprint, self.ctx)
                if links and (not header.text_bytes < links[-1][1].text_bytes
                              or header.tokens >= links[-1][1].tokens):  # fmt: skip
                    raise kvfile.BadHeader(f"base {name} does not precede its delta")
                body = kvfile.read_body(link.path, header,
                                        expect_text=prefix[: header.text_bytes])  # fmt: skip
                links.append((link, header, body))
                name = header.base_name
                if len(links) > 64:
                    raise kvfile.BadHeader("delta chain too long")
        except FileNotFoundError:
            log.warning("kv cache: %s vanished before loading", entry.name)
            with self._lock:
                self._entries.pop(entry.name, None)
                self._drop_orphans()
            self.stats.load_failures += 1
            return None
        except (KVFileError, OSError, UnicodeDecodeError) as e:
            self.stats.load_failures += 1
            self._quarantine(current, e)  # its deltas go with it
            return None
        now = self._now_ms()
        touched: list[Entry] = []
        for link, header, _ in links:  # the whole chain was used: none is evicted first
            fresh_header = dataclasses.replace(header, hits=header.hits + 1, last_used_ms=now)
            try:
                kvfile.touch(link.path, fresh_header.hits, now)
            except OSError as e:
                log.warning("kv cache: cannot update %s: %s", link.name, e)
            touched.append(Entry(link.name, link.path, fresh_header))
        with self._lock:
            for fresh in touched:
                if fresh.name in self._entries:
                    self._entries[fresh.name] = fresh
        self.stats.hits += 1
        top = links[0][2]
        chain = tuple(body.payload for _, _, body in reversed(links))
        return Loaded(touched[0], top.text, top.payload, top.tool_map, chain)

    def reject(self, entry: Entry, why: str) -> None:
        """The engine refused a payload that passed our checks: move the file aside."""
        self.stats.load_failures += 1
        self._quarantine(entry.path, why)

    def check_reuse(self, promised: int, reused: int, name: str) -> bool:
        """After a disk hit: did the session keep the tokens the entry promised?
        A shortfall means a restore that reuses nothing — log it loudly and count it."""
        if reused >= promised:
            return True
        self.stats.shortfalls += 1
        log.error("kv cache: SHORTFALL %s promised %d tokens, reused %d", name, promised, reused)
        return False

    def tool_maps(self, wanted: set[str] | None = None) -> dict[str, str]:
        """Tool-call ids stored in any file's tool-map section (optionally only `wanted`):
        replay of a conversation whose live state was lost, e.g. after a restart."""
        out: dict[str, str] = {}
        for e in self.entries():
            if not e.header.tool_map_bytes:
                continue
            try:
                found = kvfile.read_tool_map(e.path, e.header)
            except (KVFileError, OSError, UnicodeDecodeError):
                continue  # the checksum check on load will deal with the file
            out.update(found if wanted is None else {k: v for k, v in found.items() if k in wanted})
        return out

    # ---- save --------------------------------------------------------------------------

    def estimate_size(self, text: str, tokens: int, tool_map: Mapping[str, str] | None) -> int:
        """File size expected for a checkpoint, from the largest payload bytes/token seen
        so far (0 payload bytes when nothing is known yet)."""
        with self._lock:
            rate = max(
                (e.header.payload_bytes / e.tokens for e in self._entries.values()), default=0.0
            )
        return (
            kvfile.HEADER_SIZE
            + len(text.encode())
            + len(kvfile.encode_tool_map(tool_map or {}))
            + int(rate * tokens)
        )

    def _fits(self, size: int) -> bool:
        return not self.budget or size * ADMISSION_SLACK <= self.budget

    def _written_today(self, now: float) -> int:
        while self._writes and self._writes[0][0] <= now - DAY_S:
            self._writes.popleft()
        return sum(n for _, n in self._writes)

    def over_write_budget(self, incoming: int = 0) -> bool:
        """Would `incoming` more bytes pass the daily write budget?"""
        if self.daily_write_bytes is None:
            return False
        with self._lock:
            return self._written_today(self.clock()) + incoming > self.daily_write_bytes

    def written_today(self) -> int:
        with self._lock:
            return self._written_today(self.clock())

    def save(
        self,
        reason: Reason,
        text: str,
        tokens: int,
        payload: bytes | PayloadWriter,
        tool_map: Mapping[str, str] | None = None,
        payload_estimate: int | None = None,
        *,
        base: str | None = None,
        depth: int = 0,
        likely_reused: bool = False,
    ) -> Entry | None:
        """Store a checkpoint of a session holding `tokens` tokens whose detokenized text
        is `text`; `payload` is the engine payload or Session.save (with `base`, a delta
        payload on that stored file). None when skipped. Past the daily write budget only
        a save `likely_reused` is written."""
        if tokens < self.min_tokens or tokens >= self.ctx or not text:
            return None
        name = kvfile.file_name(text)
        tool_map = dict(tool_map or {})
        existing = self._entries.get(name)
        if existing is not None and self._refresh_existing(existing, tool_map):
            return self._entries.get(name)
        if base is not None:
            with self._lock:
                base_entry = self._entries.get(base)
            if base_entry is None or base_entry.tokens >= tokens or base == name:
                self.stats.delta_base_missing += 1
                log.info("kv cache: not saving a delta of %d tokens: base %s is gone", tokens,
                         base)  # fmt: skip
                return None
        estimate = self.estimate_size(text, tokens, tool_map)
        if payload_estimate is not None:
            estimate = (
                kvfile.HEADER_SIZE
                + len(text.encode())
                + payload_estimate
                + len(kvfile.encode_tool_map(tool_map))
            )
        if not self._fits(estimate):
            self.stats.skipped_budget += 1
            log.info(
                "kv cache: not saving %d tokens, ~%d bytes exceed the budget", tokens, estimate
            )
            return None
        now = self.clock()
        if not likely_reused and self.over_write_budget(estimate):
            self.stats.skipped_daily_budget += 1
            log.warning("kv cache: daily write budget of %s bytes reached; not saving %d "
                        "tokens", self.daily_write_bytes, tokens)  # fmt: skip
            return None
        protect = {name} | (self._chain(base) if base else set())
        if self.budget:  # make room first so the directory stays within budget
            self.enforce_budget(incoming=estimate, protect=protect)
        if base is not None and not self.has(base):  # evicted to make room after all
            self.stats.delta_base_missing += 1
            return None
        started = time.monotonic()
        try:
            path, header = kvfile.write_file(
                self.dir,
                text,
                payload,
                reason=reason,
                tokens=tokens,
                ctx=self.ctx,
                fingerprint=self.fingerprint,
                tool_map=tool_map,
                now=self._now_ms(),
                max_bytes=int(self.budget / ADMISSION_SLACK) if self.budget else None,
                base=base,
                depth=depth,
            )
        except OverflowError as e:
            self.stats.skipped_budget += 1
            log.info("kv cache: not saving: %s", e)
            return None
        except (KVFileError, OSError) as e:
            log.warning("kv cache: save of %d tokens failed: %s", tokens, e)
            return None
        entry = Entry(path.name, path, header)
        with self._lock:
            self._entries[path.name] = entry
            self._writes.append((now, header.file_size))
            self.stats.files_written += 1
            self.stats.bytes_written += header.file_size
            if base is not None:
                self.stats.deltas_written += 1
            self._drop_orphans()  # the base may have been evicted while this was written
            kept = path.name in self._entries
        if not kept:
            self.stats.delta_base_missing += 1
            return None
        log.info("kv cache stored tokens=%d reason=%s size=%d save=%.3fs file=%s%s", tokens,
                 reason.name.lower(), header.file_size, time.monotonic() - started, path.name,
                 f" delta-of={base}" if base else "")  # fmt: skip
        self.enforce_budget(protect=protect)
        return entry

    def submit(
        self,
        value: JobValue,
        reason: Reason,
        text: str,
        tokens: int,
        payload: bytes | PayloadWriter,
        tool_map: Mapping[str, str] | None = None,
        payload_estimate: int | None = None,
        *,
        base: str | None = None,
        depth: int = 0,
        likely_reused: bool = False,
    ) -> bool:
        """`save` on the writer thread (inline without a writer); `value` ranks it in the
        writer's queue. Until it is written the name is pending: `lookup` may return it
        and `load` then waits. False when the save was dropped at once (queue full)."""

        def save() -> Entry | None:
            return self.save(reason, text, tokens, payload, tool_map, payload_estimate,
                             base=base, depth=depth, likely_reused=likely_reused)  # fmt: skip

        if self.writer is None:
            return save() is not None
        name = kvfile.file_name(text)
        done = threading.Event()
        now = self._now_ms()
        header = Header(reason, 0, self.ctx, self.fingerprint, tokens, now,
                        len(text.encode()), 1, 0, 0, 0, now)  # fmt: skip
        with self._lock:
            self._pending[name] = Entry(name, self.dir / name, header, done)

        def finish() -> None:
            with self._lock:
                if self._pending.get(name) is not None and self._pending[name].pending is done:
                    del self._pending[name]
            done.set()

        def run() -> None:
            try:
                save()
            finally:
                finish()

        held = payload_estimate if payload_estimate is not None else (
            len(payload) if isinstance(payload, bytes) else 0)  # fmt: skip
        return bool(self.writer.submit(run, value, on_drop=finish, nbytes=held))

    def _refresh_existing(self, entry: Entry, tool_map: dict[str, str]) -> bool:
        """Same text already stored: only refresh it. False when it must be rewritten
        (it lacks some of `tool_map`'s ids, or it is no longer valid)."""
        try:
            header = kvfile.read_header(entry.path)
            known = kvfile.read_tool_map(entry.path, header)
        except (KVFileError, OSError, UnicodeDecodeError):
            return False
        if any(known.get(k) != v for k, v in tool_map.items()):
            tool_map.update({k: v for k, v in known.items() if k not in tool_map})
            return False
        now = self._now_ms()
        try:
            kvfile.touch(entry.path, header.hits, now)
        except OSError:
            return False
        with self._lock:
            self._entries[entry.name] = Entry(
                entry.name, entry.path, Header(**{**header.__dict__, "last_used_ms": now})
            )
        return True

    # ---- budget and eviction -------------------------------------------------------------

    def set_budget(self, budget_bytes: int) -> list[str]:
        """Live reload of the size limit (0 = unlimited), evicting what no longer fits;
        the names removed."""
        self.budget = budget_bytes
        return self.enforce_budget()

    def enforce_budget(self, protect: str | set[str] | None = None,
                       incoming: int = 0) -> list[str]:  # fmt: skip
        """Delete lowest-score files until everything (plus `incoming` bytes about to be
        written) fits the budget; a file goes with the deltas built on it. Returns the
        names removed. The index changes under the lock; the files are deleted after it,
        so a large eviction never holds up the threads that save and load."""
        if not self.budget:
            return []
        protected = {protect} if isinstance(protect, str) else set(protect or ())
        removed: list[str] = []
        doomed: list[Path] = []
        with self._lock:
            mono = time.monotonic()
            self._pins = {n: t for n, t in self._pins.items() if t > mono}
            protected |= set(self._pins)
            quarantined = self._quarantined()
            total = (
                incoming
                + sum(s for _, s, _ in quarantined)
                + sum(e.size for e in self._entries.values())
            )
            for _, size, path in quarantined:  # worthless for reuse: they go first
                if total <= self.budget:
                    break
                doomed.append(path)  # nothing else reads the quarantine
                total -= size
            now = self._now_ms()
            stuck = False
            while total > self.budget and self._entries and not stuck:
                children = self._children()
                keys = {
                    e.name: self._eviction_key(e, now, protected, children)
                    for e in self._entries.values()
                }
                lowest = min(k[0] for k in keys.values())
                if lowest == float("inf"):
                    break  # only what is being written and its chain are left
                # scores within SCORE_TIE of the lowest tie: the least recently used goes
                victim = self._entries[
                    min((k[1], k[2]) for k in keys.values() if k[0] <= lowest * SCORE_TIE)[1]
                ]
                for e in [victim, *self._descendants(victim.name, children)]:
                    try:
                        doomed += self._doom(e.path)
                    except OSError as err:  # it stays indexed; stop evicting for now
                        log.warning("kv cache: cannot evict %s: %s", e.name, err)
                        stuck = True
                        break
                    del self._entries[e.name]
                    total -= e.size
                    removed.append(e.name)
                    self.stats.evictions += 1
                    self.stats.evicted_bytes += e.size
                    log.info("kv cache evicted reason=disk-cache-full tokens=%d size=%d file=%s",
                             e.tokens, e.size, e.name)  # fmt: skip
        _delete(doomed)
        return removed

    def _doom(self, path: Path) -> list[Path]:
        """Move `path` aside for deletion after the lock (lock held): its new path, or
        none when it is gone already. OSError when it cannot be moved."""
        gone = path.with_name(kvfile.doomed_name(path.name))
        try:
            os.rename(path, gone)
        except FileNotFoundError:
            return []
        return [gone]

    def _eviction_key(self, e: Entry, now: int, protected: set[str],
                      children: dict[str, list[Entry]]) -> tuple[float, int, str]:  # fmt: skip
        """Lowest first. A file goes with the deltas built on it, so its score is that of
        the family: the most valuable member's tokens (and hits) over the family's bytes,
        and it was used when the last of them was."""
        family = [e, *self._descendants(e.name, children)]
        guarded = any(f.name in protected for f in family) and e.size <= self.budget
        value = max(f.score(now) * f.size for f in family) / sum(f.size for f in family)
        score = float("inf") if guarded else value
        used = max(f.header.last_used_ms or f.header.created_ms for f in family)
        return (score, used, e.name)

    # ---- admin -------------------------------------------------------------------------

    def ls(self) -> list[dict[str, Any]]:
        now = self._now_ms()
        return sorted(
            (e.describe(now) for e in self.entries()), key=lambda d: d["last_used"], reverse=True
        )

    def evict(
        self,
        prefix: str | None = None,
        *,
        everything: bool = False,
        older_than_s: float | None = None,
    ) -> list[str]:
        """Remove entries by name prefix, all of them, or those unused for `older_than_s`.
        Returns the names removed (the files are deleted after the index lock, as in
        enforce_budget)."""
        if prefix is None and not everything and older_than_s is None:
            raise ValueError("evict needs a name prefix, everything=True or older_than_s")
        now = self._now_ms()
        removed = []
        doomed: list[Path] = []
        with self._lock:
            for e in list(self._entries.values()):
                used = e.header.last_used_ms or e.header.created_ms
                if prefix is not None and not e.name.startswith(prefix.lower()):
                    continue
                if older_than_s is not None and now - used < older_than_s * 1000:
                    continue
                for d in [e, *self._descendants(e.name)]:
                    if d.name not in self._entries:
                        continue
                    doomed += self._doom(d.path)
                    del self._entries[d.name]
                    removed.append(d.name)
                    self.stats.evictions += 1
                    self.stats.evicted_bytes += d.size
            if everything and self.quarantine_dir.is_dir():
                doomed.append(self.quarantine_dir.rename(
                    self.dir / kvfile.doomed_name(QUARANTINE_DIR)))  # fmt: skip
        _delete(doomed)
        return removed

    def stats_dict(self) -> dict[str, Any]:
        with self._lock:
            n = len(self._entries)
            deltas = sum(1 for e in self._entries.values() if e.base)
        writer = self.writer
        return {
            **self.stats.__dict__,
            "entries": n,
            "delta_entries": deltas,
            "bytes_used": self.bytes_used(),
            "budget_bytes": self.budget,
            "daily_write_bytes": self.daily_write_bytes,
            "bytes_written_today": self.written_today(),
            "pending_writes": writer.pending if writer is not None else 0,
            "pending_bytes": writer.pending_bytes if writer is not None else 0,
            "dropped_queue_full": writer.dropped if writer is not None else 0,
            "dir": str(self.dir),
        }


def _delete(paths: list[Path]) -> None:
    """Delete files (or a moved-aside directory) that left the index; a failure is
    logged, never raised: the scan at the next start removes what is left."""
    for path in paths:
        try:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        except OSError as e:
            log.warning("kv cache: cannot delete %s: %s", path.name, e)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
