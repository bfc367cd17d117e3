"""numpy float64 forwards of the MoE families over dequantized GGUF weights — the oracle for
native/qwen3moe.c and native/gptoss.c, written from the transformers models (Qwen3-MoE:
per-head q/k RMSNorm, half-split RoPE, softmax top-k router; gpt-oss: q/k/v/o biases,
per-head attention sinks, sliding-window layers on even indices, YaRN without a truncated
correction range, router bias, clamped SwiGLU experts with biases). Qwen3-MoE's optional
YaRN truncates its correction range (transformers' default)."""

from __future__ import annotations

import math

import numpy as np
from gguf.quants import dequantize

from ds4d.engine.gguf_file import GGUFFile
from tests.reference import moe_ref


class MoEModelReference:
    def __init__(self, gf: GGUFFile) -> None:
        self.gf = gf
        arch = self.arch = gf.architecture
        self.oss = arch == "gpt-oss"

        def key(name: str, default: object = None) -> object:
            full = f"{arch}.{name}"
            return gf.require(full) if default is None else gf.get(full, default)

        self.n_layer = int(key("block_count"))
        self.n_embd = int(key("embedding_length"))
        self.n_head = int(key("attention.head_count"))
        self.n_head_kv = int(key("attention.head_count_kv"))
        self.head_dim = int(key("attention.key_length", self.n_embd // self.n_head))
        self.n_rot = int(key("rope.dimension_count", self.head_dim))
        self.eps = float(key("attention.layer_norm_rms_epsilon"))
        self.n_used = int(key("expert_used_count"))
        self.window = int(key("attention.sliding_window", 0)) if self.oss else 0
        self.norm_w = bool(key("expert_weights_norm", not self.oss))
        self.inv_freq, self.mscale = self._rope(float(key("rope.freq_base", 10000.0)), key)
        self._cache: dict[str, np.ndarray] = {}
        self.reset()

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

    def reset(self) -> None:
        empty = np.zeros((0, self.n_head_kv, self.head_dim))
        self.k = [empty] * self.n_layer
        self.v = [empty] * self.n_layer
        self.n_past = 0

    def w(self, name: str) -> np.ndarray:
        if name not in self._cache:
            raw = self.gf.reader.tensors[self.gf.tensor_names().index(name)]
            self._cache[name] = dequantize(raw.data, raw.tensor_type).astype(np.float64)
        return self._cache[name]

    def opt(self, name: str) -> np.ndarray | None:
        return self.w(name) if self.gf.has_tensor(name) else None

    def rms(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * weight

    def rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Half-split (NEOX) rotation of the first n_rot dims of each head."""
        half = self.n_rot // 2
        ang = pos[:, None].astype(np.float64) * self.inv_freq[None, :]
        cos = (np.cos(ang) * self.mscale)[:, None, :]
        sin = (np.sin(ang) * self.mscale)[:, None, :]
        out = x.copy()
        x0, x1 = x[..., :half], x[..., half : self.n_rot]
        out[..., :half] = x0 * cos - x1 * sin
        out[..., half : self.n_rot] = x1 * cos + x0 * sin
        return out

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
        T = len(tokens)
        pos = np.arange(self.n_past, self.n_past + T)
        x = self.w("token_embd.weight")[np.asarray(tokens)]
        hd, nh, nkv = self.head_dim, self.n_head, self.n_head_kv
        for il in range(self.n_layer):
            p = f"blk.{il}."
            h = self.rms(x, self.w(p + "attn_norm.weight"))
            q, k, v = (h @ self.w(p + f"attn_{n}.weight").T for n in "qkv")
            for name, arr in (("q", q), ("k", k), ("v", v)):
                b = self.opt(p + f"attn_{name}.bias")
                if b is not None:
                    arr += b
            q, k, v = q.reshape(T, nh, hd), k.reshape(T, nkv, hd), v.reshape(T, nkv, hd)
            if not self.oss:
                q = self.rms(q, self.w(p + "attn_q_norm.weight"))
                k = self.rms(k, self.w(p + "attn_k_norm.weight"))
            q, k = self.rope(q, pos), self.rope(k, pos)
            K = self.k[il] = np.concatenate([self.k[il], k])
            V = self.v[il] = np.concatenate([self.v[il], v])
            keys = np.arange(K.shape[0])
            masked = keys[None, :] > pos[:, None]
            if self.oss and il % 2 == 0 and self.window:
                masked |= keys[None, :] <= pos[:, None] - self.window
            sinks = self.opt(p + "attn_sinks.weight")
            out = np.empty((T, nh, hd))
            for hq in range(nh):
                hk = hq // (nh // nkv)
                s = q[:, hq, :] @ K[:, hk, :].T / math.sqrt(hd)
                s[masked] = -np.inf
                if sinks is not None:
                    s = np.concatenate([s, np.full((T, 1), sinks[hq])], axis=1)
                s = np.exp(s - s.max(axis=1, keepdims=True))
                s /= s.sum(axis=1, keepdims=True)
                out[:, hq, :] = s[:, : K.shape[0]] @ V[:, hk, :]
            o = out.reshape(T, nh * hd) @ self.w(p + "attn_output.weight").T
            bo = self.opt(p + "attn_output.bias")
            x = x + (o if bo is None else o + bo)
            norm = "post_attention_norm" if self.oss else "ffn_norm"
            x = x + self.moe(p, self.rms(x, self.w(p + f"{norm}.weight")))
        self.n_past += T
        x = self.rms(x, self.w("output_norm.weight"))
        head = "output.weight" if self.gf.has_tensor("output.weight") else "token_embd.weight"
        return x @ self.w(head).T
