"""A slot's recent completion states: the KV of prompts an editor sent lately, kept in
memory so that a user who returns to one (a backspace, an undo, the cursor moving back)
costs no evaluation at all.

Each state is kept as a delta (`Session.snapshot(start)`): the tokens, KV rows and
next-token logits after its first `start` tokens, where `start` is how much of it the
slot already held when it was computed, so an entry is the size of what its request
evaluated. An entry loads back into a session holding exactly its first `start` tokens:
the live session when it still shares them, else another entry that holds them (loaded
first, then rewound to `start`). When the live session is about to drop rows an entry
stands on, those rows are kept first as an entry of their own (a bridge), so moving the
cursor up and back down finds the way back.

Entries are bounded in bytes (`budget_bytes`), the oldest dropped first; of a state larger
than a quarter of the budget (it would push out the recent ones it is for) only its last
token is kept (its row and logits: the same prompt again costs nothing while the session
holds the rest).
Everything here runs where the session's evaluations are serialized (the engine thread),
except `route`, which only reads the entries (the slot is the caller's meanwhile).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from ds4d.engine.engine import Session
from ds4d.engine.errors import EngineError
from ds4d.state.matching import common_prefix

log = logging.getLogger(__name__)

# at most this many entries per slot: a route is searched over all of them
MAX_ENTRIES = 32


@dataclass(frozen=True, eq=False)
class Remembered:
    """One kept state: the tokens it holds and the delta payload after `start` of them."""

    tokens: list[int]
    start: int
    payload: bytes  # Session.load reads it into a session holding tokens[:start]
    steering_key: str
    has_logits: bool  # the state ends where its next-token logits were computed

    @property
    def nbytes(self) -> int:
        return len(self.payload) + 8 * len(self.tokens)


@dataclass(frozen=True)
class Route:
    """How a session reaches a kept state: the entries to load in order (each into the
    session rewound to its `start`), and how much of the prompt the last one holds."""

    chain: tuple[Remembered, ...]
    shared: int  # prompt tokens kept from the restored state (all: it is the prompt's)

    @property
    def target(self) -> Remembered:
        return self.chain[-1]


class RecentStates:
    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = max(0, int(budget_bytes))
        self._entries: list[Remembered] = []  # oldest first
        self._nbytes = 0

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def __len__(self) -> int:
        return len(self._entries)

    # -- reading (a worker thread, the slot held by the caller) -----------------------------

    def route(self, live: Sequence[int], prompt: Sequence[int], steering_key: str = ""
              ) -> Route | None:  # fmt: skip
        """The kept state sharing the most with `prompt`, and the way to it from a session
        holding `live`, when it shares more than `live` does; else None."""
        if not self._entries:
            return None
        live = list(live)
        best: Route | None = None
        floor = common_prefix(live, prompt)
        if floor == len(prompt) < len(live):
            floor -= 1  # the rewind would lose the logits: the last token evaluated again
        reach: dict[int, tuple[Remembered, ...] | None] = {}
        for e in sorted(self._entries, key=lambda e: -len(e.tokens)):
            if e.steering_key != steering_key:
                continue
            shared = common_prefix(e.tokens, prompt)
            if not shared == len(e.tokens) == len(prompt):
                shared = min(shared, len(prompt) - 1)  # logits only from an evaluation
            if shared <= floor or (best is not None and shared <= best.shared):
                continue
            chain = self._reach(e, live, reach)
            if chain is not None:
                best = Route(chain, shared)
        return best

    def _reach(self, e: Remembered, live: list[int],
               memo: dict[int, tuple[Remembered, ...] | None]) -> tuple[Remembered, ...] | None:  # fmt: skip
        """The entries to load, base first, ending with `e` (None: unreachable). A base
        entry starts earlier than the entry it carries, so the search ends."""
        if id(e) in memo:
            return memo[id(e)]
        memo[id(e)] = None
        found: tuple[Remembered, ...] | None = None
        if common_prefix(live, e.tokens[: e.start]) == e.start:
            found = (e,)
        else:
            for base in self._entries:
                if (base.start < e.start <= len(base.tokens)
                        and base.steering_key == e.steering_key
                        and common_prefix(base.tokens, e.tokens[: e.start]) == e.start):  # fmt: skip
                    below = self._reach(base, live, memo)
                    if below is not None and (found is None or len(below) + 1 < len(found)):
                        found = (*below, e)
        memo[id(e)] = found
        return found

    # -- changing (the engine thread) --------------------------------------------------------

    def remember(self, session: Session, start: int, tail: bool = True) -> bool:
        """Keep the state `session` holds now, as a delta after its first `start` tokens
        (its evaluation must have left the next-token logits: a snapshot never evaluates
        here); `tail`: when that is too long, keep its last token. Whether it was kept."""
        if (
            self.budget_bytes == 0
            or session.n_tokens <= start
            or session.last_logits is None
            or (start and not session.supports_delta)
        ):
            return False
        tokens = list(session.tokens)
        key = session.steering_key
        same = [e for e in self._entries if e.tokens == tokens and e.steering_key == key]
        if any(e.start <= start for e in same):
            return False  # kept already, on a base at least as short
        if session.snapshot_kv_bytes(start) > self.budget_bytes // 4:
            if not tail:
                return False
            # too long to keep whole: keep its last token's row and logits, which a session
            # still holding the rest (the same prompt again, another candidate) needs
            start = len(tokens) - 1
            if (start and not session.supports_delta) or any(e.start <= start for e in same):
                return False
        snap = session.snapshot(start)
        if snap.nbytes > self.budget_bytes // 4:
            return False
        buf = io.BytesIO()
        snap.write(buf)
        for e in same:  # the same state on a longer base: this one replaces it
            self._drop(e)
        self._add(Remembered(tokens, start, buf.getvalue(), key, True))
        return True

    def keep_before_rewind(self, session: Session, n: int) -> bool:
        """`session` is about to keep only its first `n` tokens: when a kept state stands
        on rows it would drop (and on nothing else holding them), keep those rows first as
        a bridge. Whether one was kept."""
        live = list(session.tokens)
        if n >= len(live) or session.last_logits is None:
            return False
        now: dict[int, tuple[Remembered, ...] | None] = {}
        after: dict[int, tuple[Remembered, ...] | None] = {}
        needed = any(
            self._reach(e, live, now) is not None and self._reach(e, live[:n], after) is None
            for e in self._entries
        )  # fmt: skip
        return needed and self.remember(session, n, tail=False)

    def restore(self, session: Session, route: Route) -> bool:
        """Load the route's entries into `session` (blocking); whether it now holds the
        route's state. False when an entry is gone (dropped for room since the route was
        found) or does not load (then the session holds a prefix of what it held)."""
        if any(e not in self._entries for e in route.chain):
            return False
        try:
            for e in route.chain:
                session.rewind(e.start)
                session.load(io.BytesIO(e.payload))
        except EngineError:
            log.exception("a recent completion state did not load")
            for e in route.chain:
                self._drop(e)
            return False
        # the restored state is now the most recent
        self._entries.remove(route.target)
        self._entries.append(route.target)
        return True

    def _add(self, entry: Remembered) -> None:
        self._entries.append(entry)
        self._nbytes += entry.nbytes
        while self._nbytes > self.budget_bytes or len(self._entries) > MAX_ENTRIES:
            self._drop(self._entries[0])

    def _drop(self, entry: Remembered) -> None:
        if entry in self._entries:
            self._entries.remove(entry)
            self._nbytes -= entry.nbytes
