"""A plain numpy forward of the dense decoder families (llama, qwen2, qwen3, gemma3, phi3)
over dequantized GGUF weights — the oracle for their C paths until (and beside) the kit's
transformers references.

Written from the families' definitions, not from our C code, on decoder_ref.py's pieces
(dequantized weights, norms, attention, head), in float64 unless asked (float32 measures
the native path at its own precision). The GGUF metadata is read here again,
independently of the engine's family modules:
  - RoPE: llama's adjacent pairs (NORMAL) or the halves (NEOX, transformers' rotate_half),
    angle pos * base^(-2i/n_rot) / factor_i, linear scaling, phi3's long/short factors
    (long when the session context exceeds the original one) with its attention factor,
    YaRN as transformers computes it;
  - gemma3: embeddings times sqrt(n_embd), norms around attention and FFN, q/k norms,
    GELU (tanh) gate, sliding-window layers (all but every 6th, or the file's pattern) with
    the local base 10000, final logit soft-capping; query scale 1/sqrt(head_dim);
  - qwen2: q/k/v biases; qwen3: q/k head norms; phi3: fused qkv and gate-up tensors.
Used by tests only.
"""

from __future__ import annotations

import math

import numpy as np

from ds4d.engine.gguf_file import GGUFFile
from tests.reference.decoder_ref import DecoderReference, rotate

NEOX = {"qwen2", "qwen3", "gemma3", "phi3"}


class DenseReference(DecoderReference):
    def __init__(self, gf: GGUFFile, n_ctx: int = 4096, dtype: type = np.float64) -> None:
        super().__init__(gf, dtype)
        a, key = self.arch, self.key
        self.base = float(key("rope.freq_base", 10000.0))
        self.neox = a in NEOX
        scaling = str(key("rope.scaling.type", "none"))
        factor = float(key("rope.scaling.factor", 0.0))
        self.freq_scale = 1.0 / factor if scaling == "linear" and factor > 0 else 1.0
        self.yarn = None
        if scaling == "yarn" and factor > 1:
            # transformers' YaRN: a ramp between interpolated and extrapolated rates over the
            # correction range (rounded outward), magnitude 0.1 ln(factor) + 1.
            orig = int(key("rope.scaling.original_context_length"))
            fast = float(key("rope.scaling.yarn_beta_fast", 32.0))
            slow = float(key("rope.scaling.yarn_beta_slow", 1.0))

            def corr_dim(rot: float) -> float:
                return self.n_rot * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(self.base))

            low = max(math.floor(corr_dim(fast)), 0)
            high = min(math.ceil(corr_dim(slow)), self.n_rot - 1)
            if low == high:
                high += 0.001
            ramp = np.clip((np.arange(self.n_rot // 2) - low) / (high - low), 0, 1)
            self.yarn = (factor, 1 - ramp, 0.1 * math.log(factor) + 1)
        self.window = int(key("attention.sliding_window", 0)) if a in ("gemma3", "phi3") else 0
        self.softcap = float(key("final_logit_softcapping", 0.0))
        self.attn_factor = float(key("rope.scaling.attn_factor", 1.0))
        self.factors_name = "rope_freqs.weight"
        if a == "phi3" and gf.has_tensor("rope_factors_long.weight"):
            orig = int(key("rope.scaling.original_context_length", 0))
            self.factors_name = (
                "rope_factors_long.weight" if n_ctx > orig else "rope_factors_short.weight"
            )

    def is_local(self, il: int) -> bool:
        if self.arch == "phi3":
            return self.window > 0
        if self.arch != "gemma3" or self.window <= 0:
            return False
        pattern = int(self.gf.get("gemma3.attention.sliding_window_pattern", 6))
        return il % pattern < pattern - 1

    def rope(self, x: np.ndarray, pos: np.ndarray, base: float, scale: float) -> np.ndarray:
        half = self.n_rot // 2
        inv = base ** (-np.arange(half, dtype=np.float64) * 2 / self.n_rot) * scale
        factors = self.opt(self.factors_name)
        if factors is not None:
            inv = inv / factors.astype(np.float64)
        mag = self.attn_factor
        if self.yarn is not None:
            factor, extrapolate, yarn_mag = self.yarn
            inv = inv / factor * (1 - extrapolate) + inv * extrapolate
            mag *= yarn_mag
        ang = pos[:, None].astype(np.float64) * inv[None, :]
        cos = np.cos(ang)[:, None, :] * mag
        sin = np.sin(ang)[:, None, :] * mag
        return rotate(x, cos, sin, self.n_rot, self.neox)

    def forward(self, tokens: list[int]) -> np.ndarray:
        """Appends tokens to the reference KV; returns logits for every new position."""
        x, pos = self.embed(tokens)
        if self.arch == "gemma3":
            x = x * math.sqrt(self.n_embd)
        for il in range(self.n_layer):
            p = f"blk.{il}."
            q, k, v = self.qkv(p, self.rms_norm(x, self.w(p + "attn_norm.weight")))
            qn, kn = self.opt(p + "attn_q_norm.weight"), self.opt(p + "attn_k_norm.weight")
            if qn is not None:
                q = self.rms_norm(q, qn)
            if kn is not None:
                k = self.rms_norm(k, kn)
            local = self.is_local(il)
            base, scale = self.base, self.freq_scale
            if local and self.arch == "gemma3":  # local layers: own base, never scaled
                base, scale = float(self.gf.get("gemma3.rope.freq_base_swa", 10000.0)), 1.0
            q = self.rope(q, pos, base, scale) / math.sqrt(self.head_dim)
            k = self.rope(k, pos, base, scale)
            o = self.attend(il, p, q, k, v, pos, self.window if local else 0)
            post = self.opt(p + "post_attention_norm.weight")
            if post is not None:
                o = self.rms_norm(o, post)
            x = self.steered(x + o, il, after_ffn=False)
            h = self.rms_norm(x, self.w(p + "ffn_norm.weight"))
            if self.gf.has_tensor(p + "ffn_gate.weight"):
                g = h @ self.w(p + "ffn_gate.weight").T
                u = h @ self.w(p + "ffn_up.weight").T
            else:
                g, u = np.split(h @ self.w(p + "ffn_up.weight").T, 2, axis=1)
            if self.arch == "gemma3":
                c = math.sqrt(2 / math.pi)
                act = 0.5 * g * (1 + np.tanh(c * (g + 0.044715 * g**3)))
            else:
                act = g / (1 + np.exp(-g))
            f = (act * u) @ self.w(p + "ffn_down.weight").T
            post = self.opt(p + "post_ffw_norm.weight")
            if post is not None:
                f = self.rms_norm(f, post)
            x = self.steered(x + f, il, after_ffn=True)
        logits = self.logits(x, len(tokens))
        if self.softcap > 0:
            logits = self.softcap * np.tanh(logits / self.softcap)
        return logits
