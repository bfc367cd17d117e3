"""The gemma3 model family (Gemma 3 text): GGUF validation and the ctypes face of
native/gemma3.{c,h}.

Read as llama.cpp reads it: local (sliding-window) layers in the file's pattern (every
`attention.sliding_window_pattern`-th layer is global, 6 when absent) with their own RoPE
base (`rope.freq_base_swa`, 10000 when absent), the query scale from `attention.scale`
(else 1/sqrt(head_dim), or 1/sqrt(n_embd/n_head) for the 62-layer 27B), final logit
soft-capping when declared. The converter has already added Gemma's +1 to the norm weights.
"""

from __future__ import annotations

import ctypes
import math

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

FAMILY = "gemma3"

# Slot order of native/gemma3.h.
GLOBAL_SLOTS = ("token_embd.weight", "output_norm.weight", "output.weight")
LAYER_SLOTS = (
    "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
    "attn_output.weight", "attn_q_norm.weight", "attn_k_norm.weight",
    "post_attention_norm.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight",
    "ffn_down.weight", "post_ffw_norm.weight",
)  # fmt: skip
OPTIONAL = {"output.weight"}
MATRICES = {"token_embd.weight", "output.weight", "attn_q.weight", "attn_k.weight",
            "attn_v.weight", "attn_output.weight", "ffn_gate.weight", "ffn_up.weight",
            "ffn_down.weight"}  # fmt: skip
DEFAULT_SWA_PATTERN = 6
DEFAULT_LOCAL_BASE = 10000.0


class HParamsC(ctypes.Structure):
    _fields_ = [
        *[(n, ctypes.c_int32) for n in ("n_vocab", "n_embd", "n_layer", "n_head",
                                        "n_head_kv", "head_dim", "n_ff", "n_rot")],
        *[(n, ctypes.c_float) for n in ("rms_eps", "rope_base", "rope_scale",
                                        "rope_base_local", "q_scale", "softcap")],
        ("window", ctypes.c_int32),
        ("swa_pattern", ctypes.c_int32),
    ]  # fmt: skip


declare_family("gemma3", HParamsC)


class Gemma3Model(DecoderModel):
    family = FAMILY
    prefix = "gemma3"

    def __init__(self, gf: GGUFFile, pool: native.Pool) -> None:
        self.gf, self.pool = gf, pool
        sh = DenseShape(gf, FAMILY)
        hp = sh.hp
        scaling = RopeScaling(hp, sh.n_ctx_train, ("none", "linear"))
        window = int(hp("attention.sliding_window", 0))
        pattern = gf.get("gemma3.attention.sliding_window_pattern", DEFAULT_SWA_PATTERN)
        if isinstance(pattern, (list, tuple)):
            raise ModelLoadError("gemma3: a per-layer sliding_window_pattern is not supported")
        pattern = int(pattern)
        base_local = float(hp("rope.freq_base_swa", DEFAULT_LOCAL_BASE))
        softcap = float(hp("final_logit_softcapping", 0.0))
        if hp.has("attention.scale"):
            q_scale = float(hp("attention.scale"))
        elif sh.n_layer == 62:  # Gemma 3 27B scales by the model width per head
            q_scale = 1.0 / math.sqrt(sh.n_embd // sh.n_head)
        else:
            q_scale = 1.0 / math.sqrt(sh.head_dim)
        if window < 0 or pattern <= 0 or softcap < 0 or base_local <= 0:
            raise ModelLoadError(
                f"unsupported gemma3 attention: window {window}, pattern {pattern},"
                f" local rope base {base_local}, soft-cap {softcap}"
            )
        self.n_vocab, self.n_ctx_train, self.n_embd = sh.n_vocab, sh.n_ctx_train, sh.n_embd
        self.n_layer, self.n_head_kv, self.head_dim = sh.n_layer, sh.n_head_kv, sh.head_dim
        E, F, V, n_q, n_kv, hd = sh.n_embd, sh.n_ff, sh.n_vocab, sh.n_q, sh.n_kv, sh.head_dim
        expected = {
            "token_embd.weight": (E, V), "output_norm.weight": (E,), "output.weight": (E, V),
            "attn_norm.weight": (E,), "attn_q.weight": (E, n_q), "attn_k.weight": (E, n_kv),
            "attn_v.weight": (E, n_kv), "attn_output.weight": (n_q, E),
            "attn_q_norm.weight": (hd,), "attn_k_norm.weight": (hd,),
            "post_attention_norm.weight": (E,), "ffn_norm.weight": (E,),
            "ffn_gate.weight": (E, F), "ffn_up.weight": (E, F), "ffn_down.weight": (F, E),
            "post_ffw_norm.weight": (E,),
        }  # fmt: skip
        self._binder = Binder(gf, layer_names(GLOBAL_SLOTS, LAYER_SLOTS, sh.n_layer))
        self._binder.bind_all(expected.__getitem__, OPTIONAL, MATRICES)
        fields = sh.fields()
        params = HParamsC(
            **fields, rope_scale=scaling.freq_scale, rope_base_local=base_local,
            q_scale=q_scale, softcap=softcap, window=window, swa_pattern=pattern,
        )  # fmt: skip
        self._handle = lib.ds4n_gemma3_new(ctypes.byref(params), self._binder.ptrs,
                                           self._binder.types)  # fmt: skip
        if not self._handle:
            raise ModelLoadError("the native engine refused this gemma3 model's shape")


def load(gf: GGUFFile, pool: native.Pool) -> Gemma3Model:
    return Gemma3Model(gf, pool)
