"""What the attention-decoder families share on the Python side (the C side is
native/decoder.{h,c}): reading hyper-parameters, binding GGUF tensors to weight slots with
their shapes and types checked, and the session state (KV cache in C memory).

A family module reads its GGUF's shape (`DenseShape`) and its own hyper-parameters into its
`HParamsC` (which starts with the shared `ShapeC`, as every hparams struct of the C families
starts with native/decoder_model.h's ds4n_dec_shape), and `DecoderModel.open_native` binds
its tensors and builds the native model with `ds4n_<family>_new`. Everything after that is
the same for every family: `new_state(n_ctx, kv_type)` is a `DecoderState` over
`ds4n_dec_model_session_new` and `ds4n_dec_model_eval`. The KV cache holds K and V in the
session's KV type (`KV_TYPES`: float32, IEEE half, or GGUF's Q8_0 blocks of 32 along the
head dimension, which a head dimension not a multiple of 32 cannot use); resident memory
and the session payload both hold the stored type. `DecoderModel` is a
`ds4d.engine.family.BatchedModel` and `DecoderState` a `FamilyState`: engine.py drives them
through those Protocols, several states of one model at once through
`model.eval_batch(states, tokens, logits)` (`ds4n_dec_model_eval_batch`: one forward pass,
the weights read once for all of them).
"""

from __future__ import annotations

import ctypes
import io
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, BinaryIO

import numpy as np

from ds4d.engine import native
from ds4d.engine.errors import EngineError, ModelLoadError
from ds4d.engine.family import FamilyState
from ds4d.engine.gguf_file import GGUFFile, Tensor
from ds4d.engine.native import lib
from ds4d.engine.steering import NativeSteer, SteeringError

VECTOR_TYPES = {native.F32, native.F16, native.BF16}
# KV element types by name -> the C numbers (DS4N_KV_* in native/attention.h).
KV_TYPES = {"f32": 0, "f16": 1, "q8_0": 2}
ERRORS = {-1: "context is full", -2: "token id out of range", -3: "out of memory",
          -4: "expert id out of range", -5: "bad batch (sessions repeated, empty or too many)"}  # fmt: skip
# Sessions in one native batch call (DS4N_DEC_MAX_SEQ in native/decoder.h).
MAX_BATCH = 64


def _declare() -> None:
    vp, i64, i32, c_int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int
    for name, restype, argtypes in (
        ("ds4n_dec_model_free", None, [vp]),
        ("ds4n_dec_model_session_new", vp, [vp, i64, c_int]),
        ("ds4n_dec_model_eval", c_int, [vp, vp, vp, ctypes.POINTER(i32), i64, native.c_float_p,
                                        c_int]),
        ("ds4n_dec_model_eval_batch", c_int, [vp, vp, ctypes.POINTER(vp), ctypes.POINTER(i32),
                                              ctypes.POINTER(i64), c_int, native.c_float_p]),
        ("ds4n_dec_session_free", None, [vp]),
        ("ds4n_dec_session_n_past", i64, [vp]),
        ("ds4n_dec_session_n_ctx", i64, [vp]),
        ("ds4n_dec_session_kv_bytes", i64, [vp]),
        ("ds4n_dec_session_set_n_past", c_int, [vp, i64]),
        ("ds4n_dec_session_kv_type", c_int, [vp]),
        ("ds4n_dec_session_kv_get", c_int, [vp, c_int, c_int, i64, i64, vp]),
        ("ds4n_dec_session_kv_set", c_int, [vp, c_int, c_int, i64, i64, vp]),
        ("ds4n_kv_type_row_bytes", i64, [c_int, c_int]),
        ("ds4n_dec_model_embed", c_int, [vp, vp, ctypes.POINTER(vp), ctypes.POINTER(i32),
                                         ctypes.POINTER(i64), c_int, native.c_float_p]),
        ("ds4n_dec_model_bidirectional", c_int, [vp]),
        ("ds4n_dec_session_set_steer", c_int, [vp, vp]),
    ):  # fmt: skip
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes


_declare()


class ShapeC(ctypes.Structure):
    """struct ds4n_dec_shape (native/decoder_model.h): the first field of every family's
    hyper-parameters."""

    _fields_ = [
        *[(n, ctypes.c_int32) for n in ("n_vocab", "n_embd", "n_layer", "n_head", "n_head_kv",
                                        "head_dim", "n_ff", "n_rot")],
        ("rms_eps", ctypes.c_float),
        ("rope_base", ctypes.c_float),
    ]  # fmt: skip


class RopeScalingC(ctypes.Structure):
    """struct ds4n_dec_rope_scaling (native/decoder_model.h)."""

    _fields_ = [
        *[(n, ctypes.c_float) for n in ("freq_scale", "ext_factor", "attn_factor", "beta_fast",
                                        "beta_slow")],
        ("n_ctx_orig", ctypes.c_int32),
    ]  # fmt: skip


# The global weight slots every family's table starts with (DS4N_DEC_TOKEN_EMBD, _OUTPUT_NORM,
# _OUTPUT of native/decoder_model.h); a family's own globals follow.
SHARED_GLOBAL_SLOTS = ("token_embd.weight", "output_norm.weight", "output.weight")


def fptr(a: np.ndarray | None) -> ctypes._Pointer[ctypes.c_float] | None:
    if a is None:
        return None
    assert a.dtype == np.float32 and a.flags.c_contiguous
    return ctypes.cast(a.ctypes.data, native.c_float_p)


class HParams:
    """`{arch}.{key}` metadata of a GGUF: required unless a default is given, one value."""

    def __init__(self, gf: GGUFFile) -> None:
        self.gf = gf
        self.arch = gf.architecture

    def __call__(self, key: str, default: object = None) -> Any:
        full = f"{self.arch}.{key}"
        value = self.gf.require(full) if default is None else self.gf.get(full, default)
        if isinstance(value, (list, tuple)):  # e.g. per-layer head counts
            raise ModelLoadError(f"hyper-parameter {full} is a list; one value expected")
        return value

    def has(self, key: str) -> bool:
        return self.gf.get(f"{self.arch}.{key}", None) is not None


class Binder:
    """Fills the C weight-slot arrays: every name is checked for presence (unless
    optional), shape (numpy order reversed: GGUF ne0 first) and type; half-precision
    vectors are converted to float32 copies kept alive here."""

    def __init__(self, gf: GGUFFile, names: list[str]) -> None:
        self.gf = gf
        self.names = names
        self.ptrs = (ctypes.c_void_p * len(names))()
        self.types = (ctypes.c_int32 * len(names))()
        self.keep: list[np.ndarray] = []

    def bind_all(self, expected: Callable[[str], tuple[int, ...]], optional: Iterable[str]) -> None:
        """expected(short name) -> shape; short names drop the `blk.N.` prefix. A weight of
        two or more dimensions is a matrix (any type the kernels run); every other tensor
        (norms, biases, rope factors, sinks) a float vector."""
        optional = set(optional)
        for i, name in enumerate(self.names):
            short = name.split(".", 2)[2] if name.startswith("blk.") else name
            if short in optional and not self.gf.has_tensor(name):
                continue
            t = self.gf.tensor(name)
            shape = expected(short)
            if t.shape != shape:
                raise ModelLoadError(
                    f"tensor {name} has shape {list(t.shape)}, expected {list(shape)}"
                )
            matrix = short.endswith(".weight") and len(shape) >= 2
            self.ptrs[i], self.types[i] = self.bind(t, matrix=matrix)

    def bind(self, t: Tensor, matrix: bool) -> tuple[int, int]:
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
        self.keep.append(vec)
        return vec.ctypes.data, native.F32

    def vector(self, arr: np.ndarray) -> int:
        """A float32 vector computed here (e.g. a norm weight + 1), kept alive."""
        vec = np.ascontiguousarray(arr, dtype=np.float32)
        self.keep.append(vec)
        return vec.ctypes.data


class DecoderModel:
    """The parts of a family's model object that do not depend on the family: the shape,
    the native model's handle and everything done through it."""

    family = ""
    prefix = ""  # the family's native constructor is ds4n_<prefix>_new
    n_vocab = n_ctx_train = n_embd = n_layer = n_head_kv = head_dim = 0
    max_batch = MAX_BATCH
    pool: native.Pool
    _handle: int | None = None

    def __init__(self, gf: GGUFFile, pool: native.Pool, shape: DenseShape) -> None:
        self.gf, self.pool, self.shape = gf, pool, shape
        self.n_vocab, self.n_ctx_train, self.n_embd = shape.n_vocab, shape.n_ctx_train, shape.n_embd
        self.n_layer, self.n_head_kv, self.head_dim = shape.n_layer, shape.n_head_kv, shape.head_dim

    def open_native(self, layer_slots: Sequence[str], expected: Mapping[str, tuple[int, ...]],
                    optional: Iterable[str], params: ctypes.Structure,
                    global_slots: Sequence[str] = ()) -> None:  # fmt: skip
        """Binds the tensors of the family's slots (SHARED_GLOBAL_SLOTS, then global_slots,
        then each layer's layer_slots: the order of its C header) with their expected
        shapes, and builds the native model from them and params."""
        names = layer_names((*SHARED_GLOBAL_SLOTS, *global_slots), layer_slots, self.n_layer)
        self._binder = Binder(self.gf, names)
        self._binder.bind_all(expected.__getitem__, optional)
        new = getattr(lib, f"ds4n_{self.prefix}_new")
        new.restype = ctypes.c_void_p
        new.argtypes = [ctypes.POINTER(type(params)), ctypes.POINTER(ctypes.c_void_p),
                        ctypes.POINTER(ctypes.c_int32)]  # fmt: skip
        self._handle = new(ctypes.byref(params), self._binder.ptrs, self._binder.types)
        if not self._handle:
            raise ModelLoadError(f"the native engine refused this {self.family} model's shape")

    @property
    def handle(self) -> int:
        if not self._handle:
            raise EngineError("model is closed")
        return self._handle

    def kv_row_bytes(self, kv_type: str) -> int:
        """Bytes of one position of one kv head in kv_type; EngineError for an unknown type
        or one this model's head dimension cannot use."""
        if kv_type not in KV_TYPES:
            raise EngineError(f"unknown KV type {kv_type!r} (known: {', '.join(KV_TYPES)})")
        row = int(lib.ds4n_kv_type_row_bytes(KV_TYPES[kv_type], self.head_dim))
        if row <= 0:
            raise EngineError(f"KV type {kv_type} needs a head dimension that is a multiple of"
                              f" 32; this model's is {self.head_dim} (use f16)")  # fmt: skip
        return row

    def kv_token_bytes(self, kv_type: str = "f32") -> int:
        """Per token: K and V of every layer, n_head_kv rows of head_dim each in kv_type."""
        return 2 * self.n_layer * self.n_head_kv * self.kv_row_bytes(kv_type)

    def new_state(self, n_ctx: int, kv_type: str = "f32") -> DecoderState:
        """A session of n_ctx positions. The model-level default is the exact float32 KV
        (the reference the tests compare against); Engine.open chooses the serving type."""
        return DecoderState(self, n_ctx, kv_type)

    def eval_batch(self, states: Sequence[FamilyState], tokens: Sequence[np.ndarray],
                   logits: np.ndarray | None) -> None:  # fmt: skip
        """One forward pass appending tokens[i] (int32, at least one) to states[i] (at most
        MAX_BATCH distinct states of this model); logits (len(states) x n_vocab float32, or
        None) receives each state's logits after its last token, bitwise those of
        `state.eval` alone. EngineError, with no state changed, on a bad call."""
        n = len(states)
        if n != len(tokens) or not 1 <= n <= MAX_BATCH:
            raise EngineError(f"eval_batch: {n} states for {len(tokens)} token lists"
                              f" (1..{MAX_BATCH})")  # fmt: skip
        mine = [s for s in states if isinstance(s, DecoderState) and s.model is self]
        if len(mine) != n:
            raise EngineError("eval_batch: a state of another model")
        if logits is not None and logits.shape != (n, self.n_vocab):
            raise EngineError(f"eval_batch: logits of shape {logits.shape}")
        handles = (ctypes.c_void_p * n)(*[s.handle for s in mine])
        counts = (ctypes.c_int64 * n)(*[len(t) for t in tokens])
        flat = np.ascontiguousarray(np.concatenate(tokens), dtype=np.int32)
        rc = lib.ds4n_dec_model_eval_batch(
            self.handle, self.pool.handle, handles,
            flat.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), counts, n, fptr(logits),
        )  # fmt: skip
        if rc != 0:
            raise EngineError(f"{self.family} eval_batch failed: {ERRORS.get(rc, rc)}")

    @property
    def bidirectional(self) -> bool:
        """Whether the native model's attention is not causal (an encoder)."""
        return bool(lib.ds4n_dec_model_bidirectional(self.handle))

    def project_pooled(self, pooled: np.ndarray) -> np.ndarray:
        """No projection after the pooling (a family that has one overrides this)."""
        return pooled

    def embed_batch(self, states: Sequence[FamilyState], tokens: Sequence[np.ndarray],
                    hidden: np.ndarray) -> None:  # fmt: skip
        """One forward pass appending tokens[i] (int32, at least one) to states[i]; hidden
        (sum of the counts x n_embd float32) receives every new row's final hidden state
        (after the output norm), bitwise what each state's rows are alone."""
        n = len(states)
        if n != len(tokens) or not 1 <= n <= MAX_BATCH:
            raise EngineError(f"embed_batch: {n} states for {len(tokens)} token lists"
                              f" (1..{MAX_BATCH})")  # fmt: skip
        mine = [s for s in states if isinstance(s, DecoderState) and s.model is self]
        if len(mine) != n:
            raise EngineError("embed_batch: a state of another model")
        rows = sum(len(t) for t in tokens)
        if hidden.shape != (rows, self.n_embd) or hidden.dtype != np.float32:
            raise EngineError(f"embed_batch: hidden of shape {hidden.shape}")
        handles = (ctypes.c_void_p * n)(*[s.handle for s in mine])
        counts = (ctypes.c_int64 * n)(*[len(t) for t in tokens])
        flat = np.ascontiguousarray(np.concatenate(tokens), dtype=np.int32)
        rc = lib.ds4n_dec_model_embed(
            self.handle, self.pool.handle, handles,
            flat.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), counts, n, fptr(hidden),
        )  # fmt: skip
        if rc != 0:
            raise EngineError(f"{self.family} embedding failed: {ERRORS.get(rc, rc)}")

    def close(self) -> None:
        if self._handle:
            lib.ds4n_dec_model_free(self._handle)
            self._handle = None


class DecoderState:
    """One session's KV cache (C memory) and position count."""

    def __init__(self, model: DecoderModel, n_ctx: int, kv_type: str = "f32") -> None:
        self.model = model
        self.n_ctx = int(n_ctx)
        self.kv_type = kv_type
        self._row_bytes = model.kv_row_bytes(kv_type)
        self._handle: int | None = lib.ds4n_dec_model_session_new(
            model.handle, self.n_ctx, KV_TYPES[kv_type]
        )
        if not self._handle:
            raise EngineError(f"cannot allocate a KV cache for {n_ctx} tokens")
        self._steer: NativeSteer | None = None  # kept alive while the C session reads it

    @property
    def handle(self) -> int:
        if not self._handle:
            raise EngineError("session is closed")
        return self._handle

    def set_steer(self, steer: NativeSteer | None) -> None:
        """Steers this session's next evaluations (None: none); see steering.py."""
        if lib.ds4n_dec_session_set_steer(self.handle, steer.handle if steer else None):
            raise SteeringError("steering directions do not fit this model's layers and width")
        self._steer = steer

    @property
    def n_past(self) -> int:
        return int(lib.ds4n_dec_session_n_past(self.handle))

    def rewind(self, n: int) -> None:
        """Keep the first n positions: the KV rows after them are dropped (no evaluation)."""
        if not 0 <= n <= self.n_past:
            raise EngineError(f"cannot hold {n} tokens: the state has {self.n_past}")
        self._set_n_past(n)

    def _set_n_past(self, n: int) -> None:
        if lib.ds4n_dec_session_set_n_past(self.handle, n) != 0:
            raise EngineError(f"cannot hold {n} tokens in a {self.n_ctx}-token session")

    @property
    def kv_bytes(self) -> int:
        return int(lib.ds4n_dec_session_kv_bytes(self.handle))

    def eval(self, tokens: np.ndarray, logits: np.ndarray | None, all_logits: bool = False) -> None:
        """Appends tokens (int32, C-contiguous); fills logits (n_vocab, or n x n_vocab)."""
        rc = lib.ds4n_dec_model_eval(
            self.model.handle, self.handle, self.model.pool.handle,
            tokens.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), len(tokens),
            fptr(logits), int(all_logits),
        )  # fmt: skip
        if rc != 0:
            raise EngineError(f"{self.model.family} eval failed: {ERRORS.get(rc, rc)}")

    @property
    def kv_token_bytes(self) -> int:
        return 2 * self.model.n_layer * self.model.n_head_kv * self._row_bytes

    # Every position's KV row is independent of the others, so a payload can hold any
    # range of rows: a delta checkpoint carries only the rows after its base.
    supports_ranges = True

    def kv_payload_bytes(self, n: int, start: int = 0) -> int:
        return (n - start) * self.kv_token_bytes

    def kv_rows(self, n: int, start: int = 0) -> list[np.ndarray]:
        """Copies of K then V of each layer for positions [start, n), each
        [n_head_kv][n - start] rows of the stored type as bytes: the payload's KV part, in
        order."""
        out = []
        for il in range(self.model.n_layer):
            for which in (0, 1):
                buf = self._buffer(n - start)
                self._rows(lib.ds4n_dec_session_kv_get, il, which, start, n, buf)
                out.append(buf)
        return out

    def write_kv(self, fp: BinaryIO, n: int, start: int = 0) -> None:
        """K then V of each layer for positions [start, n), as [n_head_kv][n - start] rows of
        the stored type (f32 or f16 values, or q8_0 blocks), copied without conversion."""
        buf = self._buffer(n - start)
        for il in range(self.model.n_layer):
            for which in (0, 1):
                self._rows(lib.ds4n_dec_session_kv_get, il, which, start, n, buf)
                fp.write(memoryview(buf.data))

    def read_kv(self, fp: BinaryIO, n: int, start: int = 0) -> None:
        """Reads what write_kv(fp, n, start) wrote into rows [start, n), then holds n
        positions; on an error (a truncated payload) it still holds `start`."""
        if start != self.n_past:
            raise EngineError(f"KV rows from {start} do not extend a state of {self.n_past}")
        buf = self._buffer(n - start)
        view = memoryview(buf.data)
        for il in range(self.model.n_layer):
            for which in (0, 1):
                _read_exact(fp, view)
                self._rows(lib.ds4n_dec_session_kv_set, il, which, start, n, buf)
        self._set_n_past(n)

    def _buffer(self, rows: int) -> np.ndarray:
        return np.empty(self.model.n_head_kv * max(rows, 0) * self._row_bytes, np.uint8)

    def _rows(
        self, fn: Callable[..., int], il: int, which: int, start: int, n: int, buf: np.ndarray
    ) -> None:
        if fn(self.handle, il, which, start, n - start, buf.ctypes.data) != 0:
            raise EngineError(f"KV rows [{start}, {n}) are outside a {self.n_ctx}-token session")

    def close(self) -> None:
        if self._handle:
            lib.ds4n_dec_session_free(self._handle)
            self._handle = None

    def __del__(self) -> None:
        self.close()


def _read_exact(fp: BinaryIO, view: memoryview) -> None:
    done = 0
    while done < len(view):
        if isinstance(fp, io.BufferedIOBase | io.RawIOBase):  # straight into the buffer
            got = fp.readinto(view[done:]) or 0
        else:
            data = fp.read(len(view) - done)
            got = len(data)
            view[done : done + got] = data
        if not got:
            raise EngineError("session payload is truncated (KV rows)")
        done += got


def layer_names(global_slots: Iterable[str], layer_slots: Iterable[str], n_layer: int) -> list[str]:
    """The slot order of a family's C header: globals, then each layer's slots."""
    layer_slots = list(layer_slots)
    return list(global_slots) + [f"blk.{il}.{s}" for il in range(n_layer) for s in layer_slots]


class RopeScaling:
    """The file's RoPE scaling as llama.cpp reads it: linear (freq_scale = 1/factor), or
    YaRN (ext_factor 1, the correction range, and the magnitude factor), times the file's
    `rope.scaling.attn_factor`."""

    def __init__(self, hp: HParams, n_ctx_train: int, allowed: Iterable[str]) -> None:
        factor = float(hp("rope.scaling.factor", 0.0))
        # A factor without a type is linear scaling, as llama.cpp reads it.
        kind = str(hp("rope.scaling.type", "linear" if factor > 0 else "none"))
        allowed = tuple(allowed)
        if kind not in allowed:
            raise ModelLoadError(
                f"rope scaling type {kind!r} is not supported ({', '.join(allowed)})"
            )
        self.kind = kind
        self.freq_scale = 1.0 / factor if kind in ("linear", "yarn") and factor > 0 else 1.0
        self.attn_factor = float(hp("rope.scaling.attn_factor", 1.0))
        self.ext_factor = 0.0
        self.beta_fast = float(hp("rope.scaling.yarn_beta_fast", 32.0))
        self.beta_slow = float(hp("rope.scaling.yarn_beta_slow", 1.0))
        self.n_ctx_orig = int(hp("rope.scaling.original_context_length", n_ctx_train))
        if kind == "yarn" and factor > 1.0:
            self.ext_factor = float(hp("rope.scaling.yarn_ext_factor", 1.0))
            log_mul = float(hp("rope.scaling.yarn_log_multiplier", 0.0))
            if log_mul:
                # llama.cpp's overall magnitude is then (1 + 0.1 ln f) / (1 + 0.1 log_mul ln f),
                # and the native rope already multiplies by the numerator.
                self.attn_factor /= 0.1 * log_mul * float(np.log(factor)) + 1.0
        if self.ext_factor and (self.n_ctx_orig <= 0 or self.beta_fast <= 0 or self.beta_slow <= 0):
            raise ModelLoadError("YaRN rope scaling needs a positive original context and betas")

    def c_scaling(self) -> RopeScalingC:
        """The ds4n_dec_rope_scaling of a family's hyper-parameters."""
        return RopeScalingC(
            freq_scale=self.freq_scale, ext_factor=self.ext_factor, attn_factor=self.attn_factor,
            beta_fast=self.beta_fast, beta_slow=self.beta_slow, n_ctx_orig=self.n_ctx_orig,
        )  # fmt: skip


class DenseShape:
    """The hyper-parameters every attention decoder declares, read and checked once:
    layers, widths, heads (GQA), head and rope dims, rope base, norm epsilon, context,
    vocabulary (from the embedding when the file does not say). A mixture-of-experts
    family (`experts=True`) has no dense FFN width; its expert keys are its own."""

    def __init__(
        self, gf: GGUFFile, family: str, *, rope_even_head: bool = True, experts: bool = False
    ) -> None:
        hp = self.hp = HParams(gf)
        self.n_layer = int(hp("block_count"))
        self.n_embd = int(hp("embedding_length"))
        self.n_ff = 0 if experts else int(hp("feed_forward_length"))  # experts: no dense FFN
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
        if not experts and (
            gf.has_tensor("blk.0.ffn_gate_inp.weight") or int(hp("expert_count", 0))
        ):
            raise ModelLoadError(f"mixture-of-experts {family} models are not supported")
        if (
            min(self.n_layer, self.n_embd, self.n_head, self.n_head_kv, self.n_vocab) <= 0
            or (not experts and self.n_ff <= 0)
            or self.n_head % self.n_head_kv
            or value_len != self.head_dim
            or (rope_even_head and self.head_dim % 2)
            or not 0 < self.n_rot <= self.head_dim
            or self.n_rot % 2
            or self.rope_base <= 0
        ):  # fmt: skip
            raise ModelLoadError(
                f"unsupported {family} shape: {self.n_head} heads / {self.n_head_kv} kv heads,"
                f" head dim {self.head_dim} (value {value_len}), rope dims {self.n_rot}"
            )

    @property
    def n_q(self) -> int:
        return self.n_head * self.head_dim

    @property
    def n_kv(self) -> int:
        return self.n_head_kv * self.head_dim

    def c_shape(self) -> ShapeC:
        """The ds4n_dec_shape of a family's hyper-parameters."""
        return ShapeC(
            n_vocab=self.n_vocab, n_embd=self.n_embd, n_layer=self.n_layer, n_head=self.n_head,
            n_head_kv=self.n_head_kv, head_dim=self.head_dim, n_ff=self.n_ff, n_rot=self.n_rot,
            rms_eps=self.rms_eps, rope_base=self.rope_base,
        )  # fmt: skip

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """GGUF shapes (ne0 first) of the standard tensors of an attention decoder, by short
        name; a family reads those of its slots, and adds or replaces its own."""
        E, F, V, n_q, n_kv, hd = (self.n_embd, self.n_ff, self.n_vocab, self.n_q, self.n_kv,
                                  self.head_dim)  # fmt: skip
        half = self.n_rot // 2
        return {
            "token_embd.weight": (E, V), "output_norm.weight": (E,), "output.weight": (E, V),
            "attn_norm.weight": (E,), "attn_q.weight": (E, n_q), "attn_k.weight": (E, n_kv),
            "attn_v.weight": (E, n_kv), "attn_qkv.weight": (E, n_q + 2 * n_kv),
            "attn_output.weight": (n_q, E), "attn_q.bias": (n_q,), "attn_k.bias": (n_kv,),
            "attn_v.bias": (n_kv,), "attn_output.bias": (E,), "attn_q_norm.weight": (hd,),
            "attn_k_norm.weight": (hd,), "attn_sinks.weight": (self.n_head,),
            "post_attention_norm.weight": (E,), "ffn_norm.weight": (E,),
            "ffn_gate.weight": (E, F), "ffn_up.weight": (E, F), "ffn_down.weight": (F, E),
            "post_ffw_norm.weight": (E,), "rope_freqs.weight": (half,),
            "rope_factors_long.weight": (half,), "rope_factors_short.weight": (half,),
        }  # fmt: skip
