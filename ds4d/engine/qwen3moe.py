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
from ds4d.engine.decoder import Binder, RopeScaling, declare_family, layer_names
from ds4d.engine.errors import ModelLoadError
from ds4d.engine.gguf_file import GGUFFile
from ds4d.engine.moe_decoder import MoEDecoderModel, declare_expert_bytes
from ds4d.engine.native import lib

FAMILY = "qwen3moe"

# Slot order of native/qwen3moe.h.
GLOBAL_SLOTS = ("token_embd.weight", "output_norm.weight", "output.weight")
LAYER_SLOTS = (
    "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
    "attn_output.weight", "attn_q_norm.weight", "attn_k_norm.weight", "ffn_norm.weight",
    "ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight",
    "ffn_down_exps.weight",
)  # fmt: skip
OPTIONAL = {"output.weight"}
MATRICES = {"token_embd.weight", "output.weight", "attn_q.weight", "attn_k.weight",
            "attn_v.weight", "attn_output.weight", "ffn_gate_inp.weight",
            "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"}  # fmt: skip


class HParamsC(ctypes.Structure):
    _fields_ = [
        *[(n, ctypes.c_int32) for n in ("n_vocab", "n_embd", "n_layer", "n_head", "n_head_kv",
                                        "head_dim", "n_rot", "n_expert", "n_used", "n_ff_exp",
                                        "norm_weights")],
        *[(n, ctypes.c_float) for n in ("weights_scale", "rope_base", "rms_eps", "rope_scale",
                                        "yarn_ext_factor", "rope_attn_factor",
                                        "yarn_beta_fast", "yarn_beta_slow")],
        ("n_ctx_orig", ctypes.c_int32),
    ]  # fmt: skip


declare_family("qwen3moe", HParamsC)
declare_expert_bytes("qwen3moe")


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
        n_q, n_kv, E, hd = (self.n_head * self.head_dim, self.n_head_kv * self.head_dim,
                            self.n_embd, self.head_dim)  # fmt: skip
        expected = {
            "token_embd.weight": (E, self.n_vocab), "output_norm.weight": (E,),
            "output.weight": (E, self.n_vocab), "attn_norm.weight": (E,),
            "attn_q.weight": (E, n_q), "attn_k.weight": (E, n_kv), "attn_v.weight": (E, n_kv),
            "attn_output.weight": (n_q, E), "attn_q_norm.weight": (hd,),
            "attn_k_norm.weight": (hd,), "ffn_norm.weight": (E,), **self.expert_shapes(),
        }  # fmt: skip
        self._binder = Binder(gf, layer_names(GLOBAL_SLOTS, LAYER_SLOTS, self.n_layer))
        self._binder.bind_all(expected.__getitem__, OPTIONAL, MATRICES)
        params = HParamsC(
            n_vocab=self.n_vocab, n_embd=E, n_layer=self.n_layer, n_head=self.n_head,
            n_head_kv=self.n_head_kv, head_dim=hd, n_rot=self.n_rot, n_expert=self.n_expert,
            n_used=self.n_used, n_ff_exp=self.n_ff_exp,
            norm_weights=int(bool(hp("expert_weights_norm", True))),
            weights_scale=float(hp("expert_weights_scale", 0.0)), rope_base=self.rope_base,
            rms_eps=self.rms_eps, **scaling.fields(),
        )  # fmt: skip
        self._handle = lib.ds4n_qwen3moe_new(ctypes.byref(params), self._binder.ptrs,
                                             self._binder.types)  # fmt: skip
        if not self._handle:
            raise ModelLoadError("the native engine refused this qwen3moe model's shape")


def load(gf: GGUFFile, pool: native.Pool) -> Qwen3MoEModel:
    return Qwen3MoEModel(gf, pool)
