"""A stand-in for the compute behind the engine seam, for tests of the engine loop.

`FakeModel` is a `BatchedModel` (ds4d/engine/family.py): a real `Engine` and real
`Session`s run on it, with the embedded model's real tokenizer and chat template; only the
forward pass is replaced. Each pass costs engine time on a clock of its own
(`FakeClock`, which the loop is given to time its work): `prefill_s` per token of a
prefill, `decode_s` per batched decode step, whatever the machine's speed. Its logits are
deterministic: after n held tokens, the next token is `tokens[n % len(tokens)]` (ordinary
text tokens, so a generation runs to its max_tokens).

It also records every pass: which session, how many tokens, at what time, so a test can
see the order in which the loop ran them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np

from ds4d.engine.engine import Engine


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Pass:
    states: list[int]  # ids of the FakeStates evaluated
    tokens: list[int]  # tokens per state
    start: float
    end: float


@dataclass
class FakeCompute:
    clock: FakeClock
    text_tokens: list[int]
    prefill_s: float = 0.001  # engine seconds per prefill token
    decode_s: float = 0.02  # engine seconds per batched decode step
    passes: list[Pass] = field(default_factory=list)
    running: int = 0
    peak: int = 0  # passes computing at once (never above 1 if the gate works)
    on_pass: Callable[[Pass], None] | None = None
    fail: Callable[[FakeState, np.ndarray], bool] = lambda state, tokens: False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, states: Sequence[FakeState], tokens: Sequence[np.ndarray]) -> None:
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        try:
            for s, t in zip(states, tokens, strict=True):
                if self.fail(s, t):
                    raise ValueError("a forward pass that fails")
            start = self.clock.now
            n = [len(t) for t in tokens]
            cost = self.decode_s if max(n) == 1 else self.prefill_s * sum(n)
            self.clock.now += cost
            p = Pass([id(s) for s in states], n, start, self.clock.now)
            self.passes.append(p)
            if self.on_pass is not None:
                self.on_pass(p)
        finally:
            with self.lock:
                self.running -= 1

    def logits(self, n_past: int, out: np.ndarray) -> None:
        out[:] = 0.0
        out[self.text_tokens[n_past % len(self.text_tokens)]] = 30.0


class FakeState:
    supports_ranges = False

    def __init__(self, compute: FakeCompute, n_ctx: int) -> None:
        self.compute = compute
        self.n_ctx = n_ctx
        self._n = 0

    @property
    def n_past(self) -> int:
        return self._n

    @property
    def kv_bytes(self) -> int:
        return 0

    def eval(self, tokens: np.ndarray, logits: np.ndarray | None, all_logits: bool = False) -> None:
        self.compute.run([self], [tokens])
        self._n += len(tokens)
        if logits is not None:
            self.compute.logits(self._n, logits)

    def rewind(self, n: int) -> None:
        self._n = n

    def kv_payload_bytes(self, n: int, start: int = 0) -> int:
        return 0

    def kv_rows(self, n: int, start: int = 0) -> Sequence[np.ndarray | bytes]:
        return []

    def write_kv(self, fp: BinaryIO, n: int, start: int = 0) -> None:
        pass

    def read_kv(self, fp: BinaryIO, n: int, start: int = 0) -> None:
        self._n = n

    def close(self) -> None:
        pass


class FakeModel:
    max_batch = 16
    n_ctx_train = 32768
    n_embd = 8
    n_layer = 1

    def __init__(self, compute: FakeCompute, n_vocab: int) -> None:
        self.compute = compute
        self.n_vocab = n_vocab

    def new_state(self, n_ctx: int, kv_type: str) -> FakeState:
        return FakeState(self.compute, n_ctx)

    def kv_row_bytes(self, kv_type: str) -> int:
        return 4

    def eval_batch(self, states: Sequence[Any], tokens: Sequence[np.ndarray],
                   logits: np.ndarray | None, rows: Sequence[int] | None = None) -> None:  # fmt: skip
        self.compute.run(states, tokens)
        at = 0
        for i, s in enumerate(states):
            s._n += len(tokens[i])
            r = 1 if rows is None else rows[i]
            if logits is not None:
                for j in range(r):  # the logits after each of its last r tokens
                    self.compute.logits(s._n - r + 1 + j, logits[at + j])
            at += r

    def close(self) -> None:
        pass


def fake_engine(real: Engine, compute: FakeCompute) -> Engine:
    """An Engine over the fake compute, with `real`'s GGUF metadata, tokenizer and thread
    pool (not to be closed: the pool is `real`'s)."""
    model = FakeModel(compute, real.info.n_vocab)
    return Engine(real.gguf, real.family, model, real.pool, real.tokenizer, kv_type="f32")


def text_tokens(real: Engine) -> list[int]:
    """Ordinary word tokens of the real tokenizer (never end-of-generation)."""
    ids = real.tokenizer.encode(" the sea and the sky and the wind", special=False)
    return [t for t in ids if t not in real.tokenizer.eog_ids]
