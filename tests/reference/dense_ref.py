"""A plain numpy forward of the dense decoder families (llama, qwen2, qwen3, gemma3, phi3)
over dequantized GGUF weights — the oracle for their C paths until (and beside) the kit's
transformers references.

Written from the families' definitions, not from our C code: every matrix is dequantized
with gguf.quants.dequantize, every op is the textbook one in float64. The GGUF metadata is
read here again, independently of the engine's family modules:
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
from gguf.quants import dequantize

from ds4d.engine.gguf_file import GGUFFile

NEOX = {"qwen2", "qwen3", "gemma3", "phi3"}


class DenseReference:
    def __init__(self, gf: GGUFFile, n_ctx: int = 4096) -> None:
        self.gf = gf
        a = self.arch = gf.architecture
        self.n_layer = int(gf.require(f"{a}.block_count"))
        self.n_embd = int(gf.require(f"{a}.embedding_length"))
        self.n_head = int(gf.require(f"{a}.attention.head_count"))
        self.n_head_kv = int(gf.get(f"{a}.attention.head_count_kv", self.n_head))
        self.head_dim = int(gf.get(f"{a}.attention.key_length", self.n_embd // self.n_head))
        self.n_rot = int(gf.get(f"{a}.rope.dimension_count", self.head_dim))
        self.base = float(gf.get(f"{a}.rope.freq_base", 10000.0))
        self.eps = float(gf.require(f"{a}.attention.layer_norm_rms_epsilon"))
        self.neox = a in NEOX
        scaling = str(gf.get(f"{a}.rope.scaling.type", "none"))
        factor = float(gf.get(f"{a}.rope.scaling.factor", 0.0))
        self.freq_scale = 1.0 / factor if scaling == "linear" and factor > 0 else 1.0
        self.yarn = None
        if scaling == "yarn" and factor > 1:
            # transformers' YaRN: a ramp between interpolated and extrapolated rates over the
            # correction range (rounded outward), magnitude 0.1 ln(factor) + 1.
            orig = int(gf.require(f"{a}.rope.scaling.original_context_length"))
            fast = float(gf.get(f"{a}.rope.scaling.yarn_beta_fast", 32.0))
            slow = float(gf.get(f"{a}.rope.scaling.yarn_beta_slow", 1.0))

            def corr_dim(rot: float) -> float:
                return self.n_rot * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(self.base))

            low = max(math.floor(corr_dim(fast)), 0)
            high = min(math.ceil(corr_dim(slow)), self.n_rot - 1)
            if low == high:
                high += 0.001
            ramp = np.clip((np.arange(self.n_rot // 2) - low) / (high - low), 0, 1)
            self.yarn = (factor, 1 - ramp, 0.1 * math.log(factor) + 1)
        self.window = int(gf.get(f"{a}.attention.sliding_window", 0)) if a == "gemma3" else 0
        if a == "phi3":
            self.window = int(gf.get(f"{a}.attention.sliding_window", 0))
        self.softcap = float(gf.get(f"{a}.final_logit_softcapping", 0.0))
        self.attn_factor = float(gf.get(f"{a}.rope.scaling.attn_factor", 1.0))
        self.factors_name = "rope_freqs.weight"
        if a == "phi3" and gf.has_tensor("rope_factors_long.weight"):
            orig = int(gf.get(f"{a}.rope.scaling.original_context_length", 0))
            self.factors_name = (
                "rope_factors_long.weight" if n_ctx > orig else "rope_factors_short.weight"
            )
        self._cache: dict[str, np.ndarray] = {}
        self.reset()

    def reset(self) -> None:
        self.k = [np.zeros((0, self.n_head_kv, self.head_dim))] * self.n_layer
        self.v = list(self.k)
        self.n_past = 0

    def w(self, name: str) -> np.ndarray:
        if name not in self._cache:
            raw = self.gf.reader.tensors[self.gf.tensor_names().index(name)]
            self._cache[name] = dequantize(raw.data, raw.tensor_type).astype(np.float64)
        return self._cache[name]

    def opt(self, name: str) -> np.ndarray | None:
        return self.w(name) if self.gf.has_tensor(name) else None

    def rms_norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * weight

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
            inv = inv / factors
        mag = self.attn_factor
        if self.yarn is not None:
            factor, extrapolate, yarn_mag = self.yarn
            inv = inv / factor * (1 - extrapolate) + inv * extrapolate
            mag *= yarn_mag
        ang = pos[:, None].astype(np.float64) * inv[None, :]
        cos = np.cos(ang)[:, None, :] * mag
        sin = np.sin(ang)[:, None, :] * mag
        out = x.copy()
        if self.neox:
            x0, x1 = x[..., :half], x[..., half : self.n_rot]
            out[..., :half] = x0 * cos - x1 * sin
            out[..., half : self.n_rot] = x0 * sin + x1 * cos
        else:
            x0, x1 = x[..., 0 : self.n_rot : 2], x[..., 1 : self.n_rot : 2]
            out[..., 0 : self.n_rot : 2] = x0 * cos - x1 * sin
            out[..., 1 : self.n_rot : 2] = x0 * sin + x1 * cos
        return out

    def forward(self, tokens: list[int]) -> np.ndarray:
        """Appends tokens to the reference KV; returns logits for every new position."""
        T = len(tokens)
        pos = np.arange(self.n_past, self.n_past + T)
        x = self.w("token_embd.weight")[np.asarray(tokens)]
        if self.arch == "gemma3":
            x = x * math.sqrt(self.n_embd)
        hd, nh, nkv = self.head_dim, self.n_head, self.n_head_kv
        for il in range(self.n_layer):
            p = f"blk.{il}."
            h = self.rms_norm(x, self.w(p + "attn_norm.weight"))
            if self.gf.has_tensor(p + "attn_qkv.weight"):
                qkv = h @ self.w(p + "attn_qkv.weight").T
                q, k, v = np.split(qkv, [nh * hd, nh * hd + nkv * hd], axis=1)
            else:
                q = h @ self.w(p + "attn_q.weight").T
                k = h @ self.w(p + "attn_k.weight").T
                v = h @ self.w(p + "attn_v.weight").T
            for name, arr in (("attn_q.bias", q), ("attn_k.bias", k), ("attn_v.bias", v)):
                b = self.opt(p + name)
                if b is not None:
                    arr += b
            q, k, v = q.reshape(T, nh, hd), k.reshape(T, nkv, hd), v.reshape(T, nkv, hd)
            qn, kn = self.opt(p + "attn_q_norm.weight"), self.opt(p + "attn_k_norm.weight")
            if qn is not None:
                q = self.rms_norm(q, qn)
            if kn is not None:
                k = self.rms_norm(k, kn)
            local = self.is_local(il)
            base, scale = self.base, self.freq_scale
            if local and self.arch == "gemma3":  # local layers: own base, never scaled
                base, scale = float(self.gf.get("gemma3.rope.freq_base_swa", 10000.0)), 1.0
            q = self.rope(q, pos, base, scale) / math.sqrt(hd)
            k = self.rope(k, pos, base, scale)
            self.k[il] = np.concatenate([self.k[il], k])
            self.v[il] = np.concatenate([self.v[il], v])
            K, V = self.k[il], self.v[il]
            keys = np.arange(K.shape[0])[None, :]
            mask = keys > pos[:, None]
            if local:
                mask |= keys <= pos[:, None] - self.window
            out = np.empty((T, nh, hd))
            for hq in range(nh):
                hk = hq // (nh // nkv)
                s = q[:, hq, :] @ K[:, hk, :].T
                s[mask] = -np.inf
                s = s - s.max(axis=1, keepdims=True)
                pr = np.exp(s)
                pr /= pr.sum(axis=1, keepdims=True)
                out[:, hq, :] = pr @ V[:, hk, :]
            o = out.reshape(T, nh * hd) @ self.w(p + "attn_output.weight").T
            bo = self.opt(p + "attn_output.bias")
            if bo is not None:
                o = o + bo
            post = self.opt(p + "post_attention_norm.weight")
            if post is not None:
                o = self.rms_norm(o, post)
            x = x + o
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
            x = x + f
        self.n_past += T
        x = self.rms_norm(x, self.w("output_norm.weight"))
        head = "output.weight" if self.gf.has_tensor("output.weight") else "token_embd.weight"
        logits = x @ self.w(head).T
        if self.softcap > 0:
            logits = self.softcap * np.tanh(logits / self.softcap)
        return logits
