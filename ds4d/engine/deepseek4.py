"""The deepseek4 model family (DeepSeek V4 Flash, ds4's layout): the ctypes face of
native/deepseek4.{c,h}, plugged into engine.py's family interface (see llama.py).

`load(gguf_file, pool)` validates the file against deepseek4_layout (every problem one
line of a ModelLoadError) and binds the mmapped tensors to C; no weight is copied, so a
file larger than RAM opens and the OS pages experts in as they are used. The C side trusts
none of it: every pointer comes with its length, which must match the shape the parameters
imply, and indices read from the file (the routing table's expert ids) are checked before
use; every nonzero return code is raised as an EngineError with its ERRORS message.

A session's state lives in C: the raw 128-row window, the compressed rows of the ratio-4
and ratio-128 layers, the indexer rows and the compressor frontiers. Its payload (the
part after the engine's tokens and logits) follows ds4's "DSV4" layout, spec section 3.4:

    header: 13 x u32  magic "DSV4", version 1, ctx_size, prefill_cap (0: no fixed cap),
                      raw_cap = min(window, ctx), raw_window, comp_cap = ctx/4 + 2,
                      n_tokens, n_layer, head_dim, idx_head_dim, n_vocab,
                      raw_live = min(raw_cap, n_tokens)
    n_tokens x u32 token ids
    n_layer x u32 n_comp, then n_layer x u32 n_index_comp
    per layer: raw_live raw rows (oldest first) x head_dim f32;
               ratio != 0: n_comp rows x head_dim, attention frontier kv, then score;
               ratio == 4: n_index_comp rows x idx_head_dim, indexer frontier kv, score.

Rewinding: the compressor frontiers and the raw window cannot be rolled back in place.
Compressed and indexer rows are append-only, so only the window ring and the frontiers
need a copy: the state snapshots them at the start of every prefill call (every chunk),
keeping the last few. A rewind to n restores the latest snapshot at or before n, cuts
the row counts, and replays the tokens from there to n; with no snapshot it replays from
the start. Exact either way; an agent's next turn typically diverges near the end of the
previous prompt, so the replay is at most a chunk plus the generated reply.
"""

from __future__ import annotations

import ctypes
import io
import struct
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

from ds4d.engine import decoder, native
from ds4d.engine import deepseek4_layout as layout
from ds4d.engine.errors import EngineError
from ds4d.engine.family import NATIVE_KV
from ds4d.engine.gguf_file import GGUFFile
from ds4d.engine.native import lib
from ds4d.engine.steering import NativeSteer, SteeringError

if TYPE_CHECKING:  # imported where used: the tokenizer loads the tokenizers package
    from ds4d.engine.ds4_tokenizer import DS4Tokenizer

FAMILY = "deepseek4"

# Slot order of native/deepseek4.h.
GLOBAL_SLOTS = (
    "token_embd.weight", "output_hc_base.weight", "output_hc_fn.weight",
    "output_hc_scale.weight", "output_norm.weight", "output.weight",
)  # fmt: skip
LAYER_SLOTS = (
    "hc_attn_fn.weight", "hc_attn_scale.weight", "hc_attn_base.weight", "attn_norm.weight",
    "attn_q_a.weight", "attn_q_a_norm.weight", "attn_q_b.weight", "attn_kv.weight",
    "attn_kv_a_norm.weight", "attn_sinks.weight", "attn_output_a.weight", "attn_output_b.weight",
    "attn_compressor_ape.weight", "attn_compressor_kv.weight", "attn_compressor_gate.weight",
    "attn_compressor_norm.weight",
    "indexer.attn_q_b.weight", "indexer.proj.weight", "indexer_compressor_ape.weight",
    "indexer_compressor_kv.weight", "indexer_compressor_gate.weight",
    "indexer_compressor_norm.weight",
    "hc_ffn_fn.weight", "hc_ffn_scale.weight", "hc_ffn_base.weight", "ffn_norm.weight",
    "ffn_gate_inp.weight", "exp_probs_b.bias", "ffn_gate_exps.weight", "ffn_up_exps.weight",
    "ffn_down_exps.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight",
    "ffn_down_shexp.weight", "ffn_gate_tid2eid.weight",
)  # fmt: skip

# Tokens per forward call when a rewind replays the kept prefix.
REPLAY_CHUNK = 256
# Rewind snapshots kept per session (each: the raw ring and frontiers, ~23 MB at full size).
MAX_SNAPSHOTS = 8

PAYLOAD_MAGIC = 0x34565344  # "DSV4"
PAYLOAD_VERSION = 1
_PAYLOAD_HEADER = struct.Struct("<13I")

# The DSV4_ERR_* codes of native/deepseek4.h: the other families' codes (-1..-4, the
# expert id -4 is a hash-routing table entry here) and those only this family returns.
ERRORS = {
    **decoder.ERRORS,
    -5: "a tensor the forward needs is not bound",
    -6: "a tensor's type or size does not fit its slot",
    -7: "bad argument (pointer, index, length or count)",
}


def error_text(rc: int) -> str:
    return ERRORS.get(rc, f"unknown native error {rc}")


def _check(rc: int, what: str) -> None:
    """Raises EngineError for a nonzero native return code."""
    if rc != 0:
        raise EngineError(f"deepseek4 {what} failed: {error_text(rc)}")


_INT_FIELDS = (
    "n_layer", "n_embd", "n_vocab", "n_head", "head_dim", "n_rot", "q_lora_rank",
    "o_lora_rank", "o_groups", "n_expert", "n_expert_used", "n_ff_exp", "n_hash_layer",
    "window", "idx_n_head", "idx_head_dim", "idx_top_k", "n_hc", "sinkhorn_iters",
    "rope_orig_ctx",
)  # fmt: skip
_FLOAT_FIELDS = (
    "hc_eps", "rms_eps", "swiglu_clamp", "rope_base", "compress_rope_base", "rope_scale",
    "yarn_beta_fast", "yarn_beta_slow", "expert_weight_scale",
)  # fmt: skip


class Params(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int32) for n in _INT_FIELDS] + [
        (n, ctypes.c_float) for n in _FLOAT_FIELDS
    ]


class LayerState(ctypes.Structure):
    _fields_ = [
        *[(n, native.c_float_p) for n in ("raw", "comp", "icomp", "attn_kv", "attn_score",
                                           "idx_kv", "idx_score")],
        *[(n, ctypes.c_int64) for n in ("raw_cap", "comp_cap", "n_comp", "n_icomp", "attn_rows",
                                         "attn_width", "idx_rows", "idx_width")],
        *[(n, ctypes.c_int32) for n in ("ratio", "head_dim", "idx_head_dim")],
    ]  # fmt: skip


def _declare() -> None:
    vp, i64, c_int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    i64p = ctypes.POINTER(i64)
    for name, restype, argtypes in (
        ("ds4n_dsv4_model_new", vp,
         [ctypes.POINTER(Params), ctypes.POINTER(ctypes.c_int32), i64]),
        ("ds4n_dsv4_model_free", None, [vp]),
        ("ds4n_dsv4_set_tensor", c_int, [vp, c_int, c_int, vp, c_int, i64]),
        ("ds4n_dsv4_state_new", vp, [vp, i64]),
        ("ds4n_dsv4_state_free", None, [vp]),
        ("ds4n_dsv4_state_reset", None, [vp]),
        ("ds4n_dsv4_state_pos", i64, [vp]),
        ("ds4n_dsv4_state_set_steer", ctypes.c_int, [vp, vp]),
        ("ds4n_dsv4_state_layer", c_int, [vp, c_int, ctypes.POINTER(LayerState)]),
        ("ds4n_dsv4_state_restore", c_int, [vp, i64, i64p, i64p, i64]),
        ("ds4n_dsv4_eval", c_int,
         [vp, vp, vp, ctypes.POINTER(ctypes.c_int32), i64, native.c_float_p, i64, c_int]),
    ):  # fmt: skip
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes


_declare()


class DS4Model:
    """A validated deepseek4 GGUF bound to the native forward pass."""

    def __init__(self, gf: GGUFFile, pool: native.Pool) -> None:
        self.gguf = gf
        self.pool = pool
        self.layout = layout.validate(gf)
        p = self.params = self.layout.params
        self.n_vocab, self.n_embd, self.n_layer = p.n_vocab, p.n_embd, p.n_layer
        self.n_ctx_train = p.n_ctx_train
        cp = Params(**{f: getattr(p, f) for f in _INT_FIELDS + _FLOAT_FIELDS})
        ratios = (ctypes.c_int32 * p.n_layer)(*p.compress_ratios)
        self._handle: int | None = lib.ds4n_dsv4_model_new(ctypes.byref(cp), ratios, p.n_layer)
        if not self._handle:
            raise EngineError("the native deepseek4 forward rejected these parameters")
        for slot, name in enumerate(GLOBAL_SLOTS):
            self._bind(-1, slot, name)
        for il in range(p.n_layer):
            for slot, name in enumerate(LAYER_SLOTS):
                self._bind(il, slot, f"blk.{il}.{name}")

    def _bind(self, il: int, slot: int, name: str) -> None:
        t = self.layout.tensors.get(name)
        if t is None:  # absent optional tensor (e.g. the router bias of hash layers)
            return
        # tensors are numpy views on the read-only mmap: C needs the address and the length
        rc = lib.ds4n_dsv4_set_tensor(self._handle, il, slot, t.address, t.type, t.n_bytes)
        if rc:
            raise EngineError(f"cannot bind tensor {name}: {error_text(rc)}")

    @property
    def handle(self) -> int:
        if not self._handle:
            raise EngineError("model is closed")
        return self._handle

    def new_state(self, n_ctx: int, kv_type: str = NATIVE_KV) -> DS4State:
        """A session state; the compressed cache has its own layout whatever `kv_type`."""
        return DS4State(self, n_ctx)

    def close(self) -> None:
        if self._handle:
            lib.ds4n_dsv4_model_free(self._handle)
            self._handle = None


class DS4State:
    """One session's deepseek4 state in C memory (see the module docstring)."""

    def __init__(self, model: DS4Model, n_ctx: int) -> None:
        self.model = model
        self.n_ctx = int(n_ctx)
        self._handle: int | None = lib.ds4n_dsv4_state_new(model.handle, self.n_ctx)
        if not self._handle:
            raise EngineError(f"cannot allocate deepseek4 state for {n_ctx} tokens")
        self._tokens: list[int] = []  # kept to replay a prefix on rewind
        self._snapshots: list[tuple[int, list[np.ndarray]]] = []  # (pos, buffers), ascending
        self.replayed = 0  # tokens the last rewind had to evaluate again
        self._steer: NativeSteer | None = None  # kept alive while the C state reads it

    def set_steer(self, steer: NativeSteer | None) -> None:
        """Steers this state's next evaluations (None: none); see steering.py."""
        self.model.handle  # noqa: B018 - raises once the model is closed (the C call reads it)
        if lib.ds4n_dsv4_state_set_steer(self.handle, steer.handle if steer else None):
            raise SteeringError("steering directions do not fit this model's layers and width")
        self._steer = steer

    @property
    def handle(self) -> int:
        if not self._handle:
            raise EngineError("session is closed")
        self.model.handle  # noqa: B018 - raises once the model is closed (the C state reads it)
        return self._handle

    @property
    def n_past(self) -> int:
        return int(lib.ds4n_dsv4_state_pos(self.handle))

    def rewind(self, n: int) -> None:
        """Keep the first n tokens: restore the latest snapshot at or before n (or reset)
        and evaluate the tokens from there to n again (forward passes: `replayed` counts
        them)."""
        if not 0 <= n <= self.n_past:
            raise EngineError(f"cannot hold {n} tokens: the state has {self.n_past}")
        if n == self.n_past:
            return
        keep = np.array(self._tokens[:n], np.int32)
        self._snapshots = [snap for snap in self._snapshots if snap[0] <= n]
        start = self._restore_snapshot() if self._snapshots else 0
        if not start:
            lib.ds4n_dsv4_state_reset(self.handle)
        self._tokens = self._tokens[:start]
        self.replayed = n - start
        for a in range(start, n, REPLAY_CHUNK):  # chunked: scratch memory grows with a call
            self.eval(keep[a : min(n, a + REPLAY_CHUNK)], None)

    def _buffers(self) -> list[np.ndarray]:
        """Views on the state that is not append-only: raw rings and frontiers."""
        out = []
        for ls in self.layers():
            out.append(np.ctypeslib.as_array(ls.raw, (ls.raw_cap, ls.head_dim)))
            for ptr, rows, width in (
                (ls.attn_kv, ls.attn_rows, ls.attn_width), (ls.attn_score, ls.attn_rows, ls.attn_width),
                (ls.idx_kv, ls.idx_rows, ls.idx_width), (ls.idx_score, ls.idx_rows, ls.idx_width),
            ):  # fmt: skip
                if rows:
                    out.append(np.ctypeslib.as_array(ptr, (rows, width)))
        return out

    def _take_snapshot(self) -> None:
        pos = self.n_past
        if self._snapshots and self._snapshots[-1][0] == pos:
            return
        self._snapshots.append((pos, [b.copy() for b in self._buffers()]))
        del self._snapshots[:-MAX_SNAPSHOTS]

    def _restore_snapshot(self) -> int:
        """Back to the latest snapshot; returns its position."""
        pos, saved = self._snapshots[-1]
        for view, copy in zip(self._buffers(), saved, strict=True):
            view[...] = copy
        n_comp, n_icomp, _ = self._counts(pos)
        counts = [np.asarray(c, np.int64) for c in (n_comp, n_icomp)]
        i64p = ctypes.POINTER(ctypes.c_int64)
        rc = lib.ds4n_dsv4_state_restore(
            self.handle, pos, counts[0].ctypes.data_as(i64p), counts[1].ctypes.data_as(i64p),
            self.model.n_layer,
        )  # fmt: skip
        if rc:  # cannot happen for a snapshot of this state; be safe: start over
            self._snapshots = []
            return 0
        return pos

    @property
    def kv_bytes(self) -> int:
        """Bytes reserved for n_ctx (compressed rows are committed as they fill), with
        room for the rewind snapshots."""
        rows, ring = 0, 0
        for ls in self.layers():
            ring += ls.raw_cap * ls.head_dim
            ring += 2 * (ls.attn_rows * ls.attn_width + ls.idx_rows * ls.idx_width)
            rows += ls.comp_cap * ls.head_dim
            if ls.ratio == 4:
                rows += ls.comp_cap * ls.idx_head_dim
        return 4 * (rows + (1 + MAX_SNAPSHOTS) * ring)

    def eval(self, tokens: np.ndarray, logits: np.ndarray | None, all_logits: bool = False) -> None:
        """Appends tokens (int32, C-contiguous); fills logits (n_vocab, or n x n_vocab)."""
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        if logits is not None and (logits.dtype != np.float32 or not logits.flags.c_contiguous):
            raise EngineError("deepseek4 eval: logits must be a C-contiguous float32 array")
        if len(tokens) > 1:  # a prefill call: remember where it started, for rewinds
            self._take_snapshot()
        out = None if logits is None else logits.ctypes.data_as(native.c_float_p)
        rc = lib.ds4n_dsv4_eval(
            self.model.handle, self.handle, self.model.pool.handle,
            tokens.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), len(tokens), out,
            0 if logits is None else logits.size, int(all_logits),
        )  # fmt: skip
        _check(rc, "eval")
        self._tokens.extend(int(t) for t in tokens)

    # -- payload ------------------------------------------------------------------------

    def layers(self) -> list[LayerState]:
        out = []
        for il in range(self.model.n_layer):
            ls = LayerState()
            _check(lib.ds4n_dsv4_state_layer(self.handle, il, ctypes.byref(ls)), "state_layer")
            out.append(ls)
        return out

    def _counts(self, n: int) -> tuple[list[int], list[int], int]:
        """Compressed and indexer row counts, and raw_live, after n tokens."""
        p = self.model.params
        n_comp = [n // r if r else 0 for r in p.compress_ratios]
        n_icomp = [n // 4 if r == 4 else 0 for r in p.compress_ratios]
        return n_comp, n_icomp, min(p.window, n)

    # The compressed rows and the frontiers of n tokens are not a prefix of those of a
    # longer state (the frontiers are rewritten as tokens arrive), so a payload is always
    # the whole state: no delta checkpoints for this family.
    supports_ranges = False

    def kv_payload_bytes(self, n: int, start: int = 0) -> int:
        _full_only(start)
        p = self.model.params
        n_comp, n_icomp, raw_live = self._counts(n)
        size = _PAYLOAD_HEADER.size + 4 * n + 8 * p.n_layer
        for il, r in enumerate(p.compress_ratios):
            size += 4 * raw_live * p.head_dim
            if r:
                rows, width = (8, 2 * p.head_dim) if r == 4 else (r, p.head_dim)
                size += 4 * (n_comp[il] * p.head_dim + 2 * rows * width)
            if r == 4:
                size += 4 * (n_icomp[il] * p.idx_head_dim + 2 * 8 * 2 * p.idx_head_dim)
        return size

    def _views(
        self, ls: LayerState, n: int, n_comp: int, n_icomp: int, raw_live: int
    ) -> tuple[np.ndarray, list[int], list[np.ndarray]]:
        """numpy views on one layer's C buffers, in payload order (raw rows in logical
        order are a gather from the ring, returned with their ring indices)."""
        hd, ihd = ls.head_dim, ls.idx_head_dim
        raw = np.ctypeslib.as_array(ls.raw, (ls.raw_cap, hd))
        ring = [p % ls.raw_cap for p in range(n - raw_live, n)]
        parts: list[np.ndarray] = []
        if ls.ratio:
            parts.append(np.ctypeslib.as_array(ls.comp, (ls.comp_cap, hd))[:n_comp])
            parts.append(np.ctypeslib.as_array(ls.attn_kv, (ls.attn_rows, ls.attn_width)))
            parts.append(np.ctypeslib.as_array(ls.attn_score, (ls.attn_rows, ls.attn_width)))
        if ls.ratio == 4:
            parts.append(np.ctypeslib.as_array(ls.icomp, (ls.comp_cap, ihd))[:n_icomp])
            parts.append(np.ctypeslib.as_array(ls.idx_kv, (ls.idx_rows, ls.idx_width)))
            parts.append(np.ctypeslib.as_array(ls.idx_score, (ls.idx_rows, ls.idx_width)))
        return raw, ring, parts

    def kv_rows(self, n: int, start: int = 0) -> list[bytes]:
        """A copy of the payload write_kv would write (always the whole state)."""
        _full_only(start)
        buf = io.BytesIO()
        self.write_kv(buf, n)
        return [buf.getvalue()]

    def write_kv(self, fp: BinaryIO, n: int, start: int = 0) -> None:
        _full_only(start)
        if n != self.n_past:
            raise EngineError(f"deepseek4 state holds {self.n_past} tokens, not {n}")
        p = self.model.params
        layers = self.layers()
        n_comp = [int(ls.n_comp) for ls in layers]
        n_icomp = [int(ls.n_icomp) for ls in layers]
        raw_live = min(p.window, n)
        fp.write(_PAYLOAD_HEADER.pack(
            PAYLOAD_MAGIC, PAYLOAD_VERSION, self.n_ctx, 0, min(p.window, self.n_ctx), p.window,
            self.n_ctx // 4 + 2, n, p.n_layer, p.head_dim, p.idx_head_dim, p.n_vocab, raw_live,
        ))  # fmt: skip
        fp.write(np.asarray(self._tokens, "<u4").tobytes())
        fp.write(np.asarray(n_comp + n_icomp, "<u4").tobytes())
        for il, ls in enumerate(layers):
            raw, ring, parts = self._views(ls, n, n_comp[il], n_icomp[il], raw_live)
            fp.write(np.ascontiguousarray(raw[ring]).tobytes())
            for a in parts:
                fp.write(np.ascontiguousarray(a).tobytes())

    def read_kv(self, fp: BinaryIO, n: int, start: int = 0) -> None:
        """Restores a payload written by write_kv for n tokens; EngineError if it does not
        fit this model (the state is then empty)."""
        _full_only(start)
        p = self.model.params
        lib.ds4n_dsv4_state_reset(self.handle)
        self._tokens = []
        self._snapshots = []
        head = _read_exact(fp, _PAYLOAD_HEADER.size)
        (magic, version, ctx, _prefill_cap, _raw_cap, window, _comp_cap, n_tok, n_layer, hd, ihd,
         n_vocab, raw_live) = _PAYLOAD_HEADER.unpack(head)  # fmt: skip
        if magic != PAYLOAD_MAGIC or version != PAYLOAD_VERSION:
            raise EngineError("not a deepseek4 (DSV4 v1) state payload")
        if (n_layer, hd, ihd, window, n_vocab) != (
            p.n_layer,
            p.head_dim,
            p.idx_head_dim,
            p.window,
            p.n_vocab,
        ):
            raise EngineError("deepseek4 state payload has another model's layout")
        if n_tok > self.n_ctx:
            raise EngineError(
                f"deepseek4 state of {n_tok} tokens (ctx {ctx}) exceeds n_ctx {self.n_ctx}"
            )
        want_comp, want_icomp, want_live = self._counts(n)
        if n_tok != n or raw_live != want_live:
            raise EngineError("deepseek4 state payload token count does not match")
        tokens = np.frombuffer(_read_exact(fp, 4 * n), "<u4")
        bad = np.flatnonzero(tokens >= p.n_vocab)
        if len(bad):  # replaying them on a rewind would fail; refuse the payload now
            raise EngineError(
                f"deepseek4 state payload holds token id {int(tokens[bad[0]])} at position"
                f" {int(bad[0])}, outside the vocabulary of {p.n_vocab}"
            )
        counts = np.frombuffer(_read_exact(fp, 8 * n_layer), "<u4").astype(np.int64)
        n_comp, n_icomp = counts[:n_layer], counts[n_layer:]
        if list(n_comp) != want_comp or list(n_icomp) != want_icomp:
            raise EngineError("deepseek4 state payload row counts do not match its tokens")
        for il, ls in enumerate(self.layers()):
            raw, ring, parts = self._views(ls, n, int(n_comp[il]), int(n_icomp[il]), raw_live)
            rows = _read_exact(fp, 4 * raw_live * hd)
            raw[ring] = np.frombuffer(rows, "<f4").reshape(raw_live, hd)
            for a in parts:
                a[...] = np.frombuffer(_read_exact(fp, a.nbytes), "<f4").reshape(a.shape)
        if lib.ds4n_dsv4_state_restore(
            self.handle, n,
            n_comp.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)),
            n_icomp.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)), n_layer,
        ):  # fmt: skip
            lib.ds4n_dsv4_state_reset(self.handle)
            raise EngineError(f"deepseek4 state payload does not fit a {self.n_ctx}-token session")
        self._tokens = [int(t) for t in tokens]

    def close(self) -> None:
        if self._handle:
            lib.ds4n_dsv4_state_free(self._handle)
            self._handle = None

    def __del__(self) -> None:
        self.close()


def _full_only(start: int) -> None:
    if start:
        raise EngineError("deepseek4 state payloads are whole states (no row ranges)")


def _read_exact(fp: BinaryIO, n: int) -> bytes:
    data = fp.read(n)
    if len(data) != n:
        raise EngineError("session payload is truncated (deepseek4 state)")
    return data


def load(gf: GGUFFile, pool: native.Pool) -> DS4Model:
    return DS4Model(gf, pool)


def make_tokenizer(gf: GGUFFile) -> DS4Tokenizer:
    """The V4 tokenizer from the GGUF's own vocabulary."""
    from ds4d.engine.ds4_tokenizer import DS4Tokenizer

    return DS4Tokenizer.from_gguf(gf)
