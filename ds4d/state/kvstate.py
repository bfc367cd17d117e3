"""The state layer wired together for the daemon: disk cache, save policy, tool memory.

A slot's sync is: `plan` (matching order) -> `save_evict` when the plan throws a long
live session away -> `begin` -> `load_disk` for a disk hit (verified, with the reuse
shortfall check) -> prefill the rest, pausing at `stops` (cold boundary, continued
frontiers) to `checkpoint` while the session is exactly there — a session is never
rolled back to make an entry (ds4d.state.sync strings these pieces together as engine
calls). The decode loop calls `after_token`; SIGTERM calls `shutdown`.

Saves are off the critical path: `_save` copies the session's payload (Session.snapshot,
a memcpy on the engine thread) and hands it to the disk cache's background writer, so
the slot is free at once. A checkpoint extending the session's previous one (same
tokens up to it, checked by digest) is a delta of the new rows only; every
`max_chain` links a full file starts a new chain.

Steering: the disk cache holds KV computed under one steering, the one its fingerprint
names (`steering_key`, '' for none: the daemon's at start). A session steered otherwise
(a request's own steering, a live change) neither restores from it nor saves to it; its
resident KV still serves the next turn under the same steering.

Sessions are the engine's (ds4d.engine.engine.Session): tokens, eval, rewind, save, load,
snapshot(start) and supports_delta. Every method that touches a session or the disk
blocks: run it on a worker thread.
"""

from __future__ import annotations

import hashlib
import io
import logging
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ds4d.engine.engine import Session
from ds4d.engine.tokenizer_api import ModelTokenizer
from ds4d.state import kvfile
from ds4d.state.diskcache import DiskCache, DiskMatch
from ds4d.state.kvfile import Reason
from ds4d.state.matching import Plan, disk_effective, plan_sync
from ds4d.state.savepolicy import SavePolicy
from ds4d.state.toolmemory import ToolMemory

log = logging.getLogger("ds4d.kvcache")

MAX_CHAIN = 8  # delta links on a full file before the next checkpoint is full again


@dataclass(frozen=True)
class _Link:
    """The last checkpoint of a session's tokens: what its next one may be a delta of."""

    name: str
    tokens: int
    depth: int
    digest: bytes  # token_digest of its tokens


@dataclass
class _SessionState:
    last_stored: int = 0  # continued frontier already on disk
    tool_ids: set[str] = field(default_factory=set)  # ids of the conversation it holds
    chain: _Link | None = None
    reused: bool = False  # the current request continued cached state (memory or disk)


def _digest(tokens: Sequence[int]) -> bytes:
    """The engine's token digest (sha256 of little-endian int32): what a delta names."""
    return hashlib.sha256(np.asarray(tokens, dtype="<i4").tobytes()).digest()


class KVState:
    def __init__(
        self,
        tokenizer: ModelTokenizer,
        n_ctx: int,
        *,
        disk: DiskCache | None = None,
        policy: SavePolicy | None = None,
        tool_memory: ToolMemory | None = None,
        can_rewind: bool = True,
        max_chain: int = MAX_CHAIN,
        steering_key: str = "",
    ) -> None:
        """`steering_key`: the steering (Steering.key, '' for none) every checkpoint in
        `disk` was computed under."""
        self.tokenizer = tokenizer
        self.steering_key = steering_key
        self.n_ctx = n_ctx
        self.disk = disk
        self.policy = policy or SavePolicy.for_context(n_ctx)
        if disk is not None and disk.min_tokens != self.policy.min_tokens:
            raise ValueError("the disk cache and the save policy need one min_tokens")
        self.tool_memory = tool_memory if tool_memory is not None else ToolMemory()
        self.can_rewind = can_rewind
        self.max_chain = max_chain
        self._lock = threading.Lock()
        self._state: weakref.WeakKeyDictionary[Session, _SessionState] = weakref.WeakKeyDictionary()

    def uses_disk(self, session: Session) -> bool:
        """Whether the disk cache may restore into this session and save it: there is one,
        and it holds the steering the session runs under."""
        return self.disk is not None and session.steering_key == self.steering_key

    def _st(self, session: Session) -> _SessionState:
        with self._lock:
            return self._state.setdefault(session, _SessionState())

    def encode_suffix(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, special=True)

    def encode_after(self, held: Sequence[int], text: str) -> list[int]:
        """The tokens of `text` written after `held`: a text continuing a span (the last
        held token is not special) gets no SentencePiece space prefix."""
        tok = self.tokenizer
        if not held or tok.is_special(held[-1]):
            return self.encode_suffix(text)
        return tok.encode_continuation(text, special=True)

    def decode(self, tokens: Sequence[int]) -> str | None:
        """The text a slot holding `tokens` is matched by (see `key_text`)."""
        return self.key_text(tokens)

    def key_text(self, tokens: Sequence[int]) -> str | None:
        """The text that tokenizes to `tokens`, a BOS as its text included (see
        `full_text`); None when there is none (their bytes end inside a character, or a
        SentencePiece span lacks the space its tokenizer puts first): such a key could
        never be a prompt's prefix."""
        return self.tokenizer.source_text(tokens)

    def full_text(self, prompt_text: str) -> str:
        """The rendered prompt as its tokens spell it: the BOS the tokenizer puts first
        when the template did not write it, written out (keys hold every token's text),
        and without the whitespace the tokenizer drops after a special token (keys cannot
        hold it: its tokens do not spell it)."""
        tok = self.tokenizer
        prompt_text = tok.canonical_text(prompt_text)
        bos = tok.bos_id
        if not tok.add_bos or bos is None:
            return prompt_text
        bos_text = tok.token_bytes(bos).decode(errors="replace")
        return prompt_text if prompt_text.startswith(bos_text) else bos_text + prompt_text

    # ---- the pieces a slot's sync is made of -------------------------------------------

    def plan(
        self,
        session: Session,
        prompt_text: str,
        prompt_tokens: Sequence[int],
        min_tokens: int | None = None,
    ) -> Plan:
        """`min_tokens`: the shortest partial reuse taken, when not the policy's (an
        editor's completion keeps any shared prefix: every token is a keystroke's wait)."""
        live = list(session.tokens)
        return plan_sync(
            live,
            self.full_text(prompt_text),
            prompt_tokens,
            decode=self.decode,
            encode=lambda text: self.encode_after(live, text),
            lookup=self.lookup if self.uses_disk(session) else None,
            can_rewind=self.can_rewind,
            min_tokens=self.policy.min_tokens if min_tokens is None else min_tokens,
        )

    def lookup(self, prompt_text: str) -> DiskMatch | None:
        if self.disk is None:
            return None
        return self.disk.lookup(self.full_text(prompt_text))

    def begin(self, session: Session, source: str, tool_ids: Iterable[str] = ()) -> None:
        """A request starts on `session` (after any evict save): a session that did not
        continue from its own memory starts its continued frontiers afresh."""
        st = self._st(session)
        if source not in ("memory-token", "memory-text"):
            st.last_stored = 0
            st.chain = None
        st.reused = source != "none"
        st.tool_ids = set(tool_ids)

    def load_disk(self, session: Session, match: DiskMatch, prompt_text: str) -> list[int] | None:
        """Load `match` into `session`; the effective prompt tokens, or None (file moved
        aside, session emptied) when it cannot be used. Blocking."""
        assert self.disk is not None
        prompt_text = self.full_text(prompt_text)
        loaded = self.disk.load(match, prompt_text)
        if loaded is None:
            return None
        try:
            for payload in loaded.payloads:  # a delta's chain, base first
                session.load(io.BytesIO(payload))
        except Exception as e:  # the engine refused it (version, layout, ctx)
            log.warning("kv cache: engine refused %s: %s", loaded.entry.name, e)
            self.disk.reject(loaded.entry, str(e))
            session.rewind(0)
            return None
        bad = self._implausible(session)
        if bad is not None:  # checksums can be right and the content still wrong
            log.warning("kv cache: refusing %s: %s", loaded.entry.name, bad)
            session.rewind(0)
            self.disk.reject(loaded.entry, bad)
            return None
        reused = len(session.tokens)
        self.disk.check_reuse(match.tokens, reused, loaded.entry.name)
        if reused != match.tokens:
            session.rewind(0)
            self.disk.reject(loaded.entry, f"holds {reused} tokens, header says {match.tokens}")
            return None
        self.tool_memory.update(loaded.tool_map)
        st = self._st(session)
        st.last_stored = reused
        st.reused = True
        st.chain = _Link(loaded.entry.name, reused, loaded.entry.header.depth,
                         _digest(session.tokens))  # fmt: skip
        log.info(
            "kv cache hit text tokens=%d text=%d file=%s",
            reused,
            len(loaded.text.encode()),
            loaded.entry.name,
        )
        held = list(session.tokens)
        return disk_effective(
            held, loaded.text, prompt_text, lambda text: self.encode_after(held, text)
        )

    def _implausible(self, session: Session) -> str | None:
        """Why a restored session cannot be this model's state for this context, or None:
        every token id must be in the vocabulary, and the session must leave room in the
        context for the next token (positions stay below n_ctx)."""
        tokens = session.tokens
        n_vocab = self.tokenizer.n_vocab
        if len(tokens) >= self.n_ctx:
            return f"holds {len(tokens)} tokens, positions reach the context of {self.n_ctx}"
        if tokens and not 0 <= min(tokens) <= max(tokens) < n_vocab:
            return (
                f"holds token ids {min(tokens)}..{max(tokens)} outside the vocabulary "
                f"[0, {n_vocab})"
            )
        return None

    def stops(self, start: int, total: int, cached: int) -> list[tuple[int, Reason]]:
        """Where a prefill from `start` to `total` tokens must pause for a checkpoint:
        the cold boundary (complete misses only) and continued frontiers."""
        if self.disk is None:
            return []
        out: dict[int, Reason] = {}
        frontier = self.policy.next_continued(start)
        while frontier is not None and frontier <= total:
            out[frontier] = Reason.CONTINUED
            frontier = self.policy.next_continued(frontier)
        cold = self.policy.cold_boundary(total, cached)
        if cold is not None and start < cold <= total:
            out[cold] = Reason.COLD  # a continued frontier there is not written twice
        return sorted(out.items())

    def checkpoint(self, session: Session, reason: Reason) -> bool:
        """Save at a stop returned by `stops` (continued only if still due). Blocking."""
        if reason == Reason.CONTINUED:
            if not self.policy.continued_due(len(session.tokens), self._st(session).last_stored):
                return False
        return self._save(session, reason)

    def save_evict(self, session: Session) -> bool:
        """Save what a session is about to lose to an unrelated prompt. Blocking."""
        return self.save_session(session, Reason.EVICT)

    # ---- saves -------------------------------------------------------------------------

    def _save(self, session: Session, reason: Reason, background: bool = True) -> bool:
        """Checkpoint the session as it is now. With the disk cache's writer (and
        `background`), only a copy is taken here and the file is written later. True when
        the save was written or queued."""
        if self.disk is None or not self.uses_disk(session):
            return False
        tokens = list(session.tokens)
        if len(tokens) < self.policy.min_tokens:
            return False
        text = self.key_text(tokens)
        if text is None:
            log.debug("kv cache: not saving %d tokens ending inside a character", len(tokens))
            return False
        st = self._st(session)
        ids = st.tool_ids
        tool_map = self.tool_memory.select(ids) if ids else None
        likely = reason == Reason.CONTINUED or st.reused
        link = self._delta_base(session, st, tokens)
        start = link.tokens if link is not None else 0
        disk = self.disk
        if not likely and disk.over_write_budget(disk.estimate_size(text, len(tokens) - start,
                                                                    tool_map)):  # fmt: skip
            disk.stats.skipped_daily_budget += 1
            log.info("kv cache: daily write budget reached; not saving %d tokens", len(tokens))
            return False
        # a copy of the payload (a memcpy): the session may change once this returns; the
        # one part of a save on the critical path, so its time is counted
        copying = time.perf_counter()
        snap = session.snapshot(start)
        disk.stats.snapshot_seconds += time.perf_counter() - copying
        base = link.name if link is not None else None
        depth = link.depth + 1 if link is not None else 0
        if background:
            ok = disk.submit(
                (likely, reason.is_anchor, len(tokens)), reason, text, len(tokens), snap.write,
                tool_map, snap.nbytes, base=base, depth=depth, likely_reused=likely,
            )  # fmt: skip
        else:
            saved = disk.save(reason, text, len(tokens), snap.write, tool_map, snap.nbytes,
                              base=base, depth=depth, likely_reused=likely)  # fmt: skip
            ok = saved is not None
        if not ok:
            return False
        st.chain = _Link(kvfile.file_name(text), len(tokens), link.depth + 1 if link else 0,
                         _digest(tokens))  # fmt: skip
        if reason in (Reason.COLD, Reason.CONTINUED):
            st.last_stored = max(st.last_stored, len(tokens))
        return True

    def _delta_base(self, session: Session, st: _SessionState, tokens: list[int]) -> _Link | None:
        """The checkpoint this save may extend: the session's last one, if the session
        still holds its tokens, it is on disk (or queued) and the chain is not too long."""
        link = st.chain
        if link is None or self.disk is None or not session.supports_delta:
            return None
        if link.depth + 1 > self.max_chain or not link.tokens < len(tokens):
            return None
        if _digest(tokens[: link.tokens]) != link.digest or not self.disk.has(link.name):
            return None
        return link

    def after_token(self, session: Session) -> bool:
        """Decode-loop hook: a continued checkpoint when the session reaches a frontier."""
        return self.uses_disk(session) and self.checkpoint(session, Reason.CONTINUED)

    def next_frontier(self, session: Session) -> int | None:
        """The length at which the decode loop's next continued checkpoint falls (None
        when none will): a step that adds several tokens at once must stop there, not
        step over it."""
        if not self.uses_disk(session):
            return None
        return self.policy.next_continued(session.n_tokens)

    def remember_tool_call(self, session: Session, call_id: str, sampled_text: str) -> None:
        """A call the model just made: its exact text, for replay in later turns."""
        self.tool_memory.remember(call_id, sampled_text)
        self._st(session).tool_ids.add(call_id)

    def save_session(self, session: Session, reason: Reason = Reason.SHUTDOWN,
                     background: bool = True) -> bool:  # fmt: skip
        """Save the whole live session (shutdown, evict): queued for the background writer
        when there is one, else written now."""
        return self.policy.worth_saving(len(session.tokens)) and self._save(
            session, reason, background
        )

    def drain(self, timeout: float | None = None) -> bool:
        """Wait for the queued checkpoint writes; False if `timeout` passed first."""
        writer = self.disk.writer if self.disk is not None else None
        return writer is None or writer.drain(timeout)

    def shutdown(self, sessions: Iterable[Session], timeout: float | None = None) -> int:
        """SIGTERM/SIGINT: the queued writes are finished (within `timeout`), then every
        session worth keeping goes to disk, written now. Returns files saved. Never
        raises: a session that cannot be saved is logged and the others still are."""
        if not self.drain(timeout):
            log.warning("kv cache: pending checkpoint writes did not finish in %ss", timeout)
        saved = 0
        for n, session in enumerate(sessions):
            try:
                saved += self.save_session(session, Reason.SHUTDOWN, background=False)
            except Exception as e:  # noqa: BLE001 - one bad session must not cost the rest
                log.warning("kv cache: shutdown save of slot %d failed: %s", n, e)
        return saved
