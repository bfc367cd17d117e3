"""A numpy reference of the DeepSeek V4 Flash forward pass, one token at a time.

It follows ../shared/specs/dsv4-architecture.md section 2 literally, with every piece of
session state explicit (raw window rows, compressed rows, indexer rows, compressor
frontiers), and is independent of the C code: weights are dequantized with the gguf
package's own dequantizers. It is the oracle for native/deepseek4.c.

Numerics: float32 activations; dense matmuls are dequantized-weight @ float32 activation
(the ds4n kernels do not quantize activations), so parity with the C forward is to
float rounding. The model-defining quantization simulations (FP8 on KV rows, indexer
Hadamard + FP4, F16 rounding of cached rows) are done exactly as the C side does them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from gguf import quants

from ds4d.engine.deepseek4_layout import DS4Layout, DS4Params

NEG = np.float32(-1e30)
f32 = np.float32


# --- numeric primitives -------------------------------------------------------------


def rmsnorm(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    ss = float(np.sum(x.astype(np.float64) ** 2))
    scale = f32(1.0) / np.sqrt(f32(ss / x.size) + f32(eps))
    y = x * f32(scale)
    return y * w if w is not None else y


def f16r(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def _pow2_ceil_log2(y: np.ndarray) -> np.ndarray:
    """2^ceil(log2(y)) for positive float32 y, exactly (frexp, not log2)."""
    m, e = np.frexp(y.astype(np.float32))
    e = np.where(m == 0.5, e - 1, e)
    return np.ldexp(np.float32(1.0), e).astype(np.float32)


def _e4m3_table() -> np.ndarray:
    i = np.arange(127)
    e, m = i >> 3, i & 7
    return np.where(e == 0, m * 2.0**-9, (1 + m / 8) * 2.0 ** (e - 7)).astype(np.float32)


E4M3 = _e4m3_table()
FP4 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32)


def _round_to_table(v: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Nearest table magnitude to |v| (ties: even index), sign kept."""
    a = np.abs(v)
    hi = np.clip(np.searchsorted(table, a), 1, len(table) - 1)
    lo = hi - 1
    dlo, dhi = a - table[lo], table[hi] - a
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    return np.copysign(table[pick], v).astype(np.float32)


def fp8sim(x: np.ndarray, n: int) -> None:
    """In place on x[:n] (blocks of 64): scale to E4M3 range, round, scale back."""
    for b in range(0, n, 64):
        blk = x[b : b + 64]
        amax = max(float(np.max(np.abs(blk))), 1e-4)
        s = _pow2_ceil_log2(np.array([f32(amax) / f32(448.0)]))[0]
        v = np.clip(blk / s, -448, 448).astype(np.float32)
        x[b : b + 64] = _round_to_table(v, E4M3) * s


def fp4sim(x: np.ndarray) -> None:
    for b in range(0, x.size, 32):
        blk = x[b : b + 32]
        amax = max(float(np.max(np.abs(blk))), 7.052966104933725e-38)
        s = _pow2_ceil_log2(np.array([f32(amax) / f32(6.0)]))[0]
        v = np.clip(blk / s, -6, 6).astype(np.float32)
        x[b : b + 32] = _round_to_table(v, FP4) * s


def hadamard(x: np.ndarray) -> np.ndarray:
    n = x.size
    y = x.astype(np.float32).copy()
    h = 1
    while h < n:
        y = y.reshape(-1, 2, h)
        a, b = y[:, 0, :].copy(), y[:, 1, :].copy()
        y[:, 0, :], y[:, 1, :] = a + b, a - b
        y = y.reshape(n)
        h *= 2
    return y * f32(1.0 / math.sqrt(n))


def indexer_qat(x: np.ndarray) -> np.ndarray:
    y = hadamard(x)
    fp4sim(y)
    return y


def sigmoid(x):
    x = np.asarray(x, dtype=np.float32)
    return np.where(x >= 0, 1 / (1 + np.exp(-x)), np.exp(x) / (1 + np.exp(x))).astype(np.float32)


def silu(x):
    return (x * sigmoid(x)).astype(np.float32)


def softplus(x: np.ndarray) -> np.ndarray:
    return np.where(x > 20, x, np.where(x < -20, np.exp(x), np.log1p(np.exp(x)))).astype(np.float32)


def rope_angles(p: DS4Params, pos: int, compressed: bool) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin for the n_rot/2 pairs at pos (YaRN on compressed layers), as float32."""
    half = p.n_rot // 2
    k = np.arange(half, dtype=np.float64)
    base = p.compress_rope_base if compressed else p.rope_base
    theta = pos * base ** (-2.0 * k / p.n_rot)
    if compressed:

        def corr(r):
            return p.n_rot * math.log(p.rope_orig_ctx / (r * 2 * math.pi)) / (2 * math.log(base))

        low = max(0.0, math.floor(corr(p.yarn_beta_fast)))
        high = min(p.n_rot - 1.0, math.ceil(corr(p.yarn_beta_slow)))
        ramp = 1.0 - np.clip((k - low) / max(0.001, high - low), 0.0, 1.0)
        theta = theta / p.rope_scale * (1.0 - ramp) + theta * ramp
    return np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)


def rope_tail(x: np.ndarray, cs: tuple[np.ndarray, np.ndarray], n_rot: int, inverse=False) -> None:
    """In place on the last n_rot dims of each row of x (rows, hd); adjacent pairs."""
    c, s = cs
    if inverse:
        s = -s
    t = x[..., x.shape[-1] - n_rot :]
    x0, x1 = t[..., 0::2].copy(), t[..., 1::2].copy()
    t[..., 0::2] = x0 * c - x1 * s
    t[..., 1::2] = x0 * s + x1 * c


# --- weights and state --------------------------------------------------------------


class Weights:
    """Dequantized float32 weights, (out, in) matrices; experts as (n_expert, out, in)."""

    def __init__(self, layout: DS4Layout) -> None:
        self.layout = layout
        self._cache: dict[str, np.ndarray] = {}

    def __call__(self, name: str) -> np.ndarray:
        w = self._cache.get(name)
        if w is None:
            t = self.layout.tensors[name]
            data = np.asarray(t.data)
            if t.type in (0, 1, 26):  # F32, F16, I32 arrive as typed arrays
                w = data.astype(np.float32) if t.type != 26 else data.astype(np.int64)
            else:
                w = quants.dequantize(data, t.type).astype(np.float32)
            w = w.reshape(tuple(reversed([int(d) for d in t.shape])))
            self._cache[name] = w
        return w

    def has(self, name: str) -> bool:
        return name in self.layout.tensors


@dataclass
class Compressor:
    """Frontier of one compressor: the (coff*r) x W kv/score slots."""

    ratio: int
    width: int
    kv: np.ndarray = field(init=False)
    score: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        rows = 8 if self.ratio == 4 else self.ratio
        self.kv = np.zeros((rows, self.width), np.float32)
        self.score = np.full((rows, self.width), NEG, np.float32)


@dataclass
class LayerState:
    raw: list[np.ndarray] = field(default_factory=list)  # window rows, oldest first
    comp: list[np.ndarray] = field(default_factory=list)
    icomp: list[np.ndarray] = field(default_factory=list)
    attn_c: Compressor | None = None
    index_c: Compressor | None = None


@dataclass
class State:
    layers: list[LayerState]
    tokens: list[int] = field(default_factory=list)


# --- the model ----------------------------------------------------------------------


class DS4Reference:
    def __init__(self, layout: DS4Layout) -> None:
        self.p = layout.params
        self.w = Weights(layout)
        # directional steering: (dirs n_layer x n_embd, attn scale, ffn scale) added to each
        # sublayer's output before the hyper-connection mix; None: none
        self.steer: tuple[np.ndarray, float, float] | None = None

    def steered(self, o, il: int, after_ffn: bool):
        if self.steer is None:
            return o
        dirs, attn_scale, ffn_scale = self.steer
        scale = ffn_scale if after_ffn else attn_scale
        return o + f32(scale) * dirs[il].astype(o.dtype) if scale else o

    def new_state(self) -> State:
        p = self.p
        layers = []
        for il in range(p.n_layer):
            r = p.ratio(il)
            ls = LayerState()
            if r:
                ls.attn_c = Compressor(r, (2 if r == 4 else 1) * p.head_dim)
            if r == 4:
                ls.index_c = Compressor(4, 2 * p.idx_head_dim)
            layers.append(ls)
        return State(layers)

    def step(self, st: State, tok: int) -> np.ndarray:
        """Evaluate one token at pos = len(st.tokens); return the next-token logits."""
        p, w = self.p, self.w
        pos = len(st.tokens)
        X = np.tile(w("token_embd.weight")[tok], (p.n_hc, 1)).astype(np.float32)
        for il in range(p.n_layer):
            X = self.attention(st.layers[il], il, X, pos)
            X = self.ffn(il, X, tok)
        st.tokens.append(tok)
        return self.head(X)

    # hyper-connections
    def hc_pre(self, X, fn, scale, base):
        p = self.p
        n = p.n_hc
        flat = rmsnorm(X.reshape(-1), None, p.rms_eps)
        mix = fn @ flat
        pre = sigmoid(mix[:n] * scale[0] + base[:n]) + f32(p.hc_eps)
        post = 2 * sigmoid(mix[n : 2 * n] * scale[1] + base[n : 2 * n])
        C = (mix[2 * n :] * scale[2] + base[2 * n :]).reshape(n, n).astype(np.float32)
        eps = f32(p.hc_eps)
        C = np.exp(C - C.max(axis=1, keepdims=True))
        C = C / C.sum(axis=1, keepdims=True) + eps
        C = C / (C.sum(axis=0, keepdims=True) + eps)
        for _ in range(p.sinkhorn_iters - 1):
            C = C / (C.sum(axis=1, keepdims=True) + eps)
            C = C / (C.sum(axis=0, keepdims=True) + eps)
        y = (pre[:, None] * X).sum(axis=0).astype(np.float32)
        return y, post.astype(np.float32), C.astype(np.float32)

    @staticmethod
    def hc_post(X, o, post, C):
        return (post[:, None] * o[None, :] + C.T @ X).astype(np.float32)

    def attention(self, ls: LayerState, il: int, X, pos: int):
        p, w = self.p, self.w
        b = f"blk.{il}."
        r = p.ratio(il)
        hd = p.head_dim
        cur, post, C = self.hc_pre(
            X,
            w(b + "hc_attn_fn.weight"),
            w(b + "hc_attn_scale.weight"),
            w(b + "hc_attn_base.weight"),
        )
        xn = rmsnorm(cur, w(b + "attn_norm.weight"), p.rms_eps)
        cs = rope_angles(p, pos, compressed=r != 0)
        qrn = rmsnorm(w(b + "attn_q_a.weight") @ xn, w(b + "attn_q_a_norm.weight"), p.rms_eps)
        q = (w(b + "attn_q_b.weight") @ qrn).reshape(p.n_head, hd)
        q = np.stack([rmsnorm(h, None, p.rms_eps) for h in q])
        rope_tail(q, cs, p.n_rot)
        kv = rmsnorm(w(b + "attn_kv.weight") @ xn, w(b + "attn_kv_a_norm.weight"), p.rms_eps)
        rope_tail(kv, cs, p.n_rot)
        fp8sim(kv, p.n_nope)
        ls.raw.append(f16r(kv))
        if len(ls.raw) > p.window:
            ls.raw.pop(0)
        if r:
            c = self.compress(ls.attn_c, b + "attn_compressor_", xn, pos, hd)
            if c is not None:
                fp8sim(c, p.n_nope)
                ls.comp.append(f16r(c))
        visible = list(range(len(ls.comp)))
        if r == 4:
            c = self.compress(ls.index_c, b + "indexer_compressor_", xn, pos, p.idx_head_dim)
            if c is not None:
                ls.icomp.append(f16r(indexer_qat(c)))
            visible = self.indexer(ls, b, qrn, xn, pos)
        rows = np.array(ls.raw + [ls.comp[i] for i in visible], dtype=np.float32)
        sinks = w(b + "attn_sinks.weight")
        out = np.empty((p.n_head, hd), np.float32)
        inv_sqrt = f32(1.0 / math.sqrt(hd))
        for h in range(p.n_head):
            s = (rows @ q[h]) * inv_sqrt
            m = max(float(sinks[h]), float(s.max()))
            e = np.exp(s - f32(m))
            den = np.exp(f32(sinks[h] - m)) + e.sum(dtype=np.float32)
            out[h] = (e @ rows) / den
        rope_tail(out, cs, p.n_rot, inverse=True)
        hpg = p.n_head // p.o_groups
        wa = w(b + "attn_output_a.weight")
        low = np.concatenate(
            [
                wa[g * p.o_lora_rank : (g + 1) * p.o_lora_rank]
                @ out[g * hpg : (g + 1) * hpg].reshape(-1)
                for g in range(p.o_groups)
            ]
        )
        o = w(b + "attn_output_b.weight") @ low
        return self.hc_post(X, self.steered(o, il, after_ffn=False), post, C)

    def compress(self, cp: Compressor, prefix: str, xn, pos: int, hd: int):
        """One compressor step; returns the pooled, normed, roped row when a block closes."""
        p, w = self.p, self.w
        r = cp.ratio
        kvc = w(prefix + "kv.weight") @ xn
        scc = w(prefix + "gate.weight") @ xn + w(prefix + "ape.weight")[pos % r]
        row = 4 + pos % 4 if r == 4 else pos % r
        cp.kv[row], cp.score[row] = kvc, scc
        if (pos + 1) % r:
            return None
        if r == 4:
            vals = np.concatenate([cp.kv[:4, :hd], cp.kv[4:, hd:]])
            scores = np.concatenate([cp.score[:4, :hd], cp.score[4:, hd:]])
        else:
            vals, scores = cp.kv, cp.score
        m = scores.max(axis=0)
        e = np.exp(scores - m)
        pooled = (e * vals).sum(axis=0) / e.sum(axis=0)
        pooled = np.where(m <= -5e29, 0, pooled).astype(np.float32)
        c = rmsnorm(pooled, w(prefix + "norm.weight"), p.rms_eps)
        rope_tail(c, rope_angles(p, pos + 1 - r, compressed=True), p.n_rot)
        if r == 4:
            cp.kv[:4], cp.score[:4] = cp.kv[4:], cp.score[4:]
        return c

    def indexer(self, ls: LayerState, b: str, qrn, xn, pos: int) -> list[int]:
        p, w = self.p, self.w
        n = len(ls.icomp)
        if n <= p.idx_top_k:
            return list(range(n))
        ihd = p.idx_head_dim
        iq = (w(b + "indexer.attn_q_b.weight") @ qrn).reshape(p.idx_n_head, ihd)
        rope_tail(iq, rope_angles(p, pos, compressed=True), p.n_rot)
        iq = np.stack([indexer_qat(h) for h in iq])
        hw = (w(b + "indexer.proj.weight") @ xn) * f32(1.0 / math.sqrt(ihd * p.idx_n_head))
        K = np.array(ls.icomp, dtype=np.float32)
        score = (np.maximum(iq @ K.T, 0) * hw[:, None]).sum(axis=0)
        order = sorted(range(n), key=lambda c: (-score[c], c))
        return sorted(order[: p.idx_top_k])

    def ffn(self, il: int, X, tok: int):
        p, w = self.p, self.w
        b = f"blk.{il}."
        cur, post, C = self.hc_pre(
            X, w(b + "hc_ffn_fn.weight"), w(b + "hc_ffn_scale.weight"), w(b + "hc_ffn_base.weight")
        )
        xf = rmsnorm(cur, w(b + "ffn_norm.weight"), p.rms_eps)
        probs = np.sqrt(softplus(w(b + "ffn_gate_inp.weight") @ xf))
        if il < p.n_hash_layer:
            sel = [int(e) for e in w(b + "ffn_gate_tid2eid.weight")[tok]]
        else:
            bias = w(b + "exp_probs_b.bias") if self.w.has(b + "exp_probs_b.bias") else 0
            biased = probs + bias
            sel = sorted(range(p.n_expert), key=lambda e: (-biased[e], e))[: p.n_expert_used]
        wts = probs[sel]
        wts = wts / max(float(wts.sum()), 6.103515625e-5) * f32(p.expert_weight_scale)
        clamp = f32(p.swiglu_clamp)
        gate, up, down = (w(b + f"ffn_{k}_exps.weight") for k in ("gate", "up", "down"))
        out = np.zeros(p.n_embd, np.float32)
        for e, wt in zip(sel, wts, strict=True):
            g = np.minimum(gate[e] @ xf, clamp)
            u = np.clip(up[e] @ xf, -clamp, clamp)
            out += down[e] @ (silu(g) * u * f32(wt))
        g = np.minimum(w(b + "ffn_gate_shexp.weight") @ xf, clamp)
        u = np.clip(w(b + "ffn_up_shexp.weight") @ xf, -clamp, clamp)
        out += w(b + "ffn_down_shexp.weight") @ (silu(g) * u)
        return self.hc_post(X, self.steered(out, il, after_ffn=True), post, C)

    def head(self, X):
        p, w = self.p, self.w
        flat = rmsnorm(X.reshape(-1), None, p.rms_eps)
        mix = w("output_hc_fn.weight") @ flat
        wts = sigmoid(mix * w("output_hc_scale.weight")[0] + w("output_hc_base.weight")) + f32(
            p.hc_eps
        )
        h = (wts[:, None] * X).sum(axis=0).astype(np.float32)
        hn = rmsnorm(h, w("output_norm.weight"), p.rms_eps)
        return (w("output.weight") @ hn).astype(np.float32)
