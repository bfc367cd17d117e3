"""The seam between `Engine` / `Session` (engine.py) and a model family's module: what a
family provides, as Protocols. engine.py is written against these alone; decoder.py
(`DecoderModel` / `DecoderState`, the attention decoders) and deepseek4.py (`DS4Model` /
`DS4State`) implement them.

A family module has `FAMILY` and `load(gguf_file, pool) -> FamilyModel` (and, when the
GGUF's own vocabulary needs more than ds4d.engine.tokenizer, `make_tokenizer(gguf_file)`).
A model makes one `FamilyState` per session: the KV cache in C memory and its position.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import BinaryIO, Protocol, runtime_checkable

import numpy as np

from ds4d.engine import native
from ds4d.engine.gguf_file import GGUFFile
from ds4d.engine.steering import NativeSteer

# The kv_type of a family that keeps its own KV format: DeepSeek V4's compressed cache has
# a fixed layout, so it ignores the KV type sessions are asked for.
NATIVE_KV = "native"


class FamilyState(Protocol):
    """One session's state in the family's C memory: its KV rows and the count of
    positions (tokens) it holds."""

    n_ctx: int
    # Whether a payload can hold any range of rows (kv_payload_bytes / kv_rows / write_kv /
    # read_kv with start > 0): a delta checkpoint then carries only the rows after its base.
    supports_ranges: bool

    @property
    def n_past(self) -> int:
        """Positions held."""
        ...

    @property
    def kv_bytes(self) -> int:
        """Bytes of memory reserved for n_ctx positions."""
        ...

    def eval(self, tokens: np.ndarray, logits: np.ndarray | None, all_logits: bool = False) -> None:
        """One forward pass appending `tokens` (int32, C-contiguous); fills `logits` (the
        next-token logits, n_vocab float32; n x n_vocab with all_logits) unless None."""
        ...

    def rewind(self, n: int) -> None:
        """Keep the first n positions (n <= n_past). An attention decoder drops the rest;
        a family that cannot drop positions of its state (DeepSeek V4's compressed rows)
        restores its latest snapshot before n and evaluates the tokens from there again:
        forward passes, so call it where evaluations are serialized."""
        ...

    def kv_payload_bytes(self, n: int, start: int = 0) -> int:
        """Bytes `write_kv(fp, n, start)` writes."""
        ...

    def kv_rows(self, n: int, start: int = 0) -> Sequence[np.ndarray | bytes]:
        """Copies of what write_kv(fp, n, start) would write, in order."""
        ...

    def write_kv(self, fp: BinaryIO, n: int, start: int = 0) -> None:
        """The KV payload of positions [start, n)."""
        ...

    def read_kv(self, fp: BinaryIO, n: int, start: int = 0) -> None:
        """Reads what write_kv(fp, n, start) wrote into positions [start, n), which the
        state then holds (it held exactly `start` before). EngineError if the payload does
        not fit; the state then holds `start` positions (a family without ranges: none)."""
        ...

    def set_steer(self, steer: NativeSteer | None) -> None:
        """Steers the next evaluations (steering.py; None: none). SteeringError when the
        directions do not fit the model."""
        ...

    def close(self) -> None: ...


class FamilyModel(Protocol):
    """A validated GGUF bound to the family's native forward pass."""

    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int

    def new_state(self, n_ctx: int, kv_type: str) -> FamilyState:
        """A session state of n_ctx positions whose KV rows are `kv_type` (a family with
        its own KV format ignores it: see NATIVE_KV)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class BatchedModel(FamilyModel, Protocol):
    """A family whose sessions keep their KV in one of the engine's KV types and which
    evaluates several sessions in one forward pass (the attention decoders)."""

    max_batch: int

    def kv_row_bytes(self, kv_type: str) -> int:
        """Bytes of one position of one KV head; EngineError for a type the model cannot
        use."""
        ...

    def eval_batch(
        self,
        states: Sequence[FamilyState],
        tokens: Sequence[np.ndarray],
        logits: np.ndarray | None,
        rows: Sequence[int] | None = None,
    ) -> None:
        """One forward pass appending tokens[i] to states[i] (states of this model);
        logits (len(states) x n_vocab) receives each one's logits after its last token, or
        with `rows` (sum(rows) x n_vocab) those of each one's last rows[i] tokens in turn."""
        ...


class Family(Protocol):
    """A family module (ds4d/engine/<family>.py), as engine.py uses it."""

    FAMILY: str

    def load(self, gf: GGUFFile, pool: native.Pool) -> FamilyModel: ...


@runtime_checkable
class EmbeddingModel(FamilyModel, Protocol):
    """A family whose forward pass can return its final hidden states (the embedding path:
    ds4d.engine.embedding), several throwaway states in one call."""

    max_batch: int
    bidirectional: bool  # attention is not causal (an encoder)

    def embed_batch(
        self, states: Sequence[FamilyState], tokens: Sequence[np.ndarray], hidden: np.ndarray
    ) -> None:
        """One forward pass over tokens[i] appended to states[i]; hidden (sum of the token
        counts x n_embd float32) receives every new row's final hidden state, each row
        bitwise what it is when its state is evaluated alone."""
        ...

    def project_pooled(self, pooled: np.ndarray) -> np.ndarray:
        """A pooled vector (n_embd float32) through the projections the model applies after
        its pooling (EmbeddingGemma's dense layers), before normalisation; most models have
        none and return it as it is."""
        ...
