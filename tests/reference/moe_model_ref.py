"""numpy float64 forwards of the MoE families over dequantized GGUF weights — the oracle for
native/qwen3moe.c and native/gptoss.c, written from the transformers models (Qwen3-MoE:
per-head q/k RMSNorm, half-split RoPE, softmax top-k router; gpt-oss: q/k/v/o biases,
per-head attention sinks, sliding-window layers on even indices, YaRN without a truncated
correction range, router bias, clamped SwiGLU experts with biases). Qwen3-MoE's optional
YaRN truncates its correction range (transformers' default). Built on decoder_ref.py's
pieces (dequantized weights, norms, attention with sinks and windows, head)."""

from __future__ import annotations

import math

import numpy as np

from ds4d.engine.gguf_file import GGUFFile
from tests.reference import moe_ref
from tests.reference.decoder_ref import DecoderReference, rotate


class MoEModelReference(DecoderReference):
    def __init__(self, gf: GGUFFile) -> None:
        super().__init__(gf)
        self.oss = self.arch == "gpt-oss"
        key = self.key
        self.n_used = int(key("expert_used_count"))
        self.window = int(key("attention.sliding_window", 0)) if self.oss else 0
        self.norm_w = bool(key("expert_weights_norm", not self.oss))
        self.inv_freq, self.mscale = self._rope(float(key("rope.freq_base", 10000.0)), key)

    def _rope(self, base: float, key) -> tuple[np.ndarray, float]:
        dim = self.n_rot
        inv = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
        if str(key("rope.scaling.type", "none")) != "yarn":
            return inv, 1.0
        factor = float(key("rope.scaling.factor"))
        orig = float(key("rope.scaling.original_context_length"))
        fast = float(key("rope.scaling.yarn_beta_fast", 32.0))
        slow = float(key("rope.scaling.yarn_beta_slow", 1.0))

        def corr(rot: float) -> float:
            return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

        low, high = corr(fast), corr(slow)
        if not self.oss:  # Qwen's YaRN truncates the range to whole dimensions; gpt-oss's not
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0.0), min(high, dim - 1.0)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0.0, 1.0)
        extrapolated = 1.0 - ramp
        inv = inv / factor * (1.0 - extrapolated) + inv * extrapolated
        mscale = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
        return inv, float(key("rope.scaling.yarn_attn_factor", mscale))

    def rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Half-split (NEOX) rotation of the first n_rot dims of each head."""
        ang = pos[:, None].astype(np.float64) * self.inv_freq[None, :]
        cos = (np.cos(ang) * self.mscale)[:, None, :]
        sin = (np.sin(ang) * self.mscale)[:, None, :]
        return rotate(x, cos, sin, self.n_rot, neox=True)

    def moe(self, p: str, h: np.ndarray) -> np.ndarray:
        weights = moe_ref.MoEWeights(
            router=self.w(p + "ffn_gate_inp.weight"), gate=self.w(p + "ffn_gate_exps.weight"),
            up=self.w(p + "ffn_up_exps.weight"), down=self.w(p + "ffn_down_exps.weight"),
            router_bias=self.opt(p + "ffn_gate_inp.bias"),
            gate_bias=self.opt(p + "ffn_gate_exps.bias"), up_bias=self.opt(p + "ffn_up_exps.bias"),
            down_bias=self.opt(p + "ffn_down_exps.bias"),
        )  # fmt: skip
        if self.oss:
            return moe_ref.forward(weights, h, self.n_used, moe_ref.SOFTMAX_WEIGHT, self.norm_w,
                                   moe_ref.SWIGLU_OAI)  # fmt: skip
        return moe_ref.forward(weights, h, self.n_used, moe_ref.SOFTMAX, self.norm_w)

    def forward(self, tokens: list[int]) -> np.ndarray:
        """Appends tokens to the reference KV; returns logits for every new position."""
        x, pos = self.embed(tokens)
        for il in range(self.n_layer):
            p = f"blk.{il}."
            q, k, v = self.qkv(p, self.rms_norm(x, self.w(p + "attn_norm.weight")))
            if not self.oss:
                q = self.rms_norm(q, self.w(p + "attn_q_norm.weight"))
                k = self.rms_norm(k, self.w(p + "attn_k_norm.weight"))
            q, k = self.rope(q, pos) / math.sqrt(self.head_dim), self.rope(k, pos)
            window = self.window if self.oss and il % 2 == 0 else 0
            x = self.steered(x + self.attend(il, p, q, k, v, pos, window), il, after_ffn=False)
            norm = "post_attention_norm" if self.oss else "ffn_norm"
            f = self.moe(p, self.rms_norm(x, self.w(p + f"{norm}.weight")))
            x = self.steered(x + f, il, after_ffn=True)
        return self.logits(x, len(tokens))
