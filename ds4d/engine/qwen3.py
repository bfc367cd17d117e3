"""The qwen3 model family (Qwen 3 dense): GGUF validation and the ctypes face of
native/qwen3.{c,h}. llama's layer with per-head q/k RMSNorm before NEOX RoPE."""

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

FAMILY = "qwen3"

# Slot order of native/qwen3.h.
GLOBAL_SLOTS = ("token_embd.weight", "output_norm.weight", "output.weight")
LAYER_SLOTS = (
    "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
    "attn_output.weight", "attn_q_norm.weight", "attn_k_norm.weight",
    "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight",
)  # fmt: skip
OPTIONAL = {"output.weight"}
MATRICES = {"token_embd.weight", "output.weight", "attn_q.weight", "attn_k.weight",
            "attn_v.weight", "attn_output.weight", "ffn_gate.weight", "ffn_up.weight",
            "ffn_down.weight"}  # fmt: skip


class HParamsC(ctypes.Structure):
    _fields_ = [
        *[(n, ctypes.c_int32) for n in ("n_vocab", "n_embd", "n_layer", "n_head",
                                        "n_head_kv", "head_dim", "n_ff", "n_rot")],
        *[(n, ctypes.c_float) for n in ("rms_eps", "rope_base", "rope_scale",
                                        "yarn_ext_factor", "rope_attn_factor",
                                        "yarn_beta_fast", "yarn_beta_slow")],
        ("n_ctx_orig", ctypes.c_int32),
    ]  # fmt: skip


declare_family("qwen3", HParamsC)


class Qwen3Model(DecoderModel):
    family = FAMILY
    prefix = "qwen3"

    def __init__(self, gf: GGUFFile, pool: native.Pool) -> None:
        self.gf, self.pool = gf, pool
        sh = DenseShape(gf, FAMILY)
        scaling = RopeScaling(sh.hp, sh.n_ctx_train, ("none", "linear", "yarn"))
        self.n_vocab, self.n_ctx_train, self.n_embd = sh.n_vocab, sh.n_ctx_train, sh.n_embd
        self.n_layer, self.n_head_kv, self.head_dim = sh.n_layer, sh.n_head_kv, sh.head_dim
        E, F, V, n_q, n_kv = sh.n_embd, sh.n_ff, sh.n_vocab, sh.n_q, sh.n_kv
        expected = {
            "token_embd.weight": (E, V), "output_norm.weight": (E,), "output.weight": (E, V),
            "attn_norm.weight": (E,), "attn_q.weight": (E, n_q), "attn_k.weight": (E, n_kv),
            "attn_v.weight": (E, n_kv), "attn_output.weight": (n_q, E),
            "attn_q_norm.weight": (sh.head_dim,), "attn_k_norm.weight": (sh.head_dim,),
            "ffn_norm.weight": (E,),
            "ffn_gate.weight": (E, F), "ffn_up.weight": (E, F), "ffn_down.weight": (F, E),
        }  # fmt: skip
        self._binder = Binder(gf, layer_names(GLOBAL_SLOTS, LAYER_SLOTS, sh.n_layer))
        self._binder.bind_all(expected.__getitem__, OPTIONAL, MATRICES)
        params = HParamsC(**sh.fields(), **scaling.fields())
        self._handle = lib.ds4n_qwen3_new(ctypes.byref(params), self._binder.ptrs,
                                          self._binder.types)  # fmt: skip
        if not self._handle:
            raise ModelLoadError("the native engine refused this qwen3 model's shape")


def load(gf: GGUFFile, pool: native.Pool) -> Qwen3Model:
    return Qwen3Model(gf, pool)
