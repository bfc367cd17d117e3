"""Directional steering (activation addition), in llama.cpp's control-vector format.

A `Steering` is one direction per layer (n_layer x n_embd float32; a zero row leaves that
layer alone) and two scales: the C forward pass of every family (native/steer.h) adds
`ffn_scale * dirs[il]` to layer il's output after its FFN (llama.cpp's control vectors:
the residual stream after the layer) and `attn_scale * dirs[il]` after its attention
output (antirez/ds4's separate attention scale). A scale of 0 is bit-identical to no
steering.

Files are llama.cpp's control-vector GGUF: architecture `controlvector`, one float32 1-D
tensor `direction.N` per layer N >= 1 (layer N's output; there is never one for layer 0),
so vectors written by llama.cpp's cvector-generator load here and ours load there.
Loading follows llama.cpp: each file's directions times its scale, summed over files,
then kept only for layers in [layer_start, layer_end] (inclusive; default 1..n_layer).

`Steering.key` names the effect for the prefix caches: a KV computed under one steering is
never reused under another (state/ puts it beside the model fingerprint).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ds4d.engine.errors import EngineError
from ds4d.engine.native import c_float_p, lib

ARCH = "controlvector"
_vp = ctypes.c_void_p
for _name, _res, _args in (
    ("ds4n_steer_new", _vp, [ctypes.c_int32, ctypes.c_int32, c_float_p, ctypes.c_float,
                             ctypes.c_float, ctypes.c_int]),
    ("ds4n_steer_free", None, [_vp]),
    ("ds4n_steer_captured", ctypes.c_int, [_vp, c_float_p]),
):  # fmt: skip
    _fn = getattr(lib, _name)
    _fn.restype, _fn.argtypes = _res, _args


class SteeringError(EngineError):
    """A control-vector file or steering request the engine cannot use."""


class NativeSteer:
    """A ds4n_steer object (C memory) the sessions attached to it read during evals."""

    def __init__(self, dirs: np.ndarray, attn_scale: float, ffn_scale: float,
                 capture: bool = False) -> None:  # fmt: skip
        d = np.ascontiguousarray(dirs, np.float32)
        n_layer, n_embd = d.shape
        self.n_layer, self.n_embd = n_layer, n_embd
        handle = lib.ds4n_steer_new(
            n_layer, n_embd, d.ctypes.data_as(c_float_p), attn_scale, ffn_scale, int(capture)
        )
        if not handle:
            raise SteeringError("steering rejected: a non-finite value or a bad shape")
        self._handle: int | None = handle

    @property
    def handle(self) -> int:
        if not self._handle:
            raise EngineError("steering object is closed")
        return self._handle

    def captured(self) -> np.ndarray:
        """The last row each layer's FFN step saw (n_layer x n_embd): the residual stream
        after that layer for the attention decoders, the FFN output for DeepSeek V4."""
        out = np.empty((self.n_layer, self.n_embd), np.float32)
        if lib.ds4n_steer_captured(self.handle, out.ctypes.data_as(c_float_p)) != 0:
            raise EngineError("this steering object does not capture")
        return out

    def close(self) -> None:
        if self._handle:
            lib.ds4n_steer_free(self._handle)
            self._handle = None

    def __del__(self) -> None:
        self.close()


@dataclass(frozen=True, eq=False)
class Steering:
    """Per-layer directions and the two scales (see the module docstring)."""

    dirs: np.ndarray  # n_layer x n_embd float32, read-only
    attn_scale: float = 0.0
    ffn_scale: float = 1.0
    source: str = ""  # what it was made from, for humans
    _native: list[NativeSteer] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        d = np.array(self.dirs, np.float32, copy=True)
        if d.ndim != 2 or not d.size:
            raise SteeringError(f"steering directions must be n_layer x n_embd, got {d.shape}")
        if not np.isfinite(d).all():
            raise SteeringError("steering directions hold a non-finite value")
        for name in ("attn_scale", "ffn_scale"):
            v = float(getattr(self, name))
            if not np.isfinite(v):
                raise SteeringError(f"{name} must be finite, got {v}")
            object.__setattr__(self, name, v)
        d.flags.writeable = False
        object.__setattr__(self, "dirs", d)

    @property
    def n_layer(self) -> int:
        return int(self.dirs.shape[0])

    @property
    def n_embd(self) -> int:
        return int(self.dirs.shape[1])

    @property
    def active(self) -> bool:
        """Whether it changes anything: a nonzero direction with a nonzero scale."""
        return bool((self.attn_scale or self.ffn_scale) and self.dirs.any())

    @property
    def key(self) -> str:
        """A digest of the effect ('' when inactive, like no steering at all)."""
        if not self.active:
            return ""
        h = hashlib.sha256()
        h.update(np.array([self.attn_scale, self.ffn_scale], np.float32).tobytes())
        h.update(np.array(self.dirs.shape, np.int64).tobytes())
        h.update(self.dirs.tobytes())
        return h.hexdigest()[:16]

    def with_scales(self, attn_scale: float | None = None,
                    ffn_scale: float | None = None) -> Steering:  # fmt: skip
        return Steering(
            self.dirs,
            self.attn_scale if attn_scale is None else attn_scale,
            self.ffn_scale if ffn_scale is None else ffn_scale,
            self.source,
        )

    def native(self) -> NativeSteer:
        """The C object sessions attach (made once, freed with this object)."""
        with self._lock:
            if not self._native:
                self._native.append(NativeSteer(self.dirs, self.attn_scale, self.ffn_scale))
            return self._native[0]

    def describe(self) -> dict[str, object]:
        nz = [i for i in range(self.n_layer) if self.dirs[i].any()]
        return {
            "source": self.source, "attn_scale": self.attn_scale, "ffn_scale": self.ffn_scale,
            "layers": f"{nz[0]}:{nz[-1]}" if nz else "", "key": self.key,
        }  # fmt: skip


# ---- llama.cpp control-vector files -----------------------------------------------------


def read_control_vector(path: str | os.PathLike[str]) -> dict[int, np.ndarray]:
    """The directions of one file by layer, checked as llama.cpp checks them: every tensor
    is `direction.N` with N >= 1, float32, one-dimensional, all of one width."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
    except (OSError, ValueError) as e:
        raise SteeringError(f"cannot read control vector {path}: {e}") from None
    out: dict[int, np.ndarray] = {}
    width = -1
    for t in reader.tensors:
        prefix, _, index = t.name.partition(".")
        if prefix != "direction" or not index.isdigit():
            raise SteeringError(f"{path}: tensor {t.name!r} is not direction.N")
        layer = int(index)
        if layer == 0:
            raise SteeringError(f"{path}: direction.0 (there is never a direction for layer 0)")
        if int(t.tensor_type) != 0 or len(t.shape) != 1:
            raise SteeringError(f"{path}: {t.name} must be a 1-D float32 tensor")
        n = int(t.shape[0])
        if width not in (-1, n):
            raise SteeringError(f"{path}: {t.name} has {n} values, the others {width}")
        width = n
        out[layer] = out.get(layer, np.zeros(n, np.float32)) + np.asarray(t.data, np.float32)
    if not out:
        raise SteeringError(f"{path}: no direction tensors")
    return out


def load_control_vectors(files: Sequence[tuple[str | os.PathLike[str], float]], n_layer: int,
                         n_embd: int, layer_range: tuple[int, int] | None = None,
                         attn_scale: float = 0.0, ffn_scale: float = 1.0) -> Steering:  # fmt: skip
    """llama.cpp's --control-vector / --control-vector-scaled FILE SCALE /
    --control-vector-layer-range A B, for a model of n_layer x n_embd."""
    if not files:
        raise SteeringError("no control vector files")
    dirs = np.zeros((n_layer, n_embd), np.float32)
    for path, scale in files:
        for layer, vec in read_control_vector(path).items():
            if len(vec) != n_embd:
                raise SteeringError(
                    f"{path}: directions of {len(vec)} values, the model's width is {n_embd}"
                )
            if layer < n_layer:
                dirs[layer] += np.float32(scale) * vec
    start, end = layer_range if layer_range else (1, n_layer)
    if start > end:
        raise SteeringError(f"layer range {start}..{end} is empty")
    keep = np.zeros(n_layer, bool)
    keep[max(start, 0) : max(end + 1, 0)] = True
    dirs[~keep] = 0.0
    names = ", ".join(f"{Path(p).name}×{s:g}" for p, s in files)
    return Steering(dirs, attn_scale, ffn_scale, source=names)


def parse_scaled(spec: str) -> tuple[str, float]:
    """ "FILE" (scale 1) or "FILE:SCALE" (llama.cpp's --control-vector-scaled form)."""
    path, sep, scale = spec.rpartition(":")
    if sep and path:
        try:
            return path, float(scale)
        except ValueError:
            pass
    return spec, 1.0


def parse_layer_range(spec: str) -> tuple[int, int] | None:
    """ "START:END" (or "START END") -> (START, END); "" -> None (every layer)."""
    if not spec.strip():
        return None
    parts = spec.replace(":", " ").replace(",", " ").split()
    try:
        start, end = (int(p) for p in parts)
    except ValueError:
        raise SteeringError(f"layer range must be START:END, got {spec!r}") from None
    return start, end


def write_control_vector(path: str | os.PathLike[str], dirs: dict[int, np.ndarray],
                         model_hint: str) -> None:  # fmt: skip
    """Writes llama.cpp's format: `direction.N` for each layer N given (N >= 1)."""
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), ARCH)
    writer.add_string(f"{ARCH}.model_hint", model_hint)
    writer.add_int32(f"{ARCH}.layer_count", len(dirs))
    for layer in sorted(dirs):
        if layer < 1:
            raise SteeringError("there is never a direction for layer 0")
        writer.add_tensor(f"direction.{layer}", np.ascontiguousarray(dirs[layer], np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
