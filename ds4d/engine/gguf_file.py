"""A GGUF file opened over mmap: metadata, tensor views, and a model fingerprint.

The header, metadata and tensor index are parsed and validated by gguf_reader before
anything else looks at the file. By default the weights stay in the page cache: every tensor
is a numpy view of the read-only mmap, and the C forward pass reads the same pages through
the view's address. With `weights="huge"` the tensor data is read once into a resident copy
on huge pages instead, and the tensors are views of that (see weight_memory). Every expected failure (missing, truncated, not GGUF, an inconsistent index, an
out-of-range token id) is a ModelLoadError with one line that names what was expected.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ds4d.engine import weight_memory
from ds4d.engine.errors import ModelLoadError
from ds4d.engine.gguf_reader import (
    BOOL,
    FLOAT32,
    FLOAT64,
    GGUF_MAGIC,
    STRING,
    TENSOR_DTYPES,
    GGUFArray,
    GGUFFormatError,
    GGUFIndex,
    TensorInfo,
    parse,
)

__all__ = ["GGUF_MAGIC", "GGUFArray", "GGUFFile", "Tensor"]

_MISSING = object()
# llama.cpp's general.file_type numbers (LLAMA_FTYPE_*), for the quantisation mix's name.
# fmt: off
_FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0",
    38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0", 1024: "GUESSED",
}
# fmt: on
_MAX_TOKEN_TYPE = 6  # llama.cpp's token types: undefined, normal, ... user-defined, byte
_TOKEN_ID_KEY = re.compile(r"tokenizer\.ggml\.\w+_token_id")
_BLOCK_TENSOR = re.compile(r"blk\.(\d+)\.")

# The kind of value the well-known keys must hold (a list: an array of that kind), as
# llama.cpp's typed getters insist; a value of another type is refused, not reinterpreted.
_INT, _FLOAT, _STR, _BOOL = "an integer", "a float", "a string", "a boolean"
_KEY_KINDS: dict[str, tuple[str | list[str], ...]] = {
    "general.architecture": (_STR,), "general.name": (_STR,), "general.file_type": (_INT,),
    "general.alignment": (_INT,), "tokenizer.ggml.model": (_STR,),
    "tokenizer.ggml.pre": (_STR,), "tokenizer.chat_template": (_STR,),
    "tokenizer.ggml.tokens": ([_STR],), "tokenizer.ggml.merges": ([_STR],),
    "tokenizer.ggml.scores": ([_FLOAT],), "tokenizer.ggml.token_type": ([_INT],),
    "tokenizer.ggml.add_bos_token": (_BOOL,), "tokenizer.ggml.add_eos_token": (_BOOL,),
    "tokenizer.ggml.add_space_prefix": (_BOOL,),
}  # fmt: skip
# Hyper-parameters under "<architecture>.": per-layer values may be arrays.
_HPARAM_KINDS: dict[str, tuple[str | list[str], ...]] = {
    "block_count": (_INT,), "context_length": (_INT,), "embedding_length": (_INT,),
    "feed_forward_length": (_INT, [_INT]), "attention.head_count": (_INT, [_INT]),
    "attention.head_count_kv": (_INT, [_INT]), "attention.key_length": (_INT,),
    "attention.value_length": (_INT,), "rope.dimension_count": (_INT,),
    "vocab_size": (_INT,), "expert_count": (_INT,), "expert_used_count": (_INT,),
    "attention.sliding_window": (_INT,), "attention.layer_norm_rms_epsilon": (_FLOAT,),
    "attention.layer_norm_epsilon": (_FLOAT,), "rope.freq_base": (_FLOAT,),
    "rope.scaling.factor": (_FLOAT,), "rope.scaling.type": (_STR,),
    "final_logit_softcapping": (_FLOAT,), "attn_logit_softcapping": (_FLOAT,),
}  # fmt: skip


def _kind(vtype: int) -> str:
    if vtype == STRING:
        return _STR
    if vtype == BOOL:
        return _BOOL
    return _FLOAT if vtype in (FLOAT32, FLOAT64) else _INT


@dataclass(frozen=True)
class Tensor:
    """One tensor of the file. `shape` is in GGUF order (ne0 first: ne0 is the row length
    of a matrix), `type` is the GGML type number, `data` a view of the mmap (float and
    integer types as their elements, quantized types as bytes, rows last)."""

    name: str
    type: int
    type_name: str
    shape: tuple[int, ...]
    data: np.ndarray

    @property
    def address(self) -> int:
        return int(self.data.ctypes.data)

    @property
    def n_bytes(self) -> int:
        return int(self.data.nbytes)


def _describe(kind: str | list[str]) -> str:
    return f"an array of {kind[0].split(' ', 1)[1]}s" if isinstance(kind, list) else kind


class GGUFFile:
    """Metadata and tensors of one GGUF; see module docstring."""

    def __init__(self, path: str | os.PathLike[str], weights: str = "mmap") -> None:
        """`weights`: where the tensors' bytes live, one of weight_memory.WEIGHT_MODES
        ("auto" chooses by the tensor data's size); `weight_memory` tells which was used."""
        self.path = Path(path)
        try:
            self.file_bytes = self.path.stat().st_size
        except FileNotFoundError:
            raise ModelLoadError(f"model file not found: {self.path}") from None
        except OSError as e:
            raise ModelLoadError(f"cannot read model file {self.path}: {e.strerror}") from None
        if not self.path.is_file():
            raise ModelLoadError(f"model path is not a regular file: {self.path}")
        try:
            with open(self.path, "rb") as f:
                magic = f.read(4)
        except OSError as e:
            raise ModelLoadError(f"cannot read model file {self.path}: {e.strerror}") from None
        if magic != GGUF_MAGIC:
            raise ModelLoadError(f"not a GGUF file (bad magic {magic!r}): {self.path}")
        try:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"cannot map model file {self.path}: {e}") from None
        try:
            self.index: GGUFIndex = parse(memoryview(self._map.data), self.file_bytes)
        except GGUFFormatError as e:
            raise ModelLoadError(f"truncated or corrupt GGUF {self.path}: {e}") from None
        self._metadata = self.index.metadata
        self._data: np.ndarray = self._map
        self._data_start = 0
        data_bytes = self.file_bytes - self.index.data_offset if self.index.tensors else 0
        try:
            self.weight_memory = weight_memory.resolve(weights, data_bytes)
        except ValueError as e:
            raise ModelLoadError(str(e)) from None
        if self.weight_memory == "huge" and data_bytes > 0:
            try:
                self._data = weight_memory.read_resident(
                    self.path, self.index.data_offset, data_bytes
                )
            except OSError as e:
                raise ModelLoadError(f"cannot read the weights of {self.path}: {e}") from None
            self._data_start = self.index.data_offset
        self._tensors = {t.name: self._view(t) for t in self.index.tensors}
        self._reader: Any = None
        self.architecture = self.require("general.architecture")
        if not isinstance(self.architecture, str):
            raise ModelLoadError(
                f"GGUF general.architecture is {self.architecture!r}, expected a string:"
                f" {self.path}"
            )
        self._check_kinds()
        self._check_counts()
        # The fingerprint names this model's exact shape: every tensor's name, type, shape
        # and offset, the architecture and the file size. Cheap (no weight bytes hashed);
        # used to refuse KV state made by another model.
        fp = hashlib.sha256(f"ds4d-model-v1\0{self.file_bytes}\0".encode())
        for t in self.index.tensors:
            fp.update(f"{t.name}\0{t.type.id}\0{t.shape}\0{t.offset}\n".encode())
        fp.update(self.architecture.encode())
        self.fingerprint = fp.hexdigest()

    def _view(self, t: TensorInfo) -> Tensor:
        """The tensor's bytes as numpy sees them: elements for float and integer types,
        bytes for the block-quantized ones (the last axis then counts bytes)."""
        dims = tuple(reversed(t.shape))
        start = t.offset - self._data_start
        raw = self._data[start : start + t.n_bytes]
        dtype = TENSOR_DTYPES.get(t.type.id)
        if dtype is not None:
            data = raw.view(dtype).reshape(dims)
        else:
            row_bytes = dims[-1] // t.type.block_size * t.type.type_size
            data = raw.reshape((*dims[:-1], row_bytes))
        return Tensor(name=t.name, type=t.type.id, type_name=t.type.name, shape=t.shape,
                      data=data)  # fmt: skip

    def _check_kinds(self) -> None:
        """Well-known keys hold the kind of value readers of them expect."""
        prefix = self.architecture + "."
        for key, value in self._metadata.items():
            if _TOKEN_ID_KEY.fullmatch(key):
                allowed: tuple[str | list[str], ...] = (_INT,)
            elif key in _KEY_KINDS:
                allowed = _KEY_KINDS[key]
            elif key.startswith(prefix) and key.removeprefix(prefix) in _HPARAM_KINDS:
                allowed = _HPARAM_KINDS[key.removeprefix(prefix)]
            else:
                continue
            vtype = self.index.value_types[key]
            if isinstance(value, GGUFArray):
                kind: str | list[str] = [_kind(value.item_type)]
            elif isinstance(value, list):
                kind = "an array of arrays"
            else:
                kind = _kind(vtype)
            if kind not in allowed:
                want = " or ".join(_describe(k) for k in allowed)
                raise ModelLoadError(
                    f"GGUF {key} is {_describe(kind)}, expected {want}: {self.path}"
                )

    def _check_counts(self) -> None:
        """Counts other code sizes loops and tables by: bounded by what the file holds."""
        blocks = self.get(f"{self.architecture}.block_count")
        if self._tensors and blocks is not None:
            if not isinstance(blocks, int) or not 0 < blocks <= len(self._tensors):
                raise ModelLoadError(
                    f"GGUF {self.architecture}.block_count is {blocks!r}, expected 1 to the"
                    f" {len(self._tensors)} tensors the file holds: {self.path}"
                )
            # A block's tensors past the count would be left unread: the count or the
            # tensors are wrong, and a model of fewer layers would open without a word.
            for name in self._tensors:
                m = _BLOCK_TENSOR.match(name)
                if m and int(m.group(1)) >= blocks:
                    raise ModelLoadError(
                        f"GGUF tensor {name} belongs to block {m.group(1)}, but"
                        f" {self.architecture}.block_count is {blocks}: {self.path}"
                    )
        tokens = self.get_array("tokenizer.ggml.tokens")
        if tokens is None:
            return
        n_vocab = len(tokens)
        for key, value in self._metadata.items():
            if _TOKEN_ID_KEY.fullmatch(key) and not (
                isinstance(value, int) and not isinstance(value, bool) and 0 <= value < n_vocab
            ):
                raise ModelLoadError(
                    f"GGUF {key} is {value!r}, expected a token id below the vocabulary"
                    f" size {n_vocab}: {self.path}"
                )
        for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            arr = self.get_array(key)
            if arr is not None and len(arr) != n_vocab:
                raise ModelLoadError(
                    f"GGUF {key} has {len(arr)} entries, expected one per token ({n_vocab}):"
                    f" {self.path}"
                )
        types = self.get_array("tokenizer.ggml.token_type")
        if types is not None and n_vocab:
            values = types.numpy()
            bad = np.flatnonzero((values < 0) | (values > _MAX_TOKEN_TYPE))
            if len(bad):
                raise ModelLoadError(
                    f"GGUF tokenizer.ggml.token_type[{bad[0]}] is {values[bad[0]]}, expected a"
                    f" token type 0 to {_MAX_TOKEN_TYPE}: {self.path}"
                )

    # -- metadata ---------------------------------------------------------------------

    def get(self, key: str, default: Any = None) -> Any:
        """A metadata value as Python data (arrays as lists), or `default`."""
        value = self._metadata.get(key, _MISSING)
        if value is _MISSING:
            return default
        try:
            if isinstance(value, GGUFArray):
                return value.tolist()
            if isinstance(value, list):  # an array of arrays
                return [v.tolist() for v in value]
        except (GGUFFormatError, TypeError) as e:
            raise ModelLoadError(f"corrupt metadata value {key} in {self.path}: {e}") from None
        return value

    def get_array(self, key: str) -> GGUFArray | None:
        """A metadata array undecoded (see GGUFArray: .numpy(), .strings()), or None
        when the key is absent or not an array."""
        value = self._metadata.get(key)
        return value if isinstance(value, GGUFArray) else None

    def require(self, key: str) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise ModelLoadError(f"GGUF is missing hyper-parameter {key}: {self.path}")
        return value

    def keys(self) -> list[str]:
        """The metadata keys, in file order."""
        return list(self._metadata)

    def override(self, values: dict[str, str | int | float]) -> None:
        """Set metadata values over the file's (llama.cpp's --override-kv): later reads
        see them, and the fingerprint names them, so KV state computed without them (or
        with others) is refused rather than reused."""
        fp = hashlib.sha256(f"{self.fingerprint}\0override\n".encode())
        for key in sorted(values):
            self._metadata[key] = values[key]
            fp.update(f"{key}\0{values[key]!r}\n".encode())
        self.fingerprint = fp.hexdigest()

    @property
    def name(self) -> str:
        return str(self.get("general.name") or self.path.stem)

    @property
    def file_type_name(self) -> str:
        """The quantization mix as a name (general.file_type, e.g. MOSTLY_Q4_1 -> Q4_1)."""
        ft = self.get("general.file_type")
        if ft is None:
            return "unknown"
        return _FILE_TYPES.get(ft, f"file_type {ft}") if isinstance(ft, int) else "unknown"

    @property
    def chat_template(self) -> str | None:
        value = self.get("tokenizer.chat_template")
        return str(value) if value else None

    # -- tensors ----------------------------------------------------------------------

    def has_tensor(self, name: str) -> bool:
        return name in self._tensors

    def tensor(self, name: str) -> Tensor:
        try:
            return self._tensors[name]
        except KeyError:
            raise ModelLoadError(f"GGUF is missing tensor {name}: {self.path}") from None

    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    def file_offset(self, tensor: Tensor) -> int:
        """Where the tensor's bytes start in the file, found from its view's address
        (wherever the weights live: the mapping or the resident copy)."""
        return tensor.address - int(self._data.ctypes.data) + self._data_start

    # -- the gguf package's reader, for code that still walks its fields -------------------

    @property
    def reader(self) -> Any:
        """A gguf.GGUFReader of the same file, built on first use (slow on a large
        vocabulary: prefer get/get_array/tensor) and dropped by release_reader."""
        if self._reader is None:
            import gguf

            try:
                self._reader = gguf.GGUFReader(self.path, "r")
            except Exception as e:  # the index above was valid; this is the reader's limit
                raise ModelLoadError(f"gguf cannot read {self.path}: {e}") from None
        return self._reader

    def release_reader(self) -> None:
        """Drops the gguf.GGUFReader if one was built (its per-element objects for the
        vocabulary weigh more than a small model). Everything else stays readable."""
        self._reader = None
