"""A plain numpy llama forward over dequantized GGUF weights — the oracle for the C path.

Written for clarity, not speed: every matrix is dequantized with gguf.quants.dequantize
(the gguf package's own decoder, independent of our kernels) and every op follows the
textbook definition in float64 unless asked otherwise. Used by tests only.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from ds4d.engine.gguf_file import GGUFFile


class LlamaReference:
    def __init__(self, gf: GGUFFile, dtype: type = np.float64) -> None:
        self.gf = gf
        self.dtype = dtype
        arch = gf.architecture
        self.n_layer = int(gf.require(f"{arch}.block_count"))
        self.n_embd = int(gf.require(f"{arch}.embedding_length"))
        self.n_head = int(gf.require(f"{arch}.attention.head_count"))
        self.n_head_kv = int(gf.get(f"{arch}.attention.head_count_kv", self.n_head))
        self.head_dim = self.n_embd // self.n_head
        self.n_rot = int(gf.get(f"{arch}.rope.dimension_count", self.head_dim))
        self.rope_base = float(gf.get(f"{arch}.rope.freq_base", 10000.0))
        self.eps = float(gf.require(f"{arch}.attention.layer_norm_rms_epsilon"))
        self._cache: dict[str, np.ndarray] = {}
        self.reset()

    def reset(self) -> None:
        self.k = [np.zeros((0, self.n_head_kv, self.head_dim), self.dtype)] * self.n_layer
        self.v = list(self.k)
        self.n_past = 0

    def w(self, name: str) -> np.ndarray:
        """A tensor as a dtype matrix with numpy shape (ne1, ne0)."""
        if name not in self._cache:
            t = self.gf.tensor(name)
            qtype = GGMLQuantizationType(t.type)
            self._cache[name] = dequantize(t.data, qtype).astype(self.dtype)
            assert self._cache[name].shape[-1] == t.shape[0]
        return self._cache[name]

    def opt(self, name: str) -> np.ndarray | None:
        return self.w(name) if self.gf.has_tensor(name) else None

    def rms_norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * weight

    def rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """llama.cpp NORMAL rope: rotate adjacent pairs (x[2i], x[2i+1]) by pos*base^(-2i/n_rot)."""
        half = self.n_rot // 2
        inv_freq = self.rope_base ** (-np.arange(half, dtype=np.float64) * 2 / self.n_rot)
        if self.gf.has_tensor("rope_freqs.weight"):
            inv_freq = inv_freq / self.w("rope_freqs.weight").astype(np.float64)
        ang = positions[:, None].astype(np.float64) * inv_freq[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        out = x.copy()
        x0, x1 = x[..., 0 : self.n_rot : 2], x[..., 1 : self.n_rot : 2]
        out[..., 0 : self.n_rot : 2] = x0 * cos - x1 * sin
        out[..., 1 : self.n_rot : 2] = x0 * sin + x1 * cos
        return out

    def forward(self, tokens: list[int]) -> np.ndarray:
        """Appends tokens to the reference KV; returns logits for every new position."""
        T = len(tokens)
        pos = np.arange(self.n_past, self.n_past + T)
        x = self.w("token_embd.weight")[np.asarray(tokens)]
        hd, nh, nkv = self.head_dim, self.n_head, self.n_head_kv
        for il in range(self.n_layer):
            p = f"blk.{il}."
            h = self.rms_norm(x, self.w(p + "attn_norm.weight"))
            q = h @ self.w(p + "attn_q.weight").T
            k = h @ self.w(p + "attn_k.weight").T
            v = h @ self.w(p + "attn_v.weight").T
            for name, arr in (("attn_q.bias", q), ("attn_k.bias", k), ("attn_v.bias", v)):
                b = self.opt(p + name)
                if b is not None:
                    arr += b
            q = self.rope(q.reshape(T, nh, hd), pos)
            k = self.rope(k.reshape(T, nkv, hd), pos)
            v = v.reshape(T, nkv, hd)
            self.k[il] = np.concatenate([self.k[il], k])
            self.v[il] = np.concatenate([self.v[il], v])
            K, V = self.k[il], self.v[il]
            n_kv = K.shape[0]
            mask = np.arange(n_kv)[None, :] > pos[:, None]  # causal
            out = np.empty((T, nh, hd), self.dtype)
            for hq in range(nh):
                hk = hq // (nh // nkv)
                s = q[:, hq, :] @ K[:, hk, :].T / np.sqrt(hd)
                s[mask] = -np.inf
                s = s - s.max(axis=1, keepdims=True)
                pr = np.exp(s)
                pr /= pr.sum(axis=1, keepdims=True)
                out[:, hq, :] = pr @ V[:, hk, :]
            o = out.reshape(T, nh * hd) @ self.w(p + "attn_output.weight").T
            x = x + o
            h = self.rms_norm(x, self.w(p + "ffn_norm.weight"))
            g = h @ self.w(p + "ffn_gate.weight").T
            u = h @ self.w(p + "ffn_up.weight").T
            x = x + (g / (1 + np.exp(-g)) * u) @ self.w(p + "ffn_down.weight").T
        self.n_past += T
        x = self.rms_norm(x, self.w("output_norm.weight"))
        head = "output.weight" if self.gf.has_tensor("output.weight") else "token_embd.weight"
        return x @ self.w(head).T
