"""The gemma-embedding model family (EmbeddingGemma): the Gemma 3 text forward pass
(ds4d.engine.gemma3, native/gemma3.c) with bidirectional attention, read as llama.cpp reads
`gemma-embedding` GGUFs: every layer sees the whole input, a local layer the keys at most
`attention.sliding_window` // 2 positions away on either side (the symmetric window
transformers and llama.cpp give it); the final norm's rows are pooled (the file's
`pooling_type`, mean for the released model).

The released sentence-transformers model then applies two Dense layers (768 -> 3072 ->
768, no bias, no activation) to the pooled vector before normalising it. llama.cpp's
converter writes them as `dense_2.weight` and `dense_3.weight` when run with
`--sentence-transformers-dense-modules`, and llama.cpp applies them after the pooling when
they are there; so does ds4d (`project_pooled`). A file without them gives the vectors of
the model without its projections, as llama.cpp's do.
"""

from __future__ import annotations

import numpy as np

from ds4d.engine import native
from ds4d.engine.errors import EngineError, ModelLoadError
from ds4d.engine.gemma3 import Gemma3Model
from ds4d.engine.gguf_file import GGUFFile, Tensor

FAMILY = "gemma-embedding"
DENSE = ("dense_2.weight", "dense_3.weight")


class Projection:
    """One Dense layer of the file: out = W x (W: rows x cols, any type the native matmul
    reads), computed by the native kernel one vector at a time (so a vector does not depend
    on what it is batched with)."""

    def __init__(self, t: Tensor) -> None:
        if len(t.shape) != 2:
            raise ModelLoadError(f"tensor {t.name} has shape {t.shape}; a matrix expected")
        self.cols, self.rows = int(t.shape[0]), int(t.shape[1])
        try:
            need = self.rows * native.row_bytes(t.type, self.cols)
        except (EngineError, ValueError) as e:
            raise ModelLoadError(f"tensor {t.name} ({t.type_name}): {e}") from None
        self.raw = np.ascontiguousarray(t.data).reshape(-1).view(np.uint8)
        if self.raw.nbytes != need:
            raise ModelLoadError(f"tensor {t.name} holds {self.raw.nbytes} bytes, not {need}")
        self.type = t.type

    def __call__(self, x: np.ndarray) -> np.ndarray:
        out = native.matmul(None, self.type, self.raw, self.rows, self.cols,
                            np.ascontiguousarray(x, dtype=np.float32))  # fmt: skip
        row: np.ndarray = out[0]
        return row


class GemmaEmbeddingModel(Gemma3Model):
    family = FAMILY
    encoder = True

    def __init__(self, gf: GGUFFile, pool: native.Pool) -> None:
        if gf.get(f"{gf.architecture}.attention.causal", False) is True:
            raise ModelLoadError("a causal gemma-embedding model is not supported")
        super().__init__(gf, pool)
        present = [name for name in DENSE if gf.has_tensor(name)]
        self.projections: tuple[Projection, ...] = ()
        if not present:
            return
        if len(present) != len(DENSE):
            raise ModelLoadError(f"{FAMILY}: {present[0]} without the other dense layer")
        up, down = (Projection(gf.tensor(name)) for name in DENSE)
        if up.cols != self.n_embd or down.cols != up.rows or down.rows != self.n_embd:
            raise ModelLoadError(
                f"{FAMILY}: dense layers of {up.cols} -> {up.rows} and {down.cols} ->"
                f" {down.rows} do not fit the model's width {self.n_embd}"
            )
        self.projections = (up, down)

    def project_pooled(self, pooled: np.ndarray) -> np.ndarray:
        """The file's Dense layers over the pooled vector (none: it as it is)."""
        for p in self.projections:
            pooled = p(pooled)
        return pooled


def load(gf: GGUFFile, pool: native.Pool) -> GemmaEmbeddingModel:
    return GemmaEmbeddingModel(gf, pool)
