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
from ds4d.engine.decoder import (
    Binder,
    DecoderModel,
    DenseShape,
    RopeScaling,
    declare_family,
    layer_names,
)
from ds4d.engine.errors import ModelLoadError
from ds4d.engine.gguf_file import GGUFFile
from ds4d.engine.native import lib

FAMILY = "phi3"

# Slot order of native/phi3.h.
GLOBAL_SLOTS = ("token_embd.weight", "output_norm.weight", "output.weight",
                "rope_factors_long.weight", "rope_factors_short.weight")  # fmt: skip
LAYER_SLOTS = ("attn_norm.weight", "attn_qkv.weight", "attn_output.weight", "ffn_norm.weight",
               "ffn_up.weight", "ffn_down.weight")  # fmt: skip
OPTIONAL = {"output.weight", "rope_factors_long.weight", "rope_factors_short.weight"}
MATRICES = {"token_embd.weight", "output.weight", "attn_qkv.weight", "attn_output.weight",
            "ffn_up.weight", "ffn_down.weight"}  # fmt: skip


class HParamsC(ctypes.Structure):
    _fields_ = [
        *[(n, ctypes.c_int32) for n in ("n_vocab", "n_embd", "n_layer", "n_head",
                                        "n_head_kv", "head_dim", "n_ff", "n_rot")],
        *[(n, ctypes.c_float) for n in ("rms_eps", "rope_base", "rope_scale",
                                        "rope_attn_factor")],
        ("n_ctx_orig", ctypes.c_int32),
        ("window", ctypes.c_int32),
    ]  # fmt: skip


declare_family("phi3", HParamsC)


class Phi3Model(DecoderModel):
    family = FAMILY
    prefix = "phi3"

    def __init__(self, gf: GGUFFile, pool: native.Pool) -> None:
        self.gf, self.pool = gf, pool
        sh = DenseShape(gf, FAMILY)
        hp = sh.hp
        scaling = RopeScaling(hp, sh.n_ctx_train, ("none", "linear"))
        window = int(hp("attention.sliding_window", 0))
        if window < 0:
            raise ModelLoadError(f"phi3: negative sliding window {window}")
        if gf.has_tensor("rope_factors_long.weight") != gf.has_tensor("rope_factors_short.weight"):
            raise ModelLoadError("phi3: rope_factors_long and rope_factors_short come in pairs")
        if gf.has_tensor("blk.0.attn_q.weight"):
            raise ModelLoadError("phi3 files with separate q/k/v tensors are not supported")
        self.n_vocab, self.n_ctx_train, self.n_embd = sh.n_vocab, sh.n_ctx_train, sh.n_embd
        self.n_layer, self.n_head_kv, self.head_dim = sh.n_layer, sh.n_head_kv, sh.head_dim
        E, F, V, n_q, n_kv = sh.n_embd, sh.n_ff, sh.n_vocab, sh.n_q, sh.n_kv
        half = sh.n_rot // 2
        expected = {
            "token_embd.weight": (E, V), "output_norm.weight": (E,), "output.weight": (E, V),
            "rope_factors_long.weight": (half,), "rope_factors_short.weight": (half,),
            "attn_norm.weight": (E,), "attn_qkv.weight": (E, n_q + 2 * n_kv),
            "attn_output.weight": (n_q, E), "ffn_norm.weight": (E,),
            "ffn_up.weight": (E, 2 * F), "ffn_down.weight": (F, E),
        }  # fmt: skip
        self._binder = Binder(gf, layer_names(GLOBAL_SLOTS, LAYER_SLOTS, sh.n_layer))
        self._binder.bind_all(expected.__getitem__, OPTIONAL, MATRICES)
        params = HParamsC(
            **sh.fields(), rope_scale=scaling.freq_scale, rope_attn_factor=scaling.attn_factor,
            n_ctx_orig=scaling.n_ctx_orig, window=window,
        )  # fmt: skip
        self._handle = lib.ds4n_phi3_new(ctypes.byref(params), self._binder.ptrs,
                                         self._binder.types)  # fmt: skip
        if not self._handle:
            raise ModelLoadError("the native engine refused this phi3 model's shape")


def load(gf: GGUFFile, pool: native.Pool) -> Phi3Model:
    return Phi3Model(gf, pool)
