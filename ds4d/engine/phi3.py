"""The phi3 model family (Phi-3, Phi-3.5, Phi-4 mini): GGUF validation and the ctypes face of
native/phi3.{c,h}.

Fused `attn_qkv` (rows Q, K, V) and `ffn_up` holding gate then up (2 * n_ff rows); NEOX
RoPE with the file's `rope_factors_long` / `rope_factors_short` when present (long for
sessions whose context exceeds `rope.scaling.original_context_length`, as llama.cpp
chooses) and `rope.scaling.attn_factor` on cos and sin. A positive
`attention.sliding_window` restricts every layer to that window, as transformers does
(llama.cpp currently ignores it).
"""

from __future__ import annotations

import ctypes

from ds4d.engine import native
from ds4d.engine.decoder import DecoderModel, DenseShape, RopeScaling, RopeScalingC, ShapeC
from ds4d.engine.errors import ModelLoadError
from ds4d.engine.gguf_file import GGUFFile

FAMILY = "phi3"

# Slot order of native/phi3.h (after decoder.SHARED_GLOBAL_SLOTS).
GLOBAL_SLOTS = ("rope_factors_long.weight", "rope_factors_short.weight")
LAYER_SLOTS = ("attn_norm.weight", "attn_qkv.weight", "attn_output.weight", "ffn_norm.weight",
               "ffn_up.weight", "ffn_down.weight")  # fmt: skip
OPTIONAL = {"output.weight", "rope_factors_long.weight", "rope_factors_short.weight"}


class HParamsC(ctypes.Structure):
    """struct ds4n_phi3_hparams."""

    _fields_ = [("shape", ShapeC), ("scaling", RopeScalingC), ("window", ctypes.c_int32)]


class Phi3Model(DecoderModel):
    family = FAMILY
    prefix = "phi3"

    def __init__(self, gf: GGUFFile, pool: native.Pool) -> None:
        sh = DenseShape(gf, FAMILY)
        super().__init__(gf, pool, sh)
        scaling = RopeScaling(sh.hp, sh.n_ctx_train, ("none", "linear"))
        window = int(sh.hp("attention.sliding_window", 0))
        if window < 0:
            raise ModelLoadError(f"phi3: negative sliding window {window}")
        if gf.has_tensor("rope_factors_long.weight") != gf.has_tensor("rope_factors_short.weight"):
            raise ModelLoadError("phi3: rope_factors_long and rope_factors_short come in pairs")
        if gf.has_tensor("blk.0.attn_q.weight"):
            raise ModelLoadError("phi3 files with separate q/k/v tensors are not supported")
        # ffn_up holds gate then up.
        expected = {**sh.tensor_shapes(), "ffn_up.weight": (sh.n_embd, 2 * sh.n_ff)}
        params = HParamsC(sh.c_shape(), scaling.c_scaling(), window)
        self.open_native(LAYER_SLOTS, expected, OPTIONAL, params, GLOBAL_SLOTS)


def load(gf: GGUFFile, pool: native.Pool) -> Phi3Model:
    return Phi3Model(gf, pool)
