"""The llama model family: GGUF validation and the ctypes face of native/llama.{c,h}.

`load(gguf_file, pool)` checks every hyper-parameter and tensor the forward pass needs
(names, shapes, quant types) and hands the mmap'd weight addresses to C; nothing is
copied except the rare norm vector stored in a half type. A `LlamaState` is one session's
KV cache in C memory. engine.py drives both through the family interface:

    model.n_vocab, model.n_ctx_train, model.n_embd, model.n_layer, model.new_state(n_ctx)
    state.eval(tokens_int32, logits_out, all_logits), state.n_past, state.set_n_past(n),
    state.kv_bytes, state.kv_payload_bytes(n), state.write_kv(fp, n), state.read_kv(fp, n),
    state.close()
"""

from __future__ import annotations

import ctypes
from typing import BinaryIO

import numpy as np

from ds4d.engine import native
from ds4d.engine.errors import EngineError, ModelLoadError
from ds4d.engine.gguf_file import GGUFFile, Tensor
from ds4d.engine.native import lib

FAMILY = "llama"

# Slot order of native/llama.h.
GLOBAL_SLOTS = ("token_embd.weight", "output_norm.weight", "output.weight", "rope_freqs.weight")
LAYER_SLOTS = (
    "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
    "attn_output.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias",
    "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight",
)  # fmt: skip
OPTIONAL = {"output.weight", "rope_freqs.weight", "attn_q.bias", "attn_k.bias",
            "attn_v.bias", "attn_output.bias"}  # fmt: skip
MATRICES = {"token_embd.weight", "output.weight", "attn_q.weight", "attn_k.weight",
            "attn_v.weight", "attn_output.weight", "ffn_gate.weight", "ffn_up.weight",
            "ffn_down.weight"}  # fmt: skip
VECTOR_TYPES = {native.F32, native.F16, native.BF16}

ERRORS = {-1: "context is full", -2: "token id out of range", -3: "out of memory"}


class HParams(ctypes.Structure):
    _fields_ = [
        *[(n, ctypes.c_int32) for n in ("n_vocab", "n_embd", "n_layer", "n_head",
                                        "n_head_kv", "head_dim", "n_ff", "n_rot")],
        ("rope_base", ctypes.c_float),
        ("rope_scale", ctypes.c_float),
        ("rms_eps", ctypes.c_float),
        ("yarn_ext_factor", ctypes.c_float),
        ("rope_attn_factor", ctypes.c_float),
        ("yarn_beta_fast", ctypes.c_float),
        ("yarn_beta_slow", ctypes.c_float),
        ("n_ctx_orig", ctypes.c_int32),
    ]  # fmt: skip


def _declare() -> None:
    vp, i64, i32, c_int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int
    fp = native.c_float_p
    for name, restype, argtypes in (
        ("ds4n_llama_new", vp, [ctypes.POINTER(HParams), ctypes.POINTER(vp), ctypes.POINTER(i32)]),
        ("ds4n_llama_free", None, [vp]),
        ("ds4n_llama_session_new", vp, [vp, i64]),
        ("ds4n_llama_session_free", None, [vp]),
        ("ds4n_llama_session_n_past", i64, [vp]),
        ("ds4n_llama_session_n_ctx", i64, [vp]),
        ("ds4n_llama_session_kv_bytes", i64, [vp]),
        ("ds4n_llama_session_set_n_past", c_int, [vp, i64]),
        ("ds4n_llama_eval", c_int, [vp, vp, vp, ctypes.POINTER(i32), i64, fp, c_int]),
        ("ds4n_llama_kv_get", c_int, [vp, c_int, c_int, i64, fp]),
        ("ds4n_llama_kv_set", c_int, [vp, c_int, c_int, i64, fp]),
    ):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes


_declare()


def _fptr(a: np.ndarray | None) -> ctypes._Pointer | None:
    if a is None:
        return None
    assert a.dtype == np.float32 and a.flags.c_contiguous
    return ctypes.cast(a.ctypes.data, native.c_float_p)


class LlamaModel:
    """Validated weights of one llama GGUF, bound to a native model object."""

    family = FAMILY

    def __init__(self, gf: GGUFFile, pool: native.Pool) -> None:
        self.gf = gf
        self.pool = pool
        arch = gf.architecture

        def hp(key: str, default: object = None) -> object:
            full = f"{arch}.{key}"
            value = gf.require(full) if default is None else gf.get(full, default)
            if isinstance(value, (list, tuple)):  # e.g. per-layer head counts
                raise ModelLoadError(f"hyper-parameter {full} is a list; one value expected")
            return value

        self.n_layer = int(hp("block_count"))
        self.n_embd = int(hp("embedding_length"))
        self.n_ff = int(hp("feed_forward_length"))
        self.n_head = int(hp("attention.head_count"))
        self.n_head_kv = int(hp("attention.head_count_kv", self.n_head))
        self.head_dim = int(hp("attention.key_length", self.n_embd // max(self.n_head, 1)))
        value_len = int(hp("attention.value_length", self.head_dim))
        self.n_rot = int(hp("rope.dimension_count", self.head_dim))
        self.rope_base = float(hp("rope.freq_base", 10000.0))
        self.rms_eps = float(hp("attention.layer_norm_rms_epsilon"))
        self.n_ctx_train = int(hp("context_length"))
        embd = gf.tensor("token_embd.weight")
        self.n_vocab = int(hp("vocab_size", embd.shape[1] if len(embd.shape) == 2 else 0))
        if gf.has_tensor("blk.0.ffn_gate_inp.weight") or int(hp("expert_count", 0)):
            raise ModelLoadError("mixture-of-experts llama models are not supported")
        rope_scale = 1.0
        scaling = str(hp("rope.scaling.type", "none"))
        if scaling == "linear":
            rope_scale = 1.0 / float(hp("rope.scaling.factor", 1.0))
        elif scaling != "none":
            raise ModelLoadError(f"rope scaling type {scaling!r} is not supported (none, linear)")
        if (
            min(self.n_layer, self.n_embd, self.n_ff, self.n_head, self.n_head_kv) <= 0
            or self.n_head % self.n_head_kv
            or value_len != self.head_dim
            or self.head_dim % 2
            or not 0 < self.n_rot <= self.head_dim
            or self.n_rot % 2
        ):
            raise ModelLoadError(
                f"unsupported llama shape: {self.n_head} heads / {self.n_head_kv} kv heads,"
                f" head dim {self.head_dim} (value {value_len}), rope dims {self.n_rot}"
            )
        n_q, n_kv = self.n_head * self.head_dim, self.n_head_kv * self.head_dim
        E, F, V = self.n_embd, self.n_ff, self.n_vocab
        expected = {
            "token_embd.weight": (E, V), "output_norm.weight": (E,), "output.weight": (E, V),
            "rope_freqs.weight": (self.n_rot // 2,), "attn_norm.weight": (E,),
            "attn_q.weight": (E, n_q), "attn_k.weight": (E, n_kv), "attn_v.weight": (E, n_kv),
            "attn_output.weight": (n_q, E), "attn_q.bias": (n_q,), "attn_k.bias": (n_kv,),
            "attn_v.bias": (n_kv,), "attn_output.bias": (E,), "ffn_norm.weight": (E,),
            "ffn_gate.weight": (E, F), "ffn_up.weight": (E, F), "ffn_down.weight": (F, E),
        }  # fmt: skip
        self._keep: list[np.ndarray] = []  # F32 copies of half-precision vectors
        names = list(GLOBAL_SLOTS) + [
            f"blk.{il}.{s}" for il in range(self.n_layer) for s in LAYER_SLOTS
        ]
        ptrs = (ctypes.c_void_p * len(names))()
        types = (ctypes.c_int32 * len(names))()
        for i, name in enumerate(names):
            short = name.split(".", 2)[2] if name.startswith("blk.") else name
            if short in OPTIONAL and not gf.has_tensor(name):
                continue
            t = gf.tensor(name)
            if t.shape != expected[short]:
                raise ModelLoadError(
                    f"tensor {name} has shape {list(t.shape)}, expected {list(expected[short])}"
                )
            ptrs[i], types[i] = self._bind(t, matrix=short in MATRICES)
        params = HParams(
            n_vocab=V, n_embd=E, n_layer=self.n_layer, n_head=self.n_head,
            n_head_kv=self.n_head_kv, head_dim=self.head_dim, n_ff=F, n_rot=self.n_rot,
            rope_base=self.rope_base, rope_scale=rope_scale, rms_eps=self.rms_eps,
        )  # fmt: skip
        self._handle = lib.ds4n_llama_new(ctypes.byref(params), ptrs, types)
        if not self._handle:
            raise ModelLoadError("the native engine refused this llama model's shape")
        # Per token: K and V of every layer, n_head_kv * head_dim float32 each.
        self.kv_token_bytes = 2 * self.n_layer * n_kv * 4

    def _bind(self, t: Tensor, matrix: bool) -> tuple[int, int]:
        if matrix:
            if not lib.ds4n_type_supported(t.type):
                supported = ", ".join(n for n, v in native.TYPES.items()
                                      if lib.ds4n_type_supported(v))  # fmt: skip
                raise ModelLoadError(
                    f"tensor {t.name} has quant type {t.type_name}, which this engine cannot run"
                    f" (supported: {supported})"
                )
            if t.shape[0] % lib.ds4n_type_block_size(t.type):
                raise ModelLoadError(f"tensor {t.name}: row length {t.shape[0]} is not a"
                                     f" multiple of the {t.type_name} block size")  # fmt: skip
            return t.address, t.type
        if t.type not in VECTOR_TYPES:
            raise ModelLoadError(
                f"tensor {t.name} has type {t.type_name}, expected F32, F16 or BF16"
            )
        if t.type == native.F32:
            return t.address, t.type
        vec = native.dequantize(t.type, np.ascontiguousarray(t.data).view(np.uint8),
                                int(np.prod(t.shape)))  # fmt: skip
        self._keep.append(vec)
        return vec.ctypes.data, native.F32

    @property
    def handle(self) -> int:
        if not self._handle:
            raise EngineError("model is closed")
        return self._handle

    def new_state(self, n_ctx: int) -> LlamaState:
        return LlamaState(self, n_ctx)

    def close(self) -> None:
        if self._handle:
            lib.ds4n_llama_free(self._handle)
            self._handle = None


class LlamaState:
    """One session's KV cache (C memory) and position count."""

    def __init__(self, model: LlamaModel, n_ctx: int) -> None:
        self.model = model
        self.n_ctx = int(n_ctx)
        self._handle = lib.ds4n_llama_session_new(model.handle, self.n_ctx)
        if not self._handle:
            raise EngineError(f"cannot allocate a KV cache for {n_ctx} tokens")

    @property
    def handle(self) -> int:
        if not self._handle:
            raise EngineError("session is closed")
        return self._handle

    @property
    def n_past(self) -> int:
        return int(lib.ds4n_llama_session_n_past(self.handle))

    def set_n_past(self, n: int) -> None:
        if lib.ds4n_llama_session_set_n_past(self.handle, n) != 0:
            raise EngineError(f"cannot hold {n} tokens in a {self.n_ctx}-token session")

    @property
    def kv_bytes(self) -> int:
        return int(lib.ds4n_llama_session_kv_bytes(self.handle))

    def eval(self, tokens: np.ndarray, logits: np.ndarray | None, all_logits: bool = False) -> None:
        """Appends tokens (int32, C-contiguous); fills logits (n_vocab, or n x n_vocab)."""
        rc = lib.ds4n_llama_eval(
            self.model.handle, self.handle, self.model.pool.handle,
            tokens.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), len(tokens),
            _fptr(logits), int(all_logits),
        )  # fmt: skip
        if rc != 0:
            raise EngineError(f"llama eval failed: {ERRORS.get(rc, rc)}")

    def kv_payload_bytes(self, n: int) -> int:
        return n * self.model.kv_token_bytes

    def write_kv(self, fp: BinaryIO, n: int) -> None:
        """K then V of each layer for positions [0, n), as [n_head_kv][n][head_dim] f32."""
        m = self.model
        buf = np.empty(m.n_head_kv * n * m.head_dim, np.float32)
        for il in range(m.n_layer):
            for which in (0, 1):
                lib.ds4n_llama_kv_get(self.handle, il, which, n, _fptr(buf))
                fp.write(memoryview(buf).cast("B"))

    def read_kv(self, fp: BinaryIO, n: int) -> None:
        m = self.model
        buf = np.empty(m.n_head_kv * n * m.head_dim, np.float32)
        view = memoryview(buf).cast("B")
        for il in range(m.n_layer):
            for which in (0, 1):
                _read_exact(fp, view)
                lib.ds4n_llama_kv_set(self.handle, il, which, n, _fptr(buf))

    def close(self) -> None:
        if self._handle:
            lib.ds4n_llama_session_free(self._handle)
            self._handle = None

    def __del__(self) -> None:
        self.close()


def _read_exact(fp: BinaryIO, view: memoryview) -> None:
    done = 0
    while done < len(view):
        got = fp.readinto(view[done:])
        if not got:
            raise EngineError("session payload is truncated (KV rows)")
        done += got


def load(gf: GGUFFile, pool: native.Pool) -> LlamaModel:
    return LlamaModel(gf, pool)
