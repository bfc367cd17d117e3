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
from ds4d.engine.decoder import DecoderModel, DenseShape, RopeScaling, RopeScalingC, ShapeC
from ds4d.engine.gguf_file import GGUFFile

FAMILY = "llama"

# Slot order of native/llama.h (after decoder.SHARED_GLOBAL_SLOTS).
GLOBAL_SLOTS = ("rope_freqs.weight",)
LAYER_SLOTS = (
    "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
    "attn_output.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias",
    "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight",
    "attn_q_norm.weight", "attn_k_norm.weight",
)  # fmt: skip
OPTIONAL = {"output.weight", "rope_freqs.weight", "attn_q.bias", "attn_k.bias",
            "attn_v.bias", "attn_output.bias", "attn_q_norm.weight",
            "attn_k_norm.weight"}  # fmt: skip


class HParamsC(ctypes.Structure):
    """struct ds4n_llama_hparams."""

    _fields_ = [("shape", ShapeC), ("scaling", RopeScalingC), ("rope_neox", ctypes.c_int32)]


class LlamaModel(DecoderModel):
    """Validated weights of one llama GGUF, bound to a native model object."""

    family = FAMILY
    prefix = "llama"  # the native constructor: every subclass runs native/llama.c
    rope_neox = False
    required: frozenset[str] = frozenset()  # optional slots this family must have

    def __init__(self, gf: GGUFFile, pool: native.Pool) -> None:
        sh = DenseShape(gf, self.family)
        super().__init__(gf, pool, sh)
        scaling = RopeScaling(sh.hp, sh.n_ctx_train, ("none", "linear", "yarn"))
        params = HParamsC(sh.c_shape(), scaling.c_scaling(), int(self.rope_neox))
        self.open_native(LAYER_SLOTS, sh.tensor_shapes(), OPTIONAL - self.required, params,
                         GLOBAL_SLOTS)  # fmt: skip


def load(gf: GGUFFile, pool: native.Pool) -> LlamaModel:
    return LlamaModel(gf, pool)
