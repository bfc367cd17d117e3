"""ctypes binding of native/libds4n.so: quantized kernels, thread pool, matmul (native/ds4n.h).

`lib` is the loaded CDLL with every ds4n.h symbol declared; model families declare their own
symbols on it. numpy arrays are passed by pointer, never copied: arrays given to these
wrappers must be C-contiguous and of the stated dtype.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ds4d.engine.errors import EngineError

# GGML type ids, as in the GGUF tensor headers (and enum ds4n_type).
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ2_XXS, BF16 = 10, 11, 12, 13, 14, 16, 30
IQ4_NL, IQ4_XS, MXFP4 = 20, 23, 39
TYPES = {
    "F32": F32, "F16": F16, "BF16": BF16, "Q4_0": Q4_0, "Q4_1": Q4_1, "Q5_0": Q5_0,
    "Q5_1": Q5_1, "Q8_0": Q8_0, "Q2_K": Q2_K, "Q3_K": Q3_K, "Q4_K": Q4_K, "Q5_K": Q5_K,
    "Q6_K": Q6_K, "IQ2_XXS": IQ2_XXS, "IQ4_NL": IQ4_NL, "IQ4_XS": IQ4_XS, "MXFP4": MXFP4,
}  # fmt: skip
TYPES_BY_ID = {v: k for k, v in TYPES.items()}

SIMD_AUTO, SIMD_SCALAR, SIMD_AVX2, SIMD_NEON, SIMD_AVX512, SIMD_AMX = -1, 0, 1, 2, 3, 4
SIMD_NAMES = {SIMD_SCALAR: "scalar", SIMD_AVX2: "avx2", SIMD_NEON: "neon", SIMD_AVX512: "avx512",
              SIMD_AMX: "amx"}  # fmt: skip

LIB_NAME = "libds4n.so"

c_float_p = ctypes.POINTER(ctypes.c_float)
POOL_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_int)


class ProfileEntry(ctypes.Structure):
    """ds4n_profile_entry: one matmul shape's share of the profiled dispatches."""

    _fields_ = [
        ("type", ctypes.c_int32), ("prefill", ctypes.c_int32), ("rows", ctypes.c_int64),
        ("K", ctypes.c_int64), ("calls", ctypes.c_int64), ("wall_ns", ctypes.c_int64),
        ("busy_ns", ctypes.c_int64), ("parts", ctypes.c_int64), ("tokens", ctypes.c_int64),
    ]  # fmt: skip


class MacPeakInfo(ctypes.Structure):
    """ds4n_mac_peak_info: one core's multiply-add peak for a prefill kernel's instruction."""

    _fields_ = [
        ("instr", ctypes.c_char_p), ("products", ctypes.c_int32),
        ("lane_rate", ctypes.c_double), ("rate", ctypes.c_double),
    ]  # fmt: skip


PROFILE_TOTALS = ("dispatches", "wall_ns", "busy_ns", "other_wall_ns", "other_busy_ns",
                  "span_ns", "passes", "sync_ns", "join_ns", "joins", "absent")  # fmt: skip
_MAX_PROFILE_ENTRIES = 256


def checkout_native_dir() -> Path | None:
    """native/ of the source checkout ds4d is imported from (editable or PYTHONPATH), else
    None. A checkout uses the library `make native` builds, so a C change is picked up
    without reinstalling."""
    root = Path(__file__).resolve().parents[2]
    native = root / "native"
    if (root / "pyproject.toml").is_file() and (native / "Makefile").is_file():
        return native
    return None


def library_path() -> Path:
    """DS4D_NATIVE_LIB when set; in a source checkout native/build/libds4n.so; otherwise
    the library the wheel ships inside the package (ds4d/lib/libds4n.so)."""
    override = os.environ.get("DS4D_NATIVE_LIB")
    if override:
        return Path(override)
    native = checkout_native_dir()
    if native is not None:
        return native / "build" / LIB_NAME
    return Path(str(resources.files("ds4d").joinpath("lib").joinpath(LIB_NAME)))


def _missing_message(path: Path) -> str:
    if os.environ.get("DS4D_NATIVE_LIB"):
        return f"native library {path} (DS4D_NATIVE_LIB) not found"
    if checkout_native_dir() is not None:
        return f"native library {path} not built: run `make native`"
    return f"native library {path} is missing from the ds4d package: reinstall ds4d"


def _load() -> ctypes.CDLL:
    path = library_path()
    if not path.is_file():
        raise EngineError(_missing_message(path))
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise EngineError(f"native library {path} cannot be loaded: {exc}") from None
    i64, vp = ctypes.c_int64, ctypes.c_void_p
    signatures = {
        "ds4n_set_simd": (ctypes.c_int, [ctypes.c_int]),
        "ds4n_simd_level": (ctypes.c_int, []),
        "ds4n_type_supported": (ctypes.c_int, [ctypes.c_int]),
        "ds4n_type_block_size": (i64, [ctypes.c_int]),
        "ds4n_type_block_bytes": (i64, [ctypes.c_int]),
        "ds4n_dequantize": (None, [ctypes.c_int, vp, c_float_p, i64]),
        "ds4n_dot": (ctypes.c_float, [ctypes.c_int, vp, c_float_p, i64]),
        "ds4n_pool_new": (vp, [ctypes.c_int]),
        "ds4n_pool_free": (None, [vp]),
        "ds4n_pool_threads": (ctypes.c_int, [vp]),
        "ds4n_pool_run": (None, [vp, POOL_FN, vp]),
        "ds4n_pool_set_precision": (ctypes.c_int, [vp, ctypes.c_int]),
        "ds4n_int_type_supported": (ctypes.c_int, [ctypes.c_int]),
        "ds4n_matmul": (None, [vp, ctypes.c_int, vp, i64, i64, c_float_p, i64, c_float_p]),
        "ds4n_matmul_part": (
            None,
            [ctypes.c_int, vp, i64, i64, c_float_p, i64, c_float_p, ctypes.c_int, ctypes.c_int],
        ),
        "ds4n_read_bandwidth": (ctypes.c_double, [vp, i64, ctypes.c_int, ctypes.c_int]),
        "ds4n_mac_peak": (
            ctypes.c_int,
            [ctypes.c_int, ctypes.c_int, i64, ctypes.c_int, ctypes.POINTER(MacPeakInfo)],
        ),
        "ds4n_sample": (
            i64,
            [
                c_float_p,
                i64,
                ctypes.c_int32,
                ctypes.c_float,
                ctypes.c_float,
                ctypes.c_float,
                ctypes.c_double,
            ],
        ),  # fmt: skip
        "ds4n_profile_enable": (None, [ctypes.c_int]),
        "ds4n_profile_mark": (None, []),
        "ds4n_profile_read": (
            ctypes.c_int,
            [ctypes.POINTER(ProfileEntry), ctypes.c_int, ctypes.POINTER(i64)],
        ),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


lib = _load()


def physical_cores() -> int:
    """Physical cores this process may run on (SMT siblings counted once)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    cores = set()
    for cpu in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            core = (topo / "core_id").read_text().strip()
            package = (topo / "physical_package_id").read_text().strip()
        except OSError:
            core, package = str(cpu), "0"
        cores.add((package, core))
    return max(1, len(cores) or os.cpu_count() or 1)


# Matmul precisions: the int8 limbs each 32-value block of activations is split into (0: the
# exact float32 path; the K-quants hold limbs 0 and 1 in one int16 per value, under one scale
# per 256 values: native/quants_int.h). Types without an integer kernel run exact whatever the setting.
PRECISIONS = {"exact": 0, "int2": 2, "int3": 3}


def int_type_supported(qtype: int | str) -> bool:
    """True when the type has integer-activation kernels (int2/int3 change its matmuls)."""
    return bool(lib.ds4n_int_type_supported(type_id(qtype)))


class Pool:
    """A persistent native worker pool; the thread that runs a job takes part in it.

    One thread at a time may run jobs on a pool (ds4n_pool_run is not reentrant)."""

    _handle: int | None = None

    def __init__(self, n_threads: int | None = None) -> None:
        n = physical_cores() if n_threads is None else int(n_threads)
        if n < 1:
            raise ValueError(f"thread count must be at least 1, got {n}")
        self._handle = lib.ds4n_pool_new(n)
        if not self._handle:
            raise EngineError(f"cannot start a pool of {n} threads")

    @property
    def handle(self) -> int:
        """The ds4n_pool pointer, for native calls that take one."""
        if self._handle is None:
            raise ValueError("pool is closed")
        return self._handle

    @property
    def threads(self) -> int:
        return int(lib.ds4n_pool_threads(self.handle))

    def set_precision(self, precision: str) -> None:
        """The precision of this pool's matmuls: 'exact' (float32 activations), 'int2' or
        'int3' (activations split into that many int8 limbs; see PRECISIONS)."""
        if precision not in PRECISIONS:
            known = ", ".join(PRECISIONS)
            raise ValueError(f"unknown precision {precision!r} (known: {known})")
        lib.ds4n_pool_set_precision(self.handle, PRECISIONS[precision])

    def close(self) -> None:
        if self._handle is not None:
            lib.ds4n_pool_free(self._handle)
            self._handle = None

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


def set_simd(level: int | str) -> int:
    """Selects the kernel set (SIMD_* or 'scalar'/'avx2'/'avx512'/'amx'/'neon'/'auto'); returns the
    level in force."""
    if isinstance(level, str):
        names = {v: k for k, v in SIMD_NAMES.items()} | {"auto": SIMD_AUTO}
        if level not in names:
            raise ValueError(f"unknown SIMD level {level!r}: expected one of {sorted(names)}")
        level = names[level]
    return int(lib.ds4n_set_simd(level))


def simd_level() -> int:
    return int(lib.ds4n_simd_level())


def type_supported(qtype: int | str) -> bool:
    """True when the native kernels run the type (an id or a name)."""
    t = TYPES.get(qtype, -1) if isinstance(qtype, str) else int(qtype)
    return t >= 0 and bool(lib.ds4n_type_supported(t))


def type_id(qtype: int | str) -> int:
    """A GGML type id from an id, a name, or a gguf.GGMLQuantizationType."""
    t = TYPES[qtype] if isinstance(qtype, str) else int(qtype)
    if not lib.ds4n_type_supported(t):
        raise EngineError(f"quant type {qtype} is not supported by the native kernels")
    return t


def row_bytes(qtype: int | str, n: int) -> int:
    """Bytes of one row of n values."""
    t = type_id(qtype)
    bs = lib.ds4n_type_block_size(t)
    if n % bs:
        raise ValueError(f"row length {n} is not a multiple of the block size {bs}")
    return int(n // bs * lib.ds4n_type_block_bytes(t))


def _ptr(a: np.ndarray, dtype: npt.DTypeLike, writable: bool = False) -> int:
    if a.dtype != dtype or not a.flags.c_contiguous or (writable and not a.flags.writeable):
        raise ValueError(f"expected a C-contiguous {np.dtype(dtype).name} array")
    return int(a.ctypes.data)


def _fptr(a: np.ndarray, writable: bool = False) -> ctypes._Pointer[ctypes.c_float]:
    return ctypes.cast(_ptr(a, np.float32, writable), c_float_p)


def _raw(qtype: int | str, raw: np.ndarray, n: int) -> tuple[int, int]:
    t = type_id(qtype)
    need = row_bytes(t, n)
    if raw.nbytes < need:
        raise ValueError(f"{need} bytes needed for {n} values, {raw.nbytes} given")
    return t, _ptr(raw, raw.dtype)


def dequantize(qtype: int | str, raw: np.ndarray, n: int) -> np.ndarray:
    """The first n values of raw (bytes of qtype) as float32."""
    t, src = _raw(qtype, raw, n)
    out = np.empty(n, dtype=np.float32)
    lib.ds4n_dequantize(t, src, _fptr(out, True), n)
    return out


def dot(qtype: int | str, raw: np.ndarray, x: np.ndarray) -> float:
    """Σ w[i]·x[i] for the row w stored in raw (qtype) and float32 x."""
    n = x.shape[0]
    t, w = _raw(qtype, raw, n)
    return float(lib.ds4n_dot(t, w, _fptr(x), n))


def matmul(
    pool: Pool | None,
    qtype: int | str,
    W_raw: np.ndarray,
    rows: int,
    K: int,
    X: np.ndarray,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """X (T x K float32) times Wᵀ (W: rows x K of qtype) -> T x rows float32."""
    t, w = _raw(qtype, W_raw, 0)
    if W_raw.nbytes < rows * row_bytes(t, K):
        raise ValueError(f"W needs {rows * row_bytes(t, K)} bytes, {W_raw.nbytes} given")
    X2 = X.reshape(-1, K) if X.ndim == 1 else X
    if X2.ndim != 2 or X2.shape[1] != K:
        raise ValueError(f"X must be T x {K}, got {X.shape}")
    T = X2.shape[0]
    if out is None:
        out = np.empty((T, rows), dtype=np.float32)
    elif out.shape != (T, rows):
        raise ValueError(f"out must be {(T, rows)}, got {out.shape}")
    handle = pool.handle if pool is not None else None
    lib.ds4n_matmul(handle, t, w, rows, K, _fptr(X2), T, _fptr(out, True))
    return out


def sample(values: np.ndarray, top_k: int, top_p: float, min_p: float, temperature: float,
           u: float) -> int:  # fmt: skip
    """The position drawn from the candidates' float32 logits (ds4n_sample); u in [0, 1)."""
    n = values.shape[0]
    got = lib.ds4n_sample(_fptr(values), n, top_k, top_p, min_p, temperature, u)
    if got == -2:
        raise MemoryError(f"no memory for sampling over {n} candidates")
    if got < 0:
        raise ValueError(f"bad sampling arguments: top_k {top_k}, top_p {top_p}, "
                         f"min_p {min_p}, temperature {temperature}, u {u}")  # fmt: skip
    return int(got)


def read_bandwidth(pool: Pool, n_bytes: int = 256 << 20, reps: int = 5,
                   huge_pages: bool = True) -> float:  # fmt: skip
    """The read bandwidth of the pool's threads streaming a fresh n_bytes buffer, bytes/s
    (best of reps passes), on huge pages unless told otherwise."""
    bw = lib.ds4n_read_bandwidth(pool.handle, int(n_bytes), int(reps), int(huge_pages))
    if bw <= 0:
        raise EngineError(f"cannot measure bandwidth over {n_bytes} bytes (out of memory?)")
    return float(bw)


@dataclass(frozen=True)
class MacPeak:
    """The compute bound of one weight type's prefill at one precision (ds4n_mac_peak)."""

    instr: str  # the instruction timed; "" when the SIMD level has no probe for this path
    products: int  # its multiply-adds per weight multiply-add
    lane_rate: float  # the instruction's multiply-adds per second, one core
    per_core: float  # weight multiply-adds (rows x K x tokens) per second, one core
    threads: int

    @property
    def rate(self) -> float:
        """The per-core rate times the threads the engine runs: the bound of its matmuls."""
        return self.per_core * self.threads


def mac_peak(qtype: int | str, precision: str, threads: int = 1, iters: int = 1_000_000,
             reps: int = 3) -> MacPeak:  # fmt: skip
    """The multiply-add peak of the instruction the prefill kernel of qtype runs at precision
    on the SIMD level in force, measured on the calling thread (its CPU time: one core's rate,
    whatever else runs on the machine), scaled by threads. per_core 0 and instr "": the level
    has no probe for that path (no kernel of its own)."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r} (known: {', '.join(PRECISIONS)})")
    info = MacPeakInfo()
    got = lib.ds4n_mac_peak(type_id(qtype), PRECISIONS[precision], int(iters), int(reps),
                            ctypes.byref(info))  # fmt: skip
    if got != 0:
        raise ValueError(f"bad peak arguments: type {qtype}, iters {iters}, reps {reps}")
    instr = info.instr.decode() if info.instr else ""
    return MacPeak(instr, int(info.products), float(info.lane_rate), float(info.rate),
                   int(threads))  # fmt: skip


class Profile:
    """The native decode profile (ds4n.h): enable() clears and starts it, mark() closes a
    forward pass, read() returns (entries, totals) and disable() stops it."""

    @staticmethod
    def enable() -> None:
        lib.ds4n_profile_enable(1)

    @staticmethod
    def disable() -> None:
        lib.ds4n_profile_enable(0)

    @staticmethod
    def mark() -> None:
        lib.ds4n_profile_mark()

    @staticmethod
    def read() -> tuple[list[ProfileEntry], dict[str, int]]:
        entries = (ProfileEntry * _MAX_PROFILE_ENTRIES)()
        totals = (ctypes.c_int64 * len(PROFILE_TOTALS))()
        n = lib.ds4n_profile_read(entries, _MAX_PROFILE_ENTRIES, totals)
        return list(entries[: min(n, _MAX_PROFILE_ENTRIES)]), dict(
            zip(PROFILE_TOTALS, totals, strict=True)
        )
