"""A GGUF file opened over mmap: metadata, tensor views, and a model fingerprint.

Weights stay in the page cache: every tensor is a numpy view of the read-only mmap that
`gguf.GGUFReader` makes, and the C forward pass reads the same pages through the view's
address. Every expected failure (missing, truncated, not GGUF, a tensor of the wrong kind)
is a ModelLoadError with one line that names what was expected.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ds4d.engine.errors import ModelLoadError

GGUF_MAGIC = b"GGUF"
_MISSING = object()
# Metadata arrays longer than this (the tokenizer's vocabulary and merges) are not kept
# once the reader is released: their per-element objects cost more than the weights.
_KEEP_ARRAY_MAX = 4096


@dataclass(frozen=True)
class Tensor:
    """One tensor of the file. `shape` is in GGUF order (ne0 first: ne0 is the row length
    of a matrix), `type` is the GGML type number, `data` a view of the mmap."""

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


class GGUFFile:
    """Metadata and tensors of one GGUF; see module docstring."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        import gguf

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
            self._reader: gguf.GGUFReader | None = gguf.GGUFReader(self.path, "r")
        except Exception as e:  # the reader's errors are plain ValueError/IndexError/...
            detail = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ModelLoadError(f"truncated or corrupt GGUF {self.path}: {detail}") from None
        self._metadata: dict[str, Any] | None = None
        self._tensors: dict[str, Tensor] = {}
        # The fingerprint names this model's exact shape: every tensor's name, type, shape
        # and offset, the architecture and the file size. Cheap (no weight bytes hashed);
        # used to refuse KV state made by another model.
        fp = hashlib.sha256(f"ds4d-model-v1\0{self.file_bytes}\0".encode())
        for t in self.reader.tensors:
            end = int(t.data_offset) + int(t.n_bytes)
            if end > self.file_bytes or t.data.nbytes != t.n_bytes:
                raise ModelLoadError(
                    f"truncated GGUF {self.path}: tensor {t.name} needs bytes up to {end},"
                    f" file has {self.file_bytes}"
                )
            self._tensors[t.name] = Tensor(
                name=t.name,
                type=int(t.tensor_type),
                type_name=t.tensor_type.name,
                shape=tuple(int(d) for d in t.shape),
                data=t.data,
            )
            fp.update(f"{t.name}\0{int(t.tensor_type)}\0{self._tensors[t.name].shape}"
                      f"\0{int(t.data_offset)}\n".encode())
        self.architecture = str(self.require("general.architecture"))
        fp.update(self.architecture.encode())
        self.fingerprint = fp.hexdigest()

    def release_reader(self) -> None:
        """Drops the GGUFReader (and its per-element objects for the tokenizer arrays,
        which weigh more than a small model) once the tokenizer is built. Tensor views
        stay valid: they hold the mmap itself. Small metadata stays readable."""
        if self._reader is None:
            return
        meta: dict[str, Any] = {}
        for key, field in self._reader.fields.items():
            if len(field.data) <= _KEEP_ARRAY_MAX:
                try:
                    meta[key] = field.contents()
                except Exception:
                    continue
        self._metadata = meta
        self._reader = None
        gc.collect()
        _malloc_trim()

    @property
    def reader(self) -> Any:
        """The gguf.GGUFReader (until release_reader)."""
        if self._reader is None:
            raise RuntimeError("the GGUF reader was released after loading")
        return self._reader
    # -- metadata ---------------------------------------------------------------------

    def get(self, key: str, default: Any = None) -> Any:
        if self._metadata is not None:
            return self._metadata.get(key, default)
        field = self.reader.get_field(key)
        if field is None:
            return default
        try:
            return field.contents()
        except Exception as e:
            raise ModelLoadError(f"corrupt metadata value {key} in {self.path}: {e}") from None

    def require(self, key: str) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise ModelLoadError(f"GGUF is missing hyper-parameter {key}: {self.path}")
        return value

    @property
    def name(self) -> str:
        return str(self.get("general.name") or self.path.stem)

    @property
    def file_type_name(self) -> str:
        """The quantization mix as a name (general.file_type, e.g. MOSTLY_Q4_1 -> Q4_1)."""
        import gguf

        ft = self.get("general.file_type")
        if ft is None:
            return "unknown"
        try:
            name = gguf.LlamaFileType(int(ft)).name
        except ValueError:
            return f"file_type {ft}"
        return name.removeprefix("MOSTLY_").removeprefix("ALL_")

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


def _malloc_trim() -> None:
    """Returns freed heap pages to the OS (glibc); a no-op elsewhere."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
