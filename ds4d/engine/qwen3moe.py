"""The qwen3moe model family (Qwen3-MoE: Qwen3-30B-A3B, Qwen3-Coder-30B-A3B, ...): GGUF
validation and the ctypes face of native/qwen3moe.{c,h}.

Qwen3 attention (per-head RMSNorm of q and k, half-split RoPE, no biases) and a
mixture-of-experts FFN on every layer: softmax router, top-k experts, weights renormalised
unless the file sets `expert_weights_norm` false (llama.cpp always renormalises this
family; Qwen3-MoE checkpoints set norm_topk_prob), SwiGLU experts. The session state is
ds4d/engine/moe_decoder.py's.
"""

from __future__ import annotations

import ctypes

from ds4d.engine import native
from ds4d.engine.errors import ModelLoadError
from ds4d.engine.gguf_file import GGUFFile
from ds4d.engine.moe_decoder import MoEModel, WeightSlots

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


class HParams(ctypes.Structure):
    _fields_ = [
        *[(n, ctypes.c_int32) for n in ("n_vocab", "n_embd", "n_layer", "n_head", "n_head_kv",
                                        "head_dim", "n_rot", "n_expert", "n_used", "n_ff_exp",
                                        "norm_weights")],
        *[(n, ctypes.c_float) for n in ("weights_scale", "rope_base", "rope_freq_scale",
                                        "rms_eps", "rope_ext_factor", "rope_attn_factor",
                                        "rope_beta_fast", "rope_beta_slow")],
        ("rope_n_ctx_orig", ctypes.c_int32),
    ]  # fmt: skip


class Qwen3MoEModel(MoEModel):
    FAMILY = FAMILY
    PREFIX = "ds4n_qwen3moe"
    HParams = HParams

    def __init__(self, gf: GGUFFile, pool: native.Pool) -> None:
        super().__init__(gf, pool)
        hp = self.hp
        gating = int(hp("expert_gating_func", 1))
        if gating != 1:
            raise ModelLoadError(f"qwen3moe: expert gating function {gating} is not softmax (1)")
        rope = self._rope_scaling()
        n_q, n_kv, E, hd = (self.n_head * self.head_dim, self.n_head_kv * self.head_dim,
                            self.n_embd, self.head_dim)  # fmt: skip
        expected = {
            "token_embd.weight": (E, self.n_vocab), "output_norm.weight": (E,),
            "output.weight": (E, self.n_vocab), "attn_norm.weight": (E,),
            "attn_q.weight": (E, n_q), "attn_k.weight": (E, n_kv), "attn_v.weight": (E, n_kv),
            "attn_output.weight": (n_q, E), "attn_q_norm.weight": (hd,),
            "attn_k_norm.weight": (hd,), "ffn_norm.weight": (E,), **self.expert_shapes(),
        }  # fmt: skip
        names = list(GLOBAL_SLOTS) + [
            f"blk.{il}.{s}" for il in range(self.n_layer) for s in LAYER_SLOTS
        ]
        slots = WeightSlots(gf, names)
        slots.fill(expected, OPTIONAL, MATRICES)
        params = HParams(
            n_vocab=self.n_vocab, n_embd=E, n_layer=self.n_layer, n_head=self.n_head,
            n_head_kv=self.n_head_kv, head_dim=hd, n_rot=self.n_rot, n_expert=self.n_expert,
            n_used=self.n_used, n_ff_exp=self.n_ff_exp,
            norm_weights=int(bool(hp("expert_weights_norm", True))),
            weights_scale=float(hp("expert_weights_scale", 0.0)), rope_base=self.rope_base,
            rms_eps=self.rms_eps, **rope,
        )  # fmt: skip
        self._open(params, slots)

    def _rope_scaling(self) -> dict[str, float]:
        """The rope fields of HParams for the file's scaling: none, linear, or YaRN with
        llama.cpp's (and transformers' default) whole-dimension correction range."""
        hp = self.hp
        scaling = str(hp("rope.scaling.type", "none"))
        factor = float(hp("rope.scaling.factor", 1.0)) if scaling != "none" else 1.0
        if not factor > 0:
            raise ModelLoadError(f"rope scaling factor {factor} must be positive")
        rope = {"rope_freq_scale": 1.0 / factor, "rope_attn_factor": 1.0}
        if scaling == "yarn":
            rope.update(
                rope_ext_factor=float(hp("rope.scaling.yarn_ext_factor", 1.0)),
                rope_attn_factor=float(hp("rope.scaling.yarn_attn_factor", 1.0)),
                rope_beta_fast=float(hp("rope.scaling.yarn_beta_fast", 32.0)),
                rope_beta_slow=float(hp("rope.scaling.yarn_beta_slow", 1.0)),
                rope_n_ctx_orig=int(hp("rope.scaling.original_context_length")),
            )
        elif scaling not in ("none", "linear"):
            raise ModelLoadError(
                f"rope scaling type {scaling!r} is not supported (none, linear, yarn)"
            )
        return rope


def load(gf: GGUFFile, pool: native.Pool) -> Qwen3MoEModel:
    return Qwen3MoEModel(gf, pool)
