"""Engine and Session: the narrow API the rest of ds4d uses (see ds4d/engine/__init__.py).

The model family is chosen from general.architecture through FAMILIES; a family module
is a `ds4d.engine.family.Family` (`FAMILY`, `load(gguf_file, pool) -> FamilyModel`), and
this module reaches the family only through those Protocols (FamilyModel, FamilyState,
BatchedModel for the batched forward pass). Everything else here (chunked prefill,
rewind, the session payload) is family-neutral.

KV precision: the attention decoders store K and V as `kv_type` (KV_TYPES: f32, f16, q8_0),
resident and in session payloads, which record it. "auto" (the default) is the family's
own choice, FAMILY_KV_TYPE: f16, or f32 where f16 measurably costs more than the bar. A family that is no BatchedModel keeps its own KV format and ignores kv_type:
DeepSeek V4, whose compressed cache has a fixed layout (reported as "native").

Sessions of one engine share its native thread pool, which runs one forward call at a
time: calls are serialized by the engine's lock, so sessions may be used from different
worker threads.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import struct
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, BinaryIO, Protocol, cast

import numpy as np

from ds4d.engine import native
from ds4d.engine.context_extension import stretch_rope
from ds4d.engine.decoder import KV_TYPES
from ds4d.engine.embedding import (
    EMBED_CALL_ROWS,
    EmbeddingConfig,
    embed_tokens,
    embedding_config,
)
from ds4d.engine.errors import ContextFullError, EngineError, ModelLoadError
from ds4d.engine.family import NATIVE_KV, BatchedModel, Family, FamilyModel, FamilyState
from ds4d.engine.fim import FimTokens, find_fim_tokens
from ds4d.engine.gguf_file import GGUFFile
from ds4d.engine.steering import NativeSteer, Steering, SteeringError
from ds4d.engine.tokenizer_api import ModelTokenizer
from ds4d.engine.weight_memory import WEIGHT_MODES

# general.architecture -> family module. A new family is one module and one line here.
FAMILIES = {
    "llama": "ds4d.engine.llama",
    "deepseek4": "ds4d.engine.deepseek4",
    "qwen2": "ds4d.engine.qwen2",
    "qwen3": "ds4d.engine.qwen3",
    "gemma3": "ds4d.engine.gemma3",
    "phi3": "ds4d.engine.phi3",
    "qwen3moe": "ds4d.engine.qwen3moe",
    "gpt-oss": "ds4d.engine.gptoss",
    "bert": "ds4d.engine.bert",
    "gemma-embedding": "ds4d.engine.gemma_embedding",
    "nomic-bert": "ds4d.engine.nomic_bert",
}

# Tokens per forward call during prefill: large enough for the matrix-matrix kernels to
# reach full speed, small enough that on_chunk runs every second or so.
PREFILL_CHUNK = 256

# The KV type serving defaults to: half the bytes of f32 at a log-prob distance of ~0.001
# on the SmolLM2 vectors (tests/engine/test_kv_types.py measures it).
DEFAULT_KV_TYPE = "f16"
AUTO_KV = "auto"
# Families whose "auto" KV type is not DEFAULT_KV_TYPE: on their kit models f16 K/V puts the
# mean |Δ logprob| above the 0.003 bar (docs/kv-precision.md has every family's figures and
# tests/engine/test_family_kv.py checks them). f16 rounds K by up to 2^-11 of its size; the
# error of a score is that times the score, and these families scale the scores up: gpt-oss
# by YaRN's attention factor on q and k (1.35² = 1.82 at factor 32), Phi-3 by LongRoPE's
# (1.19² = 1.42); the MoE families then turn a small error into a different top-k expert
# choice wherever two router logits nearly tie (a jump of up to 1.8 logprob on gpt-oss).
FAMILY_KV_TYPE = {"gpt-oss": "f32", "phi3": "f32", "qwen3moe": "f32"}

# Matmul precision (native.PRECISIONS): "exact" multiplies dequantized weights by float32
# activations; "int2"/"int3" split each 32-value block of activations (256 for the K-quants)
# into 2 or 3 int8 limbs for integer dot products (docs/integer-path.md has the distances and speeds measured).
PRECISIONS = tuple(native.PRECISIONS)
DEFAULT_PRECISION = "exact"

PAYLOAD_MAGIC = b"DS4DSESS"
# 2: the KV type joined the header (version 1 payloads held f32 rows without saying so).
PAYLOAD_VERSION = 2
# magic, version, fingerprint (sha256), n_tokens, n_vocab, has_logits, kv byte count,
# KV type name (NUL-padded ASCII)
_HEADER = struct.Struct("<8sI32sQIIQ8s")

# A delta payload extends a session that holds exactly its base tokens (the first `start`
# of its n_tokens): it carries tokens[start:], the logits and the KV rows [start, n).
DELTA_MAGIC = b"DS4DDELT"
DELTA_VERSION = 1
# magic, version, fingerprint, start, n_tokens, n_vocab, has_logits, kv byte count,
# base token digest (sha256 of tokens[:start] as little-endian int32)
_DELTA_HEADER = struct.Struct("<8sI32sQQIIQ32s")


def token_digest(tokens: Sequence[int] | np.ndarray) -> bytes:
    """sha256 of the tokens as little-endian int32: how a delta names its base."""
    return hashlib.sha256(np.asarray(tokens, dtype="<i4").tobytes()).digest()


@dataclass(frozen=True)
class EngineInfo:
    family: str
    name: str
    architecture: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    quant: str
    file_bytes: int
    path: str
    fingerprint: str
    kv_type: str = "f32"
    rope_stretch: str = ""  # the RoPE scaling applied over the file's, in words
    precision: str = "exact"  # the matmuls' (PRECISIONS)
    weight_memory: str = "mmap"  # where the weights live: "mmap" or "huge" (weight_memory)


if TYPE_CHECKING:  # mypy checks every family module against the Family Protocol
    from ds4d.engine import (
        bert,
        deepseek4,
        gemma3,
        gemma_embedding,
        gptoss,
        llama,
        nomic_bert,
        phi3,
        qwen2,
        qwen3,
        qwen3moe,
    )

    _FAMILY_MODULES: tuple[Family, ...] = (
        llama, deepseek4, qwen2, qwen3, gemma3, phi3, qwen3moe, gptoss, bert, gemma_embedding,
        nomic_bert,
    )  # fmt: skip


def supported_architectures() -> list[str]:
    return sorted(FAMILIES)


class Engine:
    """One GGUF loaded once (mmap), its tokenizer and chat template, and a thread pool."""

    def __init__(self, gf: GGUFFile, family: Family, model: FamilyModel, pool: native.Pool,
                 tokenizer: ModelTokenizer, kv_type: str = "f32",
                 rope_stretch: str = "", precision: str = "exact",
                 pooling: str = "") -> None:  # fmt: skip
        self.gguf = gf
        # How inputs become vectors (ds4d.engine.embedding): the file's pooling or `pooling`.
        # (Tests build engines without a tokenizer: no BOS or EOS to add then.)
        tok: ModelTokenizer | None = tokenizer
        self.embedding: EmbeddingConfig = embedding_config(
            gf, pooling, tok.add_bos if tok else False, tok.eos_id if tok else None,
            model.n_vocab,
        )  # fmt: skip
        self.family = family
        self.model = model
        self.pool = pool
        self.tokenizer = tokenizer
        self.chat_template: str | None = gf.chat_template
        self.lock = threading.Lock()
        # what every new session is steered with (set_steering); None: nothing
        self.steering: Steering | None = None
        self.kv_type = _resolve_kv_type(model, kv_type)
        pool.set_precision(precision)  # ValueError for an unknown one (open checks first)
        self.info = EngineInfo(
            family=family.FAMILY, name=gf.name, architecture=gf.architecture,
            n_vocab=model.n_vocab, n_ctx_train=model.n_ctx_train, n_embd=model.n_embd,
            n_layer=model.n_layer, quant=gf.file_type_name, file_bytes=gf.file_bytes,
            path=str(gf.path), fingerprint=gf.fingerprint, kv_type=self.kv_type,
            rope_stretch=rope_stretch, weight_memory=gf.weight_memory, precision=precision,
        )  # fmt: skip

    @classmethod
    def open(cls, path: str | os.PathLike[str], threads: int | None = None,
             kv_type: str = AUTO_KV, *, rope_scaling: str = "",
             n_ctx: int = 0, weights: str = "auto",
             precision: str = DEFAULT_PRECISION, pooling: str = "") -> Engine:  # fmt: skip
        """Loads a GGUF; ModelLoadError (one line) for any file the engine cannot run,
        EngineError for a bad thread count or a KV type the model cannot use.
        `rope_scaling` ("linear" or "yarn") stretches a model whose file declares no RoPE
        scaling from its trained context to `n_ctx` (see context_extension.py). `weights`
        says where the weights live (weight_memory.WEIGHT_MODES: by default a resident
        copy on huge pages for a model small next to the RAM, else the file's mapping).
        `precision` is the matmuls' (PRECISIONS). `pooling` (mean, cls, last) overrides
        the file's embedding pooling, or gives one to a model that declares none."""
        if threads is not None and threads < 1:
            raise EngineError(f"threads must be at least 1, got {threads}")
        if kv_type != AUTO_KV and kv_type not in KV_TYPES:
            known = ", ".join((AUTO_KV, *KV_TYPES))
            raise EngineError(f"unknown KV type {kv_type!r} (known: {known})")
        if precision not in PRECISIONS:
            raise EngineError(f"unknown precision {precision!r} (known: {', '.join(PRECISIONS)})")
        if weights not in WEIGHT_MODES:
            raise EngineError(
                f"unknown weight memory {weights!r} (known: {', '.join(WEIGHT_MODES)})"
            )
        gf = GGUFFile(path, weights=weights)
        rope_stretch = stretch_rope(gf, rope_scaling, n_ctx)
        module = FAMILIES.get(gf.architecture)
        if module is None:
            raise ModelLoadError(
                f"unsupported model architecture {gf.architecture!r} in {gf.path}"
                f" (supported: {', '.join(supported_architectures())})"
            )
        family = cast(Family, importlib.import_module(module))
        if kv_type == AUTO_KV:
            kv_type = FAMILY_KV_TYPE.get(family.FAMILY, DEFAULT_KV_TYPE)
        pool = native.Pool(threads if threads is not None else native.physical_cores())
        try:
            model = family.load(gf, pool)
            try:
                _resolve_kv_type(model, kv_type)
                tokenizer = _make_tokenizer(family, gf)
                engine = cls(gf, family, model, pool, tokenizer, kv_type, rope_stretch,
                             precision, pooling)  # fmt: skip
            except BaseException:
                model.close()
                raise
            gf.release_reader()
        except BaseException:
            pool.close()
            raise
        return engine

    @functools.cached_property
    def fim(self) -> FimTokens:
        """The vocabulary's fill-in-the-middle tokens (none for most chat models)."""
        return find_fim_tokens(self.gguf.get, self.tokenizer)

    @property
    def threads(self) -> int:
        return self.pool.threads

    @property
    def path(self) -> Path:
        return self.gguf.path

    def new_session(self, n_ctx: int) -> Session:
        """A session of n_ctx positions, steered with the engine's steering."""
        if n_ctx < 1:
            raise EngineError(f"n_ctx must be at least 1, got {n_ctx}")
        session = Session(self, n_ctx)
        if self.steering is not None:
            session.set_steering(self.steering)
        return session

    def set_steering(self, steering: Steering | None) -> None:
        """The steering of the sessions made from now on (steering.py); SteeringError when
        its directions are not n_layer x n_embd of this model."""
        if steering is not None and steering.dirs.shape != (self.info.n_layer, self.info.n_embd):
            raise SteeringError(
                f"steering of {steering.dirs.shape[0]} layers x {steering.dirs.shape[1]} does "
                f"not fit this model ({self.info.n_layer} x {self.info.n_embd})"
            )
        self.steering = steering

    @property
    def steering_key(self) -> str:
        """The engine steering's key ('' for none): part of every prefix cache's key."""
        return self.steering.key if self.steering is not None else ""

    def eval_batch(self, steps: Sequence[tuple[Session, Sequence[int]]],
                   rows: Sequence[int] | None = None) -> list[np.ndarray]:  # fmt: skip
        """Extends each session by its tokens; each session's logits become those after its
        last new token, bitwise what `session.eval` alone gives. Every step is checked before
        any session changes (ContextFullError, EngineError). The daemon advances all its
        generating slots through this call. The attention-decoder families run the batch as
        one native forward pass (weights read once for every session; steps of more than
        PREFILL_CHUNK tokens, which would be chunked alone, go one session at a time);
        DeepSeek V4 has no batched pass and evaluates one session after another. The
        sessions must be distinct and belong to this engine.

        Returns each step's logits (read-only): of its last `rows[i]` new tokens
        (1 <= rows[i] <= its token count; 1 each without `rows`), rows[i] x n_vocab, each row
        bitwise what `session.eval_all_logits` alone gives for a step of at most
        VERIFY_ROWS tokens (so a speculative verification chunk goes in the same call as the
        other sessions' decode steps); a step without tokens gets 0 rows."""
        if len({id(s) for s, _ in steps}) != len(steps):
            raise EngineError("eval_batch: a session appears twice in one batch")
        want = [1] * len(steps) if rows is None else [int(r) for r in rows]
        if len(want) != len(steps):
            raise EngineError(f"eval_batch: {len(want)} row counts for {len(steps)} steps")
        checked = []
        for (session, tokens), r in zip(steps, want, strict=True):
            if session.engine is not self:
                raise EngineError("eval_batch: a session of another engine")
            toks = session._check(tokens)
            if len(toks) and not 1 <= r <= len(toks):
                raise EngineError(f"eval_batch: {r} rows of logits for {len(toks)} tokens")
            checked.append((session, toks))
        n_vocab = self.info.n_vocab
        out = [np.empty((0, n_vocab), np.float32) for _ in steps]
        todo = [(i, s, t, want[i]) for i, (s, t) in enumerate(checked) if len(t)]
        model = self.model
        if (
            not isinstance(model, BatchedModel)
            or (len(todo) < 2 and all(r == 1 for *_, r in todo))
            or any(len(t) > PREFILL_CHUNK for _, _, t, _ in todo)
        ):
            for i, session, toks, r in todo:
                if r == 1:
                    session.eval(toks)
                    logits = session.last_logits
                    assert logits is not None
                    out[i] = logits[None]
                else:
                    out[i] = session.eval_all_logits(toks)[-r:]
                    out[i].flags.writeable = False
            return out
        limit = model.max_batch
        with self.lock:
            for start in range(0, len(todo), limit):
                group = todo[start : start + limit]
                counts = [r for *_, r in group]
                logits = np.empty((sum(counts), n_vocab), np.float32)
                model.eval_batch([s._state for _, s, _, _ in group], [t for _, _, t, _ in group],
                                 logits, None if rows is None else counts)  # fmt: skip
                logits.flags.writeable = False
                at = 0
                for i, session, toks, r in group:
                    session._tokens.extend(toks.tolist())
                    out[i] = logits[at : at + r]
                    session._logits = logits[at + r - 1]
                    at += r
        return out

    # -- embeddings ---------------------------------------------------------------------

    @property
    def is_embedding_model(self) -> bool:
        """The file declares a pooling: a model made to embed, not to generate."""
        return self.embedding.declared

    def embedding_tokens(self, text: str) -> list[int]:
        """An embedding input's tokens as llama.cpp makes them: BOS when the vocabulary
        adds one, the text with its special tokens parsed, EOS when the file says
        `tokenizer.ggml.add_eos_token` (Qwen3-Embedding pools that last token), a
        WordPiece vocabulary's [SEP] (BERT)."""
        tok = self.tokenizer
        ids = tok.encode(text, special=True)
        if self.embedding.add_bos and tok.bos_id is not None:
            ids = [tok.bos_id, *ids]
        if self.embedding.end_id is not None:
            ids.append(self.embedding.end_id)
        return ids

    def embed(self, token_lists: Sequence[Sequence[int]], *,
              max_rows: int | None = None, max_batch: int | None = None) -> np.ndarray:  # fmt: skip
        """Pooled, L2-normalised vectors (len(token_lists) x n_embd float32), computed over
        throwaway states (no session changes; the engine lock is taken per forward call).
        EngineError when the model has no pooling (neither declared nor given)."""
        pooling = self.embedding.pooling
        if pooling is None:
            raise EngineError("this model declares no pooling; start it with --pooling")
        with self.lock:
            return embed_tokens(self.model, token_lists, pooling,
                                max_rows=max_rows or EMBED_CALL_ROWS, max_batch=max_batch)  # fmt: skip

    def close(self) -> None:
        with self.lock:
            self.model.close()
            self.pool.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _resolve_kv_type(model: FamilyModel, kv_type: str) -> str:
    """The KV type sessions of model will use: kv_type, checked against the model (EngineError
    for q8_0 on a head dimension it cannot hold), or NATIVE_KV for a family with its own."""
    if not isinstance(model, BatchedModel):
        return NATIVE_KV
    model.kv_row_bytes(kv_type)
    return kv_type


def _make_tokenizer(family: Family, gf: GGUFFile) -> ModelTokenizer:
    """The family's own tokenizer (`make_tokenizer(gguf_file)`, optional in a family
    module), else the GGUF vocabulary's through ds4d.engine.tokenizer."""
    make = cast(ModuleType, family).__dict__.get("make_tokenizer")
    if make is not None:
        return cast(ModelTokenizer, make(gf))
    from ds4d.engine.tokenizer import Tokenizer

    try:
        return Tokenizer.from_gguf(gf)
    except EngineError:
        raise
    except Exception as e:
        raise ModelLoadError(f"cannot build the tokenizer from {gf.path}: {e}") from None


class ByteSink(Protocol):
    """Where a snapshot's payload goes: a binary file, or a writer wrapping one."""

    def write(self, data: bytes | memoryview, /) -> object: ...


@dataclass(frozen=True, eq=False)
class SessionSnapshot:
    """An in-memory copy of a session's payload (Session.snapshot): the session can be
    changed at once while this is written elsewhere. start > 0 makes it a delta: the
    tokens, logits and KV rows after the session's first `start` tokens."""

    fingerprint: str
    n_vocab: int
    start: int
    n_tokens: int
    tokens: np.ndarray  # tokens[start:n_tokens], int32
    base_digest: bytes  # token_digest(tokens[:start]); b"" for a full payload
    logits: np.ndarray | None
    kv: Sequence[np.ndarray | bytes]  # buffers, in payload order
    kv_len: int
    kv_type: str = "f32"  # the full header records it; a delta's base already matched it

    @property
    def is_delta(self) -> bool:
        return self.start > 0

    @property
    def nbytes(self) -> int:
        """The bytes write() writes."""
        head = _DELTA_HEADER.size if self.is_delta else _HEADER.size
        n_logits = 4 * self.n_vocab if self.logits is not None else 0
        return head + 4 * len(self.tokens) + n_logits + self.kv_len

    def write(self, fp: ByteSink) -> int:
        """Writes the payload (full or delta; Session.load reads either). Returns bytes."""
        has_logits = int(self.logits is not None)
        fpr = bytes.fromhex(self.fingerprint)
        if self.is_delta:
            fp.write(_DELTA_HEADER.pack(DELTA_MAGIC, DELTA_VERSION, fpr, self.start,
                                        self.n_tokens, self.n_vocab, has_logits, self.kv_len,
                                        self.base_digest))  # fmt: skip
        else:
            fp.write(_HEADER.pack(PAYLOAD_MAGIC, PAYLOAD_VERSION, fpr, self.n_tokens,
                                  self.n_vocab, has_logits, self.kv_len,
                                  self.kv_type.encode()))  # fmt: skip
        fp.write(self.tokens.astype("<i4").tobytes())
        if self.logits is not None:
            fp.write(self.logits.astype("<f4").tobytes())
        for buf in self.kv:
            fp.write(buf.data.cast("B") if isinstance(buf, np.ndarray) else buf)
        return self.nbytes


class Session:
    """The exact tokens a session holds, its KV state, and the next-token logits.

    A rewind drops the logits: `compute_logits()` then evaluates the last held token again
    (one decode step over it, which rewrites its KV row up to float rounding), unless an
    eval comes first. `last_logits` never evaluates."""

    def __init__(self, engine: Engine, n_ctx: int) -> None:
        self.engine = engine
        self.n_ctx = int(n_ctx)
        self._state: FamilyState = engine.model.new_state(self.n_ctx, engine.kv_type)
        self._tokens: list[int] = []
        self._logits: np.ndarray | None = None
        self._steering: Steering | None = None

    # -- steering -------------------------------------------------------------------------

    @property
    def steering(self) -> Steering | None:
        return self._steering

    @property
    def steering_key(self) -> str:
        """'' when unsteered: the KV held was computed under the steering of this key."""
        return self._steering.key if self._steering is not None else ""

    def set_steering(self, steering: Steering | None) -> None:
        """Steers the evaluations from now on (None or an inactive steering: none). The KV
        already held was computed under the previous steering, so when the effect changes
        the session is emptied: a prefix is never reused under other steering."""
        if steering is not None and not steering.active:
            steering = None
        new_key = steering.key if steering is not None else ""
        if new_key != self.steering_key and self._tokens:
            self.rewind(0)
        with self.engine.lock:
            self._state.set_steer(steering.native() if steering is not None else None)
        self._steering = steering

    def eval_capturing(self, tokens: Iterable[int]) -> np.ndarray:
        """Evaluates tokens like eval and returns, per layer, the residual stream after that
        layer at the last of them (n_layer x n_embd float32; DeepSeek V4: the layer's FFN
        output), under the session's own steering: what `ds4d steer build` averages."""
        info = self.engine.info
        s = self._steering
        capture = NativeSteer(
            s.dirs if s is not None else np.zeros((info.n_layer, info.n_embd), np.float32),
            s.attn_scale if s is not None else 0.0,
            s.ffn_scale if s is not None else 0.0,
            capture=True,
        )
        with self.engine.lock:
            self._state.set_steer(capture)
        try:
            self.eval(tokens)
            return capture.captured()
        finally:
            with self.engine.lock:
                self._state.set_steer(s.native() if s is not None else None)
            capture.close()

    # -- state ------------------------------------------------------------------------

    @property
    def tokens(self) -> list[int]:
        """The tokens whose state the session holds (a copy)."""
        return list(self._tokens)

    @property
    def n_tokens(self) -> int:
        return len(self._tokens)

    @property
    def kv_bytes(self) -> int:
        """Bytes of KV memory reserved for this session's n_ctx."""
        return self._state.kv_bytes

    @property
    def last_logits(self) -> np.ndarray | None:
        """The next-token logits the last evaluation left (float32, n_vocab, read-only);
        None for an empty session and after a rewind (see compute_logits)."""
        return self._logits

    def compute_logits(self) -> np.ndarray:
        """The next-token logits after the last held token (float32, n_vocab, read-only).
        When a rewind dropped them, this is a forward pass: the last held token is
        evaluated again (engine lock; run it where evals of this session are serialized).
        EngineError for an empty session, which has none."""
        if self._logits is None:
            if not self._tokens:
                raise EngineError("an empty session has no next-token logits")
            last = self._tokens[-1]
            self._state.rewind(len(self._tokens) - 1)
            try:
                self._forward(np.array([last], np.int32), extend=False)
            except BaseException:
                self._tokens.pop()  # the state no longer holds it
                raise
        assert self._logits is not None
        return self._logits

    # -- eval ---------------------------------------------------------------------------

    def eval(self, tokens: Iterable[int],
             on_chunk: Callable[[int, int], None] | None = None) -> None:  # fmt: skip
        """Extends the session by tokens, prefilling in chunks. on_chunk(done, total) runs
        between chunks; if it raises, the exception propagates and the session holds
        exactly the tokens evaluated so far (with their logits)."""
        toks32 = self._check(tokens)
        n = len(toks32)
        done = 0
        while done < n:
            chunk = toks32[done : done + PREFILL_CHUNK]
            self._forward(chunk)
            done += len(chunk)
            if on_chunk is not None and done < n:
                on_chunk(done, n)

    def _check(self, tokens: Iterable[int]) -> np.ndarray:
        """The tokens as int32, checked to fit the context and the vocabulary."""
        toks = np.ascontiguousarray(np.fromiter(tokens, dtype=np.int64))
        n = len(toks)
        if len(self._tokens) + n > self.n_ctx:
            raise ContextFullError(
                f"context full: {len(self._tokens)} held + {n} new tokens > n_ctx {self.n_ctx}"
            )
        n_vocab = self.engine.info.n_vocab
        if n and (toks.min() < 0 or toks.max() >= n_vocab):
            bad = int(toks[(toks < 0) | (toks >= n_vocab)][0])
            raise EngineError(f"token id {bad} is outside the vocabulary (0..{n_vocab - 1})")
        return toks.astype(np.int32)

    def _forward(self, chunk: np.ndarray, extend: bool = True) -> None:
        logits = np.empty(self.engine.info.n_vocab, np.float32)
        with self.engine.lock:
            self._state.eval(chunk, logits)
        logits.flags.writeable = False
        if extend:
            self._tokens.extend(chunk.tolist())
        self._logits = logits

    def eval_all_logits(self, tokens: Iterable[int]) -> np.ndarray:
        """One forward call returning the logits at every new position (n x n_vocab).
        For tests and scoring; no chunking."""
        toks = np.ascontiguousarray(np.fromiter(tokens, dtype=np.int32))
        if len(self._tokens) + len(toks) > self.n_ctx:
            raise ContextFullError(f"context full: n_ctx {self.n_ctx}")
        out = np.empty((len(toks), self.engine.info.n_vocab), np.float32)
        with self.engine.lock:
            self._state.eval(toks, out, all_logits=True)
        self._tokens.extend(toks.tolist())
        self._logits = out[-1].copy()
        self._logits.flags.writeable = False
        return out

    def rewind(self, n: int) -> None:
        """Keeps the first n tokens (exact: the KV of later positions is dropped)."""
        if not 0 <= n <= len(self._tokens):
            raise EngineError(f"cannot rewind to {n}: the session holds {len(self._tokens)}")
        if n == len(self._tokens):
            return
        self._state.rewind(n)
        del self._tokens[n:]
        self._logits = None

    # -- payload --------------------------------------------------------------------------

    @property
    def supports_delta(self) -> bool:
        """Whether snapshot(start > 0) works: the family's KV rows can be taken by range."""
        return bool(getattr(self._state, "supports_ranges", False))

    def snapshot_kv_bytes(self, start: int = 0) -> int:
        """The bytes of KV rows snapshot(start) would copy."""
        return int(self._state.kv_payload_bytes(len(self._tokens), start))

    def snapshot(self, start: int = 0) -> SessionSnapshot:
        """A copy of the payload (of the rows after the first `start` tokens when start > 0,
        a delta) taken now: a memcpy of the KV rows, so the session may be reused as soon as
        this returns while the copy is written elsewhere. Run it where evals of this session
        are serialized (the engine thread)."""
        n = len(self._tokens)
        if not 0 <= start <= n:
            raise EngineError(f"cannot snapshot from token {start}: the session holds {n}")
        if start and not self.supports_delta:
            raise EngineError(f"{self.engine.info.family} sessions cannot be saved as deltas")
        logits = self.compute_logits() if n else None
        info = self.engine.info
        kv = self._state.kv_rows(n, start)
        kv_len = self._state.kv_payload_bytes(n, start)
        if sum(b.nbytes if isinstance(b, np.ndarray) else len(b) for b in kv) != kv_len:
            raise EngineError("session KV rows do not match their payload size")
        return SessionSnapshot(
            fingerprint=info.fingerprint, n_vocab=info.n_vocab, start=start, n_tokens=n,
            tokens=np.asarray(self._tokens[start:], dtype=np.int32),
            base_digest=token_digest(self._tokens[:start]) if start else b"",
            logits=None if logits is None else logits.copy(), kv=kv, kv_len=kv_len,
            kv_type=info.kv_type,
        )  # fmt: skip

    def save(self, fp: BinaryIO) -> int:
        """Writes the session payload (little-endian): header, tokens (int32), logits
        (float32), then the family's KV rows for the held tokens only. Returns bytes.
        Streams the rows (no copy): the session must not change until it returns."""
        n = len(self._tokens)
        logits = self.compute_logits() if n else None
        kv_len = self._state.kv_payload_bytes(n)
        info = self.engine.info
        header = _HEADER.pack(PAYLOAD_MAGIC, PAYLOAD_VERSION, bytes.fromhex(info.fingerprint),
                              n, info.n_vocab, int(logits is not None), kv_len,
                              info.kv_type.encode())  # fmt: skip
        fp.write(header)
        fp.write(np.asarray(self._tokens, dtype="<i4").tobytes())
        if logits is not None:
            fp.write(logits.astype("<f4").tobytes())
        self._state.write_kv(fp, n)
        return _HEADER.size + 4 * n + (4 * info.n_vocab if logits is not None else 0) + kv_len

    def load(self, fp: BinaryIO) -> None:
        """Reads a payload. A full one replaces the session's state; EngineError for a
        payload of another model, format or size, and the session is then left empty. A
        delta extends a session holding exactly its base tokens (checked by their digest);
        EngineError if it does not fit, and the session then still holds its base."""
        magic = fp.read(len(PAYLOAD_MAGIC))
        if magic == DELTA_MAGIC:
            self._load_delta(fp)
            return
        info = self.engine.info
        # The fixed start (magic, version) first, so an older, shorter header is named as such.
        raw = magic + fp.read(12 - len(magic))
        if len(raw) == 12 and raw[:8] == PAYLOAD_MAGIC:
            (version,) = struct.unpack("<I", raw[8:])
            if version != PAYLOAD_VERSION:
                raise EngineError(f"session payload version {version} is not supported"
                                  f" (this ds4d reads version {PAYLOAD_VERSION})")  # fmt: skip
        raw += fp.read(_HEADER.size - len(raw))
        if len(raw) != _HEADER.size:
            raise EngineError("session payload is truncated (header)")
        magic, version, fingerprint, n, n_vocab, has_logits, kv_len, kv_type = _HEADER.unpack(raw)
        if magic != PAYLOAD_MAGIC:
            raise EngineError("not a ds4d session payload (bad magic)")
        if fingerprint.hex() != info.fingerprint or n_vocab != info.n_vocab:
            raise EngineError("session payload was made by a different model")
        kv_name = kv_type.rstrip(b"\0").decode("ascii", "replace")
        if kv_name != info.kv_type:
            raise EngineError(f"session payload holds {kv_name} KV; this engine uses"
                              f" {info.kv_type} (--kv-type)")  # fmt: skip
        if n > self.n_ctx:
            raise EngineError(f"session payload holds {n} tokens, more than n_ctx {self.n_ctx}")
        if kv_len != self._state.kv_payload_bytes(n):
            raise EngineError("session payload KV size does not match this model")
        self.rewind(0)
        tokens = _read_array(fp, "<i4", n)
        if n and (tokens.min() < 0 or tokens.max() >= n_vocab):
            bad = int(np.argmax((tokens < 0) | (tokens >= n_vocab)))
            raise EngineError(
                f"session payload holds token id {int(tokens[bad])} at position {bad},"
                f" outside the vocabulary (0..{n_vocab - 1})"
            )
        logits = _read_array(fp, "<f4", n_vocab) if has_logits else None
        self._state.read_kv(fp, n)  # an error leaves it empty, as the session is
        self._tokens = [int(t) for t in tokens]
        if logits is not None:
            logits = logits.astype(np.float32)
            logits.flags.writeable = False
        self._logits = logits

    def _load_delta(self, fp: BinaryIO) -> None:
        info = self.engine.info
        raw = DELTA_MAGIC + fp.read(_DELTA_HEADER.size - len(DELTA_MAGIC))
        if len(raw) != _DELTA_HEADER.size:
            raise EngineError("session delta payload is truncated (header)")
        (_, version, fingerprint, start, n, n_vocab, has_logits, kv_len,
         base_digest) = _DELTA_HEADER.unpack(raw)  # fmt: skip
        if version != DELTA_VERSION:
            raise EngineError(f"session delta payload version {version} is not supported")
        if fingerprint.hex() != info.fingerprint or n_vocab != info.n_vocab:
            raise EngineError("session delta payload was made by a different model")
        if not self.supports_delta:
            raise EngineError(f"{info.family} sessions cannot load delta payloads")
        if start != len(self._tokens):
            raise EngineError(
                f"session delta payload extends {start} tokens; the session holds"
                f" {len(self._tokens)}"
            )
        if token_digest(self._tokens) != base_digest:
            raise EngineError("session delta payload extends other tokens than the session's")
        if not start <= n <= self.n_ctx:
            raise EngineError(
                f"session delta payload of {n} tokens does not fit n_ctx {self.n_ctx}"
            )
        if kv_len != self._state.kv_payload_bytes(n, start):
            raise EngineError("session delta payload KV size does not match this model")
        tokens = _read_array(fp, "<i4", n - start)
        if len(tokens) and (tokens.min() < 0 or tokens.max() >= n_vocab):
            raise EngineError("session delta payload holds a token outside the vocabulary")
        logits = _read_array(fp, "<f4", n_vocab) if has_logits else None
        self._state.read_kv(fp, n, start)  # an error leaves it holding the base
        self._tokens.extend(int(t) for t in tokens)
        if logits is not None:
            logits = logits.astype(np.float32)
            logits.flags.writeable = False
        self._logits = logits

    def close(self) -> None:
        self._state.close()
        self._tokens = []
        self._logits = None

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_array(fp: BinaryIO, dtype: str, count: int) -> np.ndarray:
    nbytes = np.dtype(dtype).itemsize * count
    raw = fp.read(nbytes)
    if len(raw) != nbytes:
        raise EngineError("session payload is truncated")
    return np.frombuffer(raw, dtype=dtype)
