"""What the MoE decoder families (qwen3moe.py, gptoss.py) share on the Python side: the
session state over native/moe_session.h, and the checks that turn GGUF tensors into the
weight slots of a native model (shape, quant type, F32 copies of half-precision vectors).

The state has the interface engine.py expects of every family (see ds4d/engine/llama.py),
plus `expert_bytes`, the bytes of expert weights its evals have read.
"""

from __future__ import annotations

import ctypes
from typing import BinaryIO

import numpy as np

from ds4d.engine import native
from ds4d.engine.errors import EngineError, ModelLoadError
from ds4d.engine.gguf_file import GGUFFile, Tensor
from ds4d.engine.native import lib

ERRORS = {-1: "context is full", -2: "token id out of range", -3: "out of memory",
          -4: "expert id out of range"}  # fmt: skip
VECTOR_TYPES = {native.F32, native.F16, native.BF16}


def _declare() -> None:
    vp, i64, c_int, fp = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, native.c_float_p
    for name, restype, argtypes in (
        ("ds4n_moe_session_free", None, [vp]),
        ("ds4n_moe_session_n_past", i64, [vp]),
        ("ds4n_moe_session_kv_bytes", i64, [vp]),
        ("ds4n_moe_session_expert_bytes", i64, [vp]),
        ("ds4n_moe_session_set_n_past", c_int, [vp, i64]),
        ("ds4n_moe_session_kv_get", c_int, [vp, c_int, c_int, i64, fp]),
        ("ds4n_moe_session_kv_set", c_int, [vp, c_int, c_int, i64, fp]),
    ):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes


_declare()


def declare_family(prefix: str, hparams: type[ctypes.Structure]) -> None:
    """Declares a family's native model functions: <prefix>_new/_free/_session_new/_eval."""
    vp, i64, i32, c_int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int
    for suffix, restype, argtypes in (
        ("_new", vp, [ctypes.POINTER(hparams), ctypes.POINTER(vp), ctypes.POINTER(i32)]),
        ("_free", None, [vp]),
        ("_session_new", vp, [vp, i64]),
        ("_eval", c_int, [vp, vp, vp, ctypes.POINTER(i32), i64, native.c_float_p, c_int]),
    ):
        fn = getattr(lib, prefix + suffix)
        fn.restype, fn.argtypes = restype, argtypes


class HParamReader:
    """`{arch}.{key}` metadata of one file: required unless a default is given, one value."""

    def __init__(self, gf: GGUFFile) -> None:
        self.gf = gf
        self.arch = gf.architecture

    def __call__(self, key: str, default: object = None) -> object:
        full = f"{self.arch}.{key}"
        value = self.gf.require(full) if default is None else self.gf.get(full, default)
        if isinstance(value, (list, tuple)):
            raise ModelLoadError(f"hyper-parameter {full} is a list; one value expected")
        return value


class WeightSlots:
    """Fills the tensors[] / types[] arrays of a native model from the file, checking each
    tensor's shape (GGUF order) and type; optional tensors absent from the file stay NULL."""

    def __init__(self, gf: GGUFFile, names: list[str]) -> None:
        self.gf = gf
        self.names = names
        self.ptrs = (ctypes.c_void_p * len(names))()
        self.types = (ctypes.c_int32 * len(names))()
        self._keep: list[np.ndarray] = []  # F32 copies of half-precision vectors

    def fill(self, expected: dict[str, tuple[int, ...]], optional: set[str],
             matrices: set[str]) -> None:  # fmt: skip
        for i, name in enumerate(self.names):
            short = name.split(".", 2)[2] if name.startswith("blk.") else name
            if short not in expected:
                continue  # a slot the caller fills itself
            if short in optional and not self.gf.has_tensor(name):
                continue
            t = self.gf.tensor(name)
            if t.shape != expected[short]:
                raise ModelLoadError(
                    f"tensor {name} has shape {list(t.shape)}, expected {list(expected[short])}"
                )
            self.ptrs[i], self.types[i] = self._bind(t, matrix=short in matrices)

    def set_vector(self, index: int, values: np.ndarray) -> None:
        vec = np.ascontiguousarray(values, dtype=np.float32)
        self._keep.append(vec)
        self.ptrs[index], self.types[index] = vec.ctypes.data, native.F32

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


def _fptr(a: np.ndarray | None) -> ctypes._Pointer | None:
    if a is None:
        return None
    assert a.dtype == np.float32 and a.flags.c_contiguous
    return ctypes.cast(a.ctypes.data, native.c_float_p)


class MoEModel:
    """The hyper-parameters every MoE decoder family reads, and the native model handle.
    A family sets FAMILY and PREFIX (its native symbol prefix), reads its own extras, fills
    its weight slots and calls `_open`."""

    FAMILY = ""
    PREFIX = ""

    def __init__(self, gf: GGUFFile, pool: native.Pool) -> None:
        self.gf = gf
        self.pool = pool
        self.family = self.FAMILY
        self._handle: int | None = None
        hp = self.hp = HParamReader(gf)
        self.n_layer = int(hp("block_count"))
        self.n_embd = int(hp("embedding_length"))
        self.n_head = int(hp("attention.head_count"))
        self.n_head_kv = int(hp("attention.head_count_kv", self.n_head))
        self.head_dim = int(hp("attention.key_length", self.n_embd // max(self.n_head, 1)))
        value_len = int(hp("attention.value_length", self.head_dim))
        self.n_rot = int(hp("rope.dimension_count", self.head_dim))
        self.rope_base = float(hp("rope.freq_base", 10000.0))
        self.rms_eps = float(hp("attention.layer_norm_rms_epsilon"))
        self.n_ctx_train = int(hp("context_length"))
        self.n_expert = int(hp("expert_count"))
        self.n_used = int(hp("expert_used_count"))
        self.n_ff_exp = int(hp("expert_feed_forward_length"))
        embd = gf.tensor("token_embd.weight")
        self.n_vocab = int(hp("vocab_size", embd.shape[1] if len(embd.shape) == 2 else 0))
        if (
            min(self.n_layer, self.n_embd, self.n_head, self.n_head_kv, self.n_ff_exp) <= 0
            or self.n_head % self.n_head_kv
            or value_len != self.head_dim
            or not 0 < self.n_rot <= self.head_dim
            or self.n_rot % 2
        ):
            raise ModelLoadError(
                f"unsupported {gf.architecture} shape: {self.n_head} heads / {self.n_head_kv}"
                f" kv heads, head dim {self.head_dim} (value {value_len}), rope dims"
                f" {self.n_rot}, expert width {self.n_ff_exp}"
            )
        if not 0 < self.n_used <= self.n_expert:
            raise ModelLoadError(
                f"{gf.architecture}: {self.n_used} experts used of {self.n_expert}"
            )
        # Per token: K and V of every layer, n_head_kv * head_dim float32 each.
        self.kv_token_bytes = 2 * self.n_layer * self.n_head_kv * self.head_dim * 4
        declare_family(self.PREFIX, self.HParams)

    HParams: type[ctypes.Structure] = ctypes.Structure

    def expert_shapes(self) -> dict[str, tuple[int, ...]]:
        """GGUF shapes (ne0 first) of the router and the expert tensors and biases."""
        E, F, n = self.n_embd, self.n_ff_exp, self.n_expert
        return {
            "ffn_gate_inp.weight": (E, n), "ffn_gate_inp.bias": (n,),
            "ffn_gate_exps.weight": (E, F, n), "ffn_up_exps.weight": (E, F, n),
            "ffn_down_exps.weight": (F, E, n), "ffn_gate_exps.bias": (F, n),
            "ffn_up_exps.bias": (F, n), "ffn_down_exps.bias": (E, n),
        }  # fmt: skip

    def _open(self, params: ctypes.Structure, slots: WeightSlots) -> None:
        self._handle = getattr(lib, self.PREFIX + "_new")(
            ctypes.byref(params), slots.ptrs, slots.types
        )
        self._slots = slots  # keeps the F32 vector copies alive
        if not self._handle:
            raise ModelLoadError(f"the native engine refused this {self.FAMILY} model's shape")

    @property
    def handle(self) -> int:
        if not self._handle:
            raise EngineError("model is closed")
        return self._handle

    def new_state(self, n_ctx: int) -> MoEState:
        return MoEState(self, n_ctx)

    def close(self) -> None:
        if self._handle:
            getattr(lib, self.PREFIX + "_free")(self._handle)
            self._handle = None


class MoEState:
    """One session's KV cache (C memory), position count and expert-read counter."""

    def __init__(self, model: MoEModel, n_ctx: int) -> None:
        self.model = model
        self.n_ctx = int(n_ctx)
        self._eval = getattr(lib, model.PREFIX + "_eval")
        self._handle = getattr(lib, model.PREFIX + "_session_new")(model.handle, self.n_ctx)
        if not self._handle:
            raise EngineError(f"cannot allocate a KV cache for {n_ctx} tokens")

    @property
    def handle(self) -> int:
        if not self._handle:
            raise EngineError("session is closed")
        return self._handle

    @property
    def n_past(self) -> int:
        return int(lib.ds4n_moe_session_n_past(self.handle))

    def set_n_past(self, n: int) -> None:
        if lib.ds4n_moe_session_set_n_past(self.handle, n) != 0:
            raise EngineError(f"cannot hold {n} tokens in a {self.n_ctx}-token session")

    @property
    def kv_bytes(self) -> int:
        return int(lib.ds4n_moe_session_kv_bytes(self.handle))

    @property
    def expert_bytes(self) -> int:
        """Bytes of expert weights this session's evals have read (router not counted)."""
        return int(lib.ds4n_moe_session_expert_bytes(self.handle))

    def eval(self, tokens: np.ndarray, logits: np.ndarray | None, all_logits: bool = False) -> None:
        """Appends tokens (int32, C-contiguous); fills logits (n_vocab, or n x n_vocab)."""
        m = self.model
        rc = self._eval(
            m.handle, self.handle, m.pool.handle,
            tokens.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), len(tokens),
            _fptr(logits), int(all_logits),
        )  # fmt: skip
        if rc != 0:
            raise EngineError(f"{m.family} eval failed: {ERRORS.get(rc, rc)}")

    def kv_payload_bytes(self, n: int) -> int:
        return n * self.model.kv_token_bytes

    def write_kv(self, fp: BinaryIO, n: int) -> None:
        """K then V of each layer for positions [0, n), as [n_head_kv][n][head_dim] f32."""
        m = self.model
        buf = np.empty(m.n_head_kv * n * m.head_dim, np.float32)
        for il in range(m.n_layer):
            for which in (0, 1):
                lib.ds4n_moe_session_kv_get(self.handle, il, which, n, _fptr(buf))
                fp.write(memoryview(buf).cast("B"))

    def read_kv(self, fp: BinaryIO, n: int) -> None:
        m = self.model
        buf = np.empty(m.n_head_kv * n * m.head_dim, np.float32)
        view = memoryview(buf).cast("B")
        for il in range(m.n_layer):
            for which in (0, 1):
                done = 0
                while done < len(view):
                    got = fp.readinto(view[done:])
                    if not got:
                        raise EngineError("session payload is truncated (KV rows)")
                    done += got
                lib.ds4n_moe_session_kv_set(self.handle, il, which, n, _fptr(buf))

    def close(self) -> None:
        if self._handle:
            lib.ds4n_moe_session_free(self._handle)
            self._handle = None

    def __del__(self) -> None:
        self.close()
