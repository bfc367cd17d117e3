"""What the tiny GGUF writers (tiny_llama.py, tiny_dense.py, tiny_moe.py) share: a
GGUFWriter whose tensors are random normal values times a scale (plus an offset, for norm
weights around 1) stored in the type asked for, with a test's changes applied (tensors
dropped, shapes or types overridden), then written out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter
from gguf.quants import quantize


class TinyGGUF:
    def __init__(self, path: Path, arch: str, *, seed: int = 0, drop: tuple[str, ...] = (),
                 override_shape: dict[str, tuple[int, ...]] | None = None,
                 override_type: dict[str, Q] | None = None) -> None:  # fmt: skip
        self.path = path
        self.rng = np.random.default_rng(seed)  # the tensors' values, in the order added
        self.writer = GGUFWriter(str(path), arch)
        self.drop = drop
        self.override_shape = override_shape or {}
        self.override_type = override_type or {}

    def add(self, name: str, shape: tuple[int, ...], qtype: Q, scale: float = 0.2,
            offset: float = 0.0) -> None:  # fmt: skip
        """A random tensor of numpy shape (rows, row length), stored as qtype (raw random
        bytes of its size when gguf cannot quantize that type)."""
        if name in self.drop:
            return
        shape = self.override_shape.get(name, shape)
        qtype = self.override_type.get(name, qtype)
        values = self.rng.standard_normal(shape) * scale
        if offset:
            values = values + offset
        data = values.astype(np.float32)
        if qtype == Q.F32:
            self.writer.add_tensor(name, data)
        elif qtype == Q.F16:
            self.writer.add_tensor(name, data.astype(np.float16))
        else:
            try:
                raw = quantize(data, qtype)
            except NotImplementedError:
                from gguf.constants import GGML_QUANT_SIZES

                bs, nb = GGML_QUANT_SIZES[qtype]
                raw = self.rng.integers(0, 255, (*shape[:-1], shape[-1] // bs * nb),
                                        dtype=np.uint8)  # fmt: skip
            self.writer.add_tensor(name, raw, raw_dtype=qtype)

    def close(self) -> Path:
        w = self.writer
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return self.path
