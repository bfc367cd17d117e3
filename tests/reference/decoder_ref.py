"""What the numpy reference forwards of the attention decoders (dense_ref.py, moe_model_ref.py)
share, written from the textbook definitions and not from our C code: the GGUF's shape read
again from its metadata, weights dequantized with gguf.quants.dequantize (the gguf package's
own decoder, independent of our kernels), RMSNorm, the two RoPE pairings, causal GQA
attention over every layer's K/V with an optional sliding window and per-head sink logits,
and the final norm and output head. Every op runs in `dtype` (float64 unless asked).
Used by tests only.
"""

from __future__ import annotations

import numpy as np
from gguf.quants import dequantize

from ds4d.engine.gguf_file import GGUFFile


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, n_rot: int, neox: bool) -> np.ndarray:
    """The first n_rot dims of each head rotated by the angles whose cos and sin are given
    (positions x heads x n_rot/2, broadcast): NEOX pairs dim i with i + n_rot/2
    (transformers' rotate_half), NORMAL pairs adjacent dims (llama.cpp's llama)."""
    half = n_rot // 2
    out = x.copy()
    if neox:
        x0, x1 = x[..., :half], x[..., half:n_rot]
        out[..., :half] = x0 * cos - x1 * sin
        out[..., half:n_rot] = x0 * sin + x1 * cos
    else:
        x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = x0 * cos - x1 * sin
        out[..., 1:n_rot:2] = x0 * sin + x1 * cos
    return out


class DecoderReference:
    def __init__(self, gf: GGUFFile, dtype: type = np.float64) -> None:
        self.gf = gf
        self.dtype = dtype
        self.arch = gf.architecture
        self.n_layer = int(self.key("block_count"))
        self.n_embd = int(self.key("embedding_length"))
        self.n_head = int(self.key("attention.head_count"))
        self.n_head_kv = int(self.key("attention.head_count_kv", self.n_head))
        self.head_dim = int(self.key("attention.key_length", self.n_embd // self.n_head))
        self.n_rot = int(self.key("rope.dimension_count", self.head_dim))
        self.eps = float(self.key("attention.layer_norm_rms_epsilon"))
        self._cache: dict[str, np.ndarray] = {}
        # directional steering (ds4d/engine/steering.py): (dirs n_layer x n_embd, attn
        # scale, ffn scale) added to the residual stream after each layer's attention and
        # FFN outputs; None: none
        self.steer: tuple[np.ndarray, float, float] | None = None
        self.reset()

    def steered(self, x: np.ndarray, il: int, after_ffn: bool) -> np.ndarray:
        """The residual stream x after layer il's attention (or FFN) output was added,
        plus that step's scale times the layer's steering direction."""
        if self.steer is None:
            return x
        dirs, attn_scale, ffn_scale = self.steer
        scale = ffn_scale if after_ffn else attn_scale
        return x + scale * dirs[il].astype(self.dtype) if scale else x

    def key(self, name: str, default: object = None) -> object:
        """The metadata value `{arch}.{name}`: required unless a default is given."""
        full = f"{self.arch}.{name}"
        return self.gf.require(full) if default is None else self.gf.get(full, default)

    def reset(self) -> None:
        empty = np.zeros((0, self.n_head_kv, self.head_dim), self.dtype)
        self.k = [empty] * self.n_layer
        self.v = [empty] * self.n_layer
        self.n_past = 0

    def w(self, name: str) -> np.ndarray:
        """A tensor dequantized, numpy shape (ne1, ne0) for a matrix."""
        if name not in self._cache:
            raw = self.gf.reader.tensors[self.gf.tensor_names().index(name)]
            self._cache[name] = dequantize(raw.data, raw.tensor_type).astype(self.dtype)
        return self._cache[name]

    def opt(self, name: str) -> np.ndarray | None:
        return self.w(name) if self.gf.has_tensor(name) else None

    def rms_norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * weight

    def embed(self, tokens: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """The embedding rows of the tokens and their positions after the cached ones."""
        pos = np.arange(self.n_past, self.n_past + len(tokens))
        return self.w("token_embd.weight")[np.asarray(tokens)], pos

    def qkv(self, p: str, h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Layer p's q, k, v of the normed rows h (fused attn_qkv or separate tensors, with
        their biases when the file has them), shaped tokens x heads x head_dim."""
        nh, nkv, hd, T = self.n_head, self.n_head_kv, self.head_dim, len(h)
        if self.gf.has_tensor(p + "attn_qkv.weight"):
            qkv = h @ self.w(p + "attn_qkv.weight").T
            q, k, v = np.split(qkv, [nh * hd, nh * hd + nkv * hd], axis=1)
        else:
            q, k, v = (h @ self.w(p + f"attn_{n}.weight").T for n in "qkv")
        for name, arr in (("q", q), ("k", k), ("v", v)):
            b = self.opt(p + f"attn_{name}.bias")
            if b is not None:
                arr += b
        return q.reshape(T, nh, hd), k.reshape(T, nkv, hd), v.reshape(T, nkv, hd)

    def attend(self, il: int, p: str, q: np.ndarray, k: np.ndarray, v: np.ndarray,
               pos: np.ndarray, window: int = 0) -> np.ndarray:  # fmt: skip
        """Appends k, v to layer il's cache; causal GQA of q (already scaled) over it (keys
        within `window` positions when > 0, layer p's sink logits when the file has them),
        through the output projection and its bias: tokens x n_embd."""
        self.k[il] = np.concatenate([self.k[il], k])
        self.v[il] = np.concatenate([self.v[il], v])
        K, V = self.k[il], self.v[il]
        nh, nkv, hd, T = self.n_head, self.n_head_kv, self.head_dim, len(q)
        keys = np.arange(K.shape[0])[None, :]
        masked = keys > pos[:, None]
        if window > 0:
            masked |= keys <= pos[:, None] - window
        sinks = self.opt(p + "attn_sinks.weight")
        out = np.empty((T, nh, hd), self.dtype)
        for hq in range(nh):
            hk = hq // (nh // nkv)
            s = q[:, hq, :] @ K[:, hk, :].T
            s[masked] = -np.inf
            if sinks is not None:  # one more logit per row, whose value is dropped
                s = np.concatenate([s, np.full((T, 1), sinks[hq])], axis=1)
            s = np.exp(s - s.max(axis=1, keepdims=True))
            s /= s.sum(axis=1, keepdims=True)
            out[:, hq, :] = s[:, : K.shape[0]] @ V[:, hk, :]
        o = out.reshape(T, nh * hd) @ self.w(p + "attn_output.weight").T
        bo = self.opt(p + "attn_output.bias")
        return o if bo is None else o + bo

    def logits(self, x: np.ndarray, n_new: int) -> np.ndarray:
        """Counts the n_new positions; the output norm and head of the last residual rows
        (the head tied to the token embedding when the file has no output tensor)."""
        self.n_past += n_new
        x = self.rms_norm(x, self.w("output_norm.weight"))
        head = "output.weight" if self.gf.has_tensor("output.weight") else "token_embd.weight"
        return x @ self.w(head).T
