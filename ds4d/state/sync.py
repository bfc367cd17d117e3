"""The one KV sync: how a slot's session comes to hold a new prompt, as a sequence of
typed engine calls.

`SlotSync` decides, through the matching order of `ds4d.state.matching.plan_sync`
(memory-token, memory-text, disk-text, none), how much of what the session holds is kept,
and then hands out one engine call at a time: save the long session the plan throws away
(`Checkpoint(EVICT)`), load a disk checkpoint (`Load`), drop what the prompt does not
share (`Rewind`), prefill a chunk (`EvalChunk`, one C call: at most PREFILL_CHUNK
tokens), and pause at the save policy's stops to write checkpoints (`Checkpoint`). An
editor's completion also goes through its slot's recent states (ds4d.state.recent):
back to one that shares more with the prompt than the live session (`Restore`), and the
state it computed kept once its prompt is in (`Remember`).

Whoever drives it runs each call through an `EngineCalls` (here `KVCalls`, the engine
and the KV state) and reports the outcome with `took`: the daemon's engine loop
(ds4d.serving.loop) interleaves the calls of several slots step by step; `sync_session`
runs them one after another (tools, tests). The plan itself (`KVState.plan`: key texts,
the prompt hashed against the disk cache) is the caller's to make where it may block.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ds4d.engine.engine import PREFILL_CHUNK, Session
from ds4d.engine.steering import Steering
from ds4d.state.diskcache import DiskMatch
from ds4d.state.kvfile import Reason
from ds4d.state.kvstate import KVState
from ds4d.state.matching import MIN_REUSE_TOKENS, Plan, common_prefix, plan_sync
from ds4d.state.recent import RecentStates, Route
from ds4d.state.trace import CacheSource


@dataclass(frozen=True)
class EvalChunk:
    """Prefill: one forward pass over `tokens` (at most PREFILL_CHUNK)."""

    tokens: list[int]


@dataclass(frozen=True)
class Rewind:
    """Keep the first `n` tokens (with `recent`: first keep as a bridge the rows a recent
    state stands on)."""

    n: int
    recent: RecentStates | None = None


@dataclass(frozen=True)
class Load:
    """Restore a disk checkpoint into the session."""

    match: DiskMatch
    prompt_text: str


@dataclass(frozen=True)
class Checkpoint:
    """Save the session as it is now (EVICT: before the plan throws it away)."""

    reason: Reason


@dataclass(frozen=True)
class Restore:
    """Bring the session to a recent state (the live rows a recent state stands on kept
    first as a bridge)."""

    recent: RecentStates
    route: Route


@dataclass(frozen=True)
class Remember:
    """Keep the state the session now holds among the recent ones (a delta after `start`)."""

    recent: RecentStates
    start: int


EngineCall = EvalChunk | Rewind | Load | Checkpoint | Restore | Remember


class EngineCalls(Protocol):
    """What runs a sync's calls on a session (blocking: the engine's thread)."""

    def eval_chunk(self, session: Session, tokens: Sequence[int]) -> None: ...

    def rewind(self, session: Session, n: int, recent: RecentStates | None = None) -> None: ...

    def load(self, session: Session, match: DiskMatch, prompt_text: str) -> list[int] | None:
        """The effective prompt tokens, or None when the checkpoint cannot be used."""
        ...

    def checkpoint(self, session: Session, reason: Reason) -> bool:
        """Whether a checkpoint was written or queued."""
        ...

    def restore(self, session: Session, recent: RecentStates, route: Route) -> bool:
        """Whether the session now holds the route's state (else a prefix of what it held)."""
        ...

    def remember(self, session: Session, recent: RecentStates, start: int) -> bool:
        """Whether the state was kept."""
        ...


class KVCalls:
    """The engine calls of a sync on real sessions, with the KV state's disk cache (or
    without one: `kv` None)."""

    def __init__(self, kv: KVState | None) -> None:
        self.kv = kv

    def eval_chunk(self, session: Session, tokens: Sequence[int]) -> None:
        session.eval(tokens)

    def rewind(self, session: Session, n: int, recent: RecentStates | None = None) -> None:
        if recent is not None:
            recent.keep_before_rewind(session, n)
        session.rewind(n)

    def load(self, session: Session, match: DiskMatch, prompt_text: str) -> list[int] | None:
        assert self.kv is not None  # a plan with a disk hit comes from a disk cache
        return self.kv.load_disk(session, match, prompt_text)

    def checkpoint(self, session: Session, reason: Reason) -> bool:
        assert self.kv is not None  # stops and evictions come from a disk cache
        if reason == Reason.EVICT:
            return self.kv.save_evict(session)
        return self.kv.checkpoint(session, reason)

    def restore(self, session: Session, recent: RecentStates, route: Route) -> bool:
        recent.keep_before_rewind(session, route.chain[0].start)
        return recent.restore(session, route)

    def remember(self, session: Session, recent: RecentStates, start: int) -> bool:
        return recent.remember(session, start)


def run_call(calls: EngineCalls, session: Session, call: EngineCall) -> object:
    """One call of a sync, run (blocking)."""
    if isinstance(call, EvalChunk):
        calls.eval_chunk(session, call.tokens)
        return None
    if isinstance(call, Rewind):
        calls.rewind(session, call.n, call.recent)
        return None
    if isinstance(call, Load):
        return calls.load(session, call.match, call.prompt_text)
    if isinstance(call, Restore):
        return calls.restore(session, call.recent, call.route)
    if isinstance(call, Remember):
        return calls.remember(session, call.recent, call.start)
    return calls.checkpoint(session, call.reason)


@dataclass
class SyncResult:
    tokens: list[int]  # the prompt as the session now holds it (the effective prompt)
    cached_tokens: int  # prompt tokens kept from before (not prefilled)
    source: CacheSource
    plan: Plan
    disk_file: str | None = None  # the KV file a disk-text hit loaded
    saves: list[str] = field(default_factory=list)  # checkpoints written: "cold", "evict"…


def make_plan(
    kv: KVState | None,
    session: Session,
    prompt_text: str,
    prompt_tokens: Sequence[int],
    min_reuse: int | None = None,
) -> Plan:
    """The matching plan for bringing `session` to the prompt (blocking: key texts, the
    disk cache's lookup). Without a KV state, memory matching only, on the tokenizer-free
    token comparison. `min_reuse`: the shortest shared prefix kept, when not the KV
    state's policy (kv-cache-min-tokens)."""
    if kv is not None:
        return kv.plan(session, prompt_text, prompt_tokens, min_reuse)
    return plan_sync(
        list(session.tokens),
        prompt_text,
        prompt_tokens,
        decode=lambda tokens: None,
        encode=lambda text: [],
        min_tokens=MIN_REUSE_TOKENS if min_reuse is None else min_reuse,
    )


def steer_session(session: Session, steering: Steering | None, kv: KVState | None) -> None:
    """The session about to run a request under `steering` (None: unsteered), before its
    plan is made. When that changes the steering's effect, the KV the session holds was
    computed under the other one and is dropped (Session.set_steering), saved first as
    an evict checkpoint when worth it and the disk cache holds that steering. Blocking:
    run it where the session's evaluations are serialized (no step computes on it)."""
    key = steering.key if steering is not None else ""
    if key == session.steering_key:
        return
    if kv is not None and session.n_tokens:
        kv.save_evict(session)
    session.set_steering(steering)


def plan_with_recent(
    kv: KVState | None,
    session: Session,
    prompt_text: str,
    prompt_tokens: Sequence[int],
    recent: RecentStates | None,
    min_reuse: int | None = None,
) -> tuple[Plan, Route | None]:
    """The matching plan, and the way to a recent state that shares more with the prompt
    than the plan keeps (None: there is none, or no recent states). Blocking."""
    plan = make_plan(kv, session, prompt_text, prompt_tokens, min_reuse)
    if recent is None or plan.tokens is None or plan.disk is not None:
        return plan, None
    route = recent.route(session.tokens, plan.tokens, session.steering_key)
    return plan, route if route is not None and route.shared > plan.keep else None


class SlotSync:
    """One session's way to a prompt, one engine call at a time (see the module doc).

    Not thread-safe by itself: the driver calls `next` and `took` in turn, and runs each
    call where the session's evaluations are serialized."""

    def __init__(
        self,
        session: Session,
        prompt_text: str,
        prompt_tokens: Sequence[int],
        plan: Plan,
        kv: KVState | None = None,
        tool_ids: Iterable[str] = (),
        recent: RecentStates | None = None,
        route: Route | None = None,
    ) -> None:
        """`recent`: the slot's recent completion states, to keep this one among them;
        `route`: the way to one of them that shares more with the prompt than the plan
        keeps (RecentStates.route, found with the plan)."""
        self.session = session
        self.text = prompt_text
        self.prompt = list(prompt_tokens)
        self.plan = plan
        self.kv = kv
        self.tool_ids = list(tool_ids)
        self.recent = recent
        self.route = route if recent is not None and plan.disk is None else None
        self.remembered = False
        self.source: CacheSource = plan.source
        self.reused = plan.keep
        self.disk_file: str | None = None
        self.saves: list[str] = []
        self.evaluating = False  # an EvalChunk has been handed out
        self.cached_at_eval = 0  # what the session held when the first chunk began
        self._tokens: list[int] | None = plan.tokens
        self._stage = "evict"
        self._stops: list[tuple[int, Reason]] = []
        self._pending_stops: list[Reason] = []
        if not (plan.evict_save and kv is not None):
            self._begin()

    @property
    def total(self) -> int:
        """Tokens of the effective prompt (known once any disk checkpoint is loaded)."""
        return len(self._tokens) if self._tokens is not None else len(self.prompt)

    @property
    def done(self) -> bool:
        return self._stage == "done"

    @property
    def prefilling(self) -> bool:
        """The next call is a chunk (no save, load or rewind before it)."""
        return self._stage == "prefill" and not self._pending_stops

    def remaining(self) -> int:
        """Prompt tokens still to prefill."""
        return max(0, self.total - self.session.n_tokens) if self._stage != "done" else 0

    def next(self, chunk: int = PREFILL_CHUNK) -> EngineCall | None:
        """The next engine call (an EvalChunk of at most `chunk` tokens, at most
        PREFILL_CHUNK), or None once the session holds the prompt."""
        if self._stage == "evict":
            return Checkpoint(Reason.EVICT)
        if self._stage == "load":
            assert self.plan.disk is not None
            return Load(self.plan.disk, self.text)
        if self._stage == "restore":
            assert self.recent is not None and self.route is not None
            return Restore(self.recent, self.route)
        if self._stage == "rewind":
            return Rewind(self.reused, self.recent)
        if self._pending_stops:
            return Checkpoint(self._pending_stops[0])
        assert self._tokens is not None
        done = self.session.n_tokens
        total = len(self._tokens)
        if done >= total:
            if self.recent is not None and not self.remembered and done == total > 0:
                # kept from where this request began evaluating (a prompt it did not
                # evaluate at all: its last token, should it not be kept yet)
                start = self.cached_at_eval if self.evaluating else total - 1
                return Remember(self.recent, start)
            self._stage = "done"
            return None
        limit = next((p for p, _ in self._stops if p > done), total)
        size = max(1, min(chunk, PREFILL_CHUNK))
        if not self.evaluating:
            self.evaluating = True
            self.cached_at_eval = done
        return EvalChunk(self._tokens[done : min(done + size, limit)])

    def took(self, call: EngineCall, outcome: object) -> None:
        """What `call` returned (run_call's value)."""
        if isinstance(call, Checkpoint):
            if outcome:
                self.saves.append(call.reason.name.lower())
            if self._stage == "evict":
                self._begin()
            elif self._pending_stops:
                self._pending_stops.pop(0)
            return
        if isinstance(call, Load):
            tokens = outcome if isinstance(outcome, list) else None
            if tokens is None:  # a bad file: logged by the cache, the request goes on cold
                self._tokens, self.reused, self.source = list(self.prompt), 0, "none"
                self._stage = "rewind" if self.session.n_tokens else "prefill"
            else:
                self._tokens = tokens
                self.reused = self.session.n_tokens
                self.disk_file = call.match.path.name
                self._stage = "prefill"
            self._stops = self._stops_from(self.session.n_tokens)
            return
        if isinstance(call, Remember):
            self.remembered = True
            return
        if isinstance(call, Restore):
            # restored or not, go on from what the session now holds
            assert self._tokens is not None
            held = self.session.tokens
            common = common_prefix(held, self._tokens)
            exact = (common == len(held) == len(self._tokens)
                     and self.session.last_logits is not None)  # fmt: skip
            self.reused = common if exact else min(common, len(self._tokens) - 1)
            if outcome:
                self.source = "memory-token"
            self._stage = "rewind" if self.reused < len(held) else "prefill"
            self._stops = self._stops_from(self.session.n_tokens)
            return
        if isinstance(call, Rewind):
            self._stage = "prefill"
            self._stops = self._stops_from(self.session.n_tokens)
            return
        done = self.session.n_tokens
        self._pending_stops = [r for p, r in self._stops if p == done]

    def result(self) -> SyncResult:
        assert self._tokens is not None
        total = len(self._tokens)
        return SyncResult(self._tokens, min(self.reused, total), self.source, self.plan,
                          self.disk_file, self.saves)  # fmt: skip

    def _begin(self) -> None:
        if self.kv is not None:
            self.kv.begin(self.session, self.plan.source, self.tool_ids)
        if self.plan.disk is not None and self.kv is not None:
            self._stage = "load"
        elif self.route is not None and self.route.shared > self.plan.keep:
            self._stage = "restore"
        elif self.plan.keep < self.session.n_tokens:
            self._stage = "rewind"
        else:
            self._stage = "prefill"
            self._stops = self._stops_from(self.session.n_tokens)

    def _stops_from(self, start: int) -> list[tuple[int, Reason]]:
        if self.kv is None or self._tokens is None or not self.kv.uses_disk(self.session):
            return []
        return self.kv.stops(start, len(self._tokens), self.reused)


def sync_session(
    kv: KVState | None,
    session: Session,
    prompt_text: str,
    prompt_tokens: Sequence[int],
    tool_ids: Iterable[str] = (),
    chunk: int = PREFILL_CHUNK,
) -> SyncResult:
    """Make `session` hold the prompt, with logits for its next token, in one blocking
    call: the same calls the engine loop interleaves with other slots, run in order."""
    plan = make_plan(kv, session, prompt_text, prompt_tokens)
    sync = SlotSync(session, prompt_text, prompt_tokens, plan, kv, tool_ids)
    calls = KVCalls(kv)
    while (call := sync.next(chunk)) is not None:
        sync.took(call, run_call(calls, session, call))
    return sync.result()
