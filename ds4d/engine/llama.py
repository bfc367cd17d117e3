"""The llama model family (Llama 2/3.x, SmolLM, ...): GGUF validation and the ctypes face of
native/llama.{c,h}. Qwen 2 and Qwen 3 (ds4d/engine/qwen2.py, qwen3.py) are this layer with
NEOX RoPE and their optional parts, so they are subclasses of LlamaModel.

`load(gguf_file, pool)` checks every hyper-parameter and tensor the forward pass needs
(names, shapes, quant types) and hands the mmap'd weight addresses to C; nothing is
copied except the rare norm vector stored in a half type. Llama 3.1/3.2's RoPE scaling
arrives as the `rope_freqs` tensor; linear and YaRN scaling come from the metadata. The
session state is decoder.DecoderState.
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

FAMILY = "llama"

# Slot order of native/llama.h.
GLOBAL_SLOTS = ("token_embd.weight", "output_norm.weight", "output.weight", "rope_freqs.weight")
LAYER_SLOTS = (
    "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
    "attn_output.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias",
    "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight",
    "attn_q_norm.weight", "attn_k_norm.weight",
)  # fmt: skip
OPTIONAL = {"output.weight", "rope_freqs.weight", "attn_q.bias", "attn_k.bias",
            "attn_v.bias", "attn_output.bias", "attn_q_norm.weight",
            "attn_k_norm.weight"}  # fmt: skip
MATRICES = {"token_embd.weight", "output.weight", "attn_q.weight", "attn_k.weight",
            "attn_v.weight", "attn_output.weight", "ffn_gate.weight", "ffn_up.weight",
            "ffn_down.weight"}  # fmt: skip


class HParamsC(ctypes.Structure):
    _fields_ = [
        *[(n, ctypes.c_int32) for n in ("n_vocab", "n_embd", "n_layer", "n_head",
                                        "n_head_kv", "head_dim", "n_ff", "n_rot")],
        ("rope_base", ctypes.c_float),
        ("rope_scale", ctypes.c_float),
        ("rms_eps", ctypes.c_float),
        ("yarn_ext_factor", ctypes.c_float),
        ("rope_attn_factor", ctypes.c_float),
        ("yarn_beta_fast", ctypes.c_float),
        ("yarn_beta_slow", ctypes.c_float),
        ("n_ctx_orig", ctypes.c_int32),
        ("rope_neox", ctypes.c_int32),
    ]  # fmt: skip


declare_family("llama", HParamsC)


class LlamaModel(DecoderModel):
    """Validated weights of one llama GGUF, bound to a native model object."""

    family = FAMILY
    prefix = "llama"  # the native functions: every subclass runs native/llama.c
    rope_neox = False
    required: frozenset[str] = frozenset()  # optional slots this family must have

    def __init__(self, gf: GGUFFile, pool: native.Pool) -> None:
        self.gf, self.pool = gf, pool
        family = self.family
        sh = DenseShape(gf, family)
        scaling = RopeScaling(sh.hp, sh.n_ctx_train, ("none", "linear", "yarn"))
        self.n_vocab, self.n_ctx_train, self.n_embd = sh.n_vocab, sh.n_ctx_train, sh.n_embd
        self.n_layer, self.n_head_kv, self.head_dim = sh.n_layer, sh.n_head_kv, sh.head_dim
        E, F, V, n_q, n_kv = sh.n_embd, sh.n_ff, sh.n_vocab, sh.n_q, sh.n_kv
        expected = {
            "token_embd.weight": (E, V), "output_norm.weight": (E,), "output.weight": (E, V),
            "rope_freqs.weight": (sh.n_rot // 2,), "attn_norm.weight": (E,),
            "attn_q.weight": (E, n_q), "attn_k.weight": (E, n_kv), "attn_v.weight": (E, n_kv),
            "attn_output.weight": (n_q, E), "attn_q.bias": (n_q,), "attn_k.bias": (n_kv,),
            "attn_v.bias": (n_kv,), "attn_output.bias": (E,), "ffn_norm.weight": (E,),
            "ffn_gate.weight": (E, F), "ffn_up.weight": (E, F), "ffn_down.weight": (F, E),
            "attn_q_norm.weight": (sh.head_dim,), "attn_k_norm.weight": (sh.head_dim,),
        }  # fmt: skip
        self._binder = Binder(gf, layer_names(GLOBAL_SLOTS, LAYER_SLOTS, self.n_layer))
        self._binder.bind_all(expected.__getitem__, OPTIONAL - self.required, MATRICES)
        params = HParamsC(**sh.fields(), rope_neox=int(self.rope_neox), **scaling.fields())
        self._handle = lib.ds4n_llama_new(ctypes.byref(params), self._binder.ptrs,
                                          self._binder.types)  # fmt: skip
        if not self._handle:
            raise ModelLoadError(f"the native engine refused this {family} model's shape")


def load(gf: GGUFFile, pool: native.Pool) -> LlamaModel:
    return LlamaModel(gf, pool)
