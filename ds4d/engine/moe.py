"""ctypes face of native/moe.{c,h}: the mixture-of-experts FFN the MoE families share.

`MoEParams` mirrors struct ds4n_moe (sizes, gating, activation, weight addresses and types);
the MoE families fill one per layer from the GGUF and hand them to their native model.
`route` and `Scratch.forward` run the piece on its own (tests, measurements).
"""

from __future__ import annotations

import ctypes

import numpy as np

from ds4d.engine import native
from ds4d.engine.errors import EngineError
from ds4d.engine.native import lib

# Gating functions, numbered as GGUF's `expert_gating_func`.
SOFTMAX, SIGMOID, SOFTMAX_WEIGHT = 1, 2, 3
# Expert activations.
SWIGLU, SWIGLU_OAI = 0, 1

ERRORS = {-1: "out of memory", -2: "expert id out of range"}


class MoEParams(ctypes.Structure):
    _fields_ = [
        *[(n, ctypes.c_int32) for n in ("n_expert", "n_used", "n_embd", "n_ff", "gating",
                                        "activation", "norm_weights")],
        ("weights_scale", ctypes.c_float),
        ("oai_alpha", ctypes.c_float),
        ("oai_limit", ctypes.c_float),
        ("router", ctypes.c_void_p),
        ("router_type", ctypes.c_int32),
        ("router_bias", ctypes.c_void_p),
        ("gate", ctypes.c_void_p),
        ("up", ctypes.c_void_p),
        ("down", ctypes.c_void_p),
        ("gate_type", ctypes.c_int32),
        ("up_type", ctypes.c_int32),
        ("down_type", ctypes.c_int32),
        ("gate_bias", ctypes.c_void_p),
        ("up_bias", ctypes.c_void_p),
        ("down_bias", ctypes.c_void_p),
    ]  # fmt: skip


def _declare() -> None:
    vp, i64, fp = ctypes.c_void_p, ctypes.c_int64, native.c_float_p
    params_p, i32_p = ctypes.POINTER(MoEParams), ctypes.POINTER(ctypes.c_int32)
    for name, restype, argtypes in (
        ("ds4n_moe_valid", ctypes.c_int, [params_p]),
        ("ds4n_moe_route", ctypes.c_int, [params_p, fp, i64, i32_p, fp]),
        ("ds4n_moe_scratch_new", vp, []),
        ("ds4n_moe_scratch_free", None, [vp]),
        ("ds4n_moe_expert_bytes", i64, [vp]),
        ("ds4n_moe_forward", ctypes.c_int, [vp, params_p, vp, fp, i64, fp]),
    ):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes


_declare()


def valid(params: MoEParams) -> bool:
    return bool(lib.ds4n_moe_valid(ctypes.byref(params)))


def _f32(a: np.ndarray, writable: bool = False) -> ctypes._Pointer[ctypes.c_float]:
    return native._fptr(a, writable)


def route(params: MoEParams, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Expert ids (T x n_used, best first) and weights for T rows of router logits."""
    T = logits.shape[0]
    if logits.shape != (T, params.n_expert):
        raise ValueError(f"logits must be T x {params.n_expert}, got {logits.shape}")
    ids = np.empty((T, params.n_used), np.int32)
    weights = np.empty((T, params.n_used), np.float32)
    rc = lib.ds4n_moe_route(ctypes.byref(params), _f32(logits), T,
                            ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
                            _f32(weights, True))  # fmt: skip
    if rc != 0:
        raise EngineError(f"MoE routing failed: {ERRORS.get(rc, rc)}")
    return ids, weights


class Scratch:
    """Working memory of MoE calls and their count of expert bytes read."""

    def __init__(self) -> None:
        self._handle = lib.ds4n_moe_scratch_new()
        if not self._handle:
            raise EngineError("cannot allocate MoE scratch")

    @property
    def expert_bytes(self) -> int:
        return int(lib.ds4n_moe_expert_bytes(self._handle))

    def forward(self, pool: native.Pool | None, params: MoEParams, x: np.ndarray) -> np.ndarray:
        """The MoE FFN of x (T x n_embd float32), without the residual."""
        if not valid(params):
            raise EngineError("the native MoE piece refuses these parameters")
        if x.ndim != 2 or x.shape[1] != params.n_embd:
            raise ValueError(f"x must be T x {params.n_embd}, got {x.shape}")
        out = np.empty_like(x, dtype=np.float32)
        handle = pool.handle if pool is not None else None
        rc = lib.ds4n_moe_forward(handle, ctypes.byref(params), self._handle, _f32(x), len(x),
                                  _f32(out, True))  # fmt: skip
        if rc != 0:
            raise EngineError(f"MoE forward failed: {ERRORS.get(rc, rc)}")
        return out

    def close(self) -> None:
        if self._handle:
            lib.ds4n_moe_scratch_free(self._handle)
            self._handle = None

    def __del__(self) -> None:
        self.close()
