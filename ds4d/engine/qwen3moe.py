"""The qwen3moe model family (Qwen3-MoE: Qwen3-30B-A3B, Qwen3-Coder-30B-A3B, ...): GGUF
validation and the ctypes face of native/qwen3moe.{c,h}.

Qwen3 attention (per-head RMSNorm of q and k, half-split RoPE, no biases) and a
mixture-of-experts FFN on every layer: softmax router, top-k experts, weights renormalised
unless the file sets `expert_weights_norm` false (llama.cpp always renormalises this
family; Qwen3-MoE checkpoints set norm_topk_prob), SwiGLU experts. The session state is
decoder.DecoderState.
"""

from __future__ import annotations

import ctypes

from ds4d.engine import native
from ds4d.engine.decoder import RopeScaling, RopeScalingC, ShapeC
from ds4d.engine.errors import ModelLoadError
from ds4d.engine.gguf_file import GGUFFile
from ds4d.engine.moe_decoder import ExpertsC, MoEDecoderModel

FAMILY = "qwen3moe"

# Slot order of native/qwen3moe.h (after decoder.SHARED_GLOBAL_SLOTS, its only globals).
LAYER_SLOTS = (
    "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
    "attn_output.weight", "attn_q_norm.weight", "attn_k_norm.weight", "ffn_norm.weight",
    "ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight",
    "ffn_down_exps.weight",
)  # fmt: skip
OPTIONAL = {"output.weight"}


class HParamsC(ctypes.Structure):
    """struct ds4n_qwen3moe_hparams."""

    _fields_ = [("shape", ShapeC), ("scaling", RopeScalingC), ("experts", ExpertsC),
                ("norm_weights", ctypes.c_int32)]  # fmt: skip


class Qwen3MoEModel(MoEDecoderModel):
    family = FAMILY
    prefix = "qwen3moe"

    def __init__(self, gf: GGUFFile, pool: native.Pool) -> None:
        super().__init__(gf, pool)
        hp = self.hp
        gating = int(hp("expert_gating_func", 1))
        if gating != 1:
            raise ModelLoadError(f"qwen3moe: expert gating function {gating} is not softmax (1)")
        scaling = RopeScaling(hp, self.n_ctx_train, ("none", "linear", "yarn"))
        norm_weights = int(bool(hp("expert_weights_norm", True)))
        params = HParamsC(self.shape.c_shape(), scaling.c_scaling(), self.c_experts(),
                          norm_weights)  # fmt: skip
        self.open_native(LAYER_SLOTS, self.tensor_shapes(), OPTIONAL, params)


def load(gf: GGUFFile, pool: native.Pool) -> Qwen3MoEModel:
    return Qwen3MoEModel(gf, pool)
