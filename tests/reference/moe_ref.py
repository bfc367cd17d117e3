"""numpy float64 reference of the mixture-of-experts FFN (gating and gated experts), written
from the transformers formulas (Qwen3-MoE's router and experts, gpt-oss's router and clamped
SwiGLU), for checking native/moe.c and the MoE families."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SOFTMAX, SIGMOID, SOFTMAX_WEIGHT = 1, 2, 3
SWIGLU, SWIGLU_OAI = 0, 1


def _softmax(v: np.ndarray) -> np.ndarray:
    e = np.exp(v - v.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def route(logits: np.ndarray, k: int, gating: int, norm: bool, scale: float = 0.0):
    """ids (T x k, best first, ties to the lower id) and weights, in float64."""
    logits = np.asarray(logits, np.float64)
    if gating == SOFTMAX:
        probs = _softmax(logits)
    elif gating == SIGMOID:
        probs = _sigmoid(logits)
    else:
        probs = logits
    ids = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    weights = np.take_along_axis(probs, ids, axis=1)
    if gating == SOFTMAX_WEIGHT:
        weights = _softmax(weights)
    if norm:
        weights = weights / np.maximum(weights.sum(axis=1, keepdims=True), 6.103515625e-5)
    if scale not in (0.0, 1.0):
        weights = weights * scale
    return ids, weights


def _sigmoid(v: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * v))  # no overflow for large |v|


def activation(g: np.ndarray, u: np.ndarray, kind: int, alpha: float, limit: float):
    if kind == SWIGLU:
        return g * _sigmoid(g) * u
    g = np.minimum(g, limit)
    u = np.clip(u, -limit, limit)
    return g * _sigmoid(alpha * g) * (u + 1.0)


@dataclass
class MoEWeights:
    """Dequantized float64 weights: router (n_expert x E), gate/up (n x F x E),
    down (n x E x F); biases may be None."""

    router: np.ndarray
    gate: np.ndarray
    up: np.ndarray
    down: np.ndarray
    router_bias: np.ndarray | None = None
    gate_bias: np.ndarray | None = None
    up_bias: np.ndarray | None = None
    down_bias: np.ndarray | None = None


def forward(w: MoEWeights, x: np.ndarray, k: int, gating: int, norm: bool,
            act: int = SWIGLU, scale: float = 0.0, alpha: float = 1.702,
            limit: float = 7.0) -> np.ndarray:  # fmt: skip
    """The MoE FFN of x (T x E), without the residual, token by token over the chosen experts."""
    x = np.asarray(x, np.float64)
    logits = x @ w.router.T
    if w.router_bias is not None:
        logits = logits + w.router_bias
    ids, weights = route(logits, k, gating, norm, scale)
    out = np.zeros_like(x)
    for t in range(len(x)):
        for j in range(k):
            e = ids[t, j]
            g = w.gate[e] @ x[t] + (w.gate_bias[e] if w.gate_bias is not None else 0.0)
            u = w.up[e] @ x[t] + (w.up_bias[e] if w.up_bias is not None else 0.0)
            y = w.down[e] @ activation(g, u, act, alpha, limit)
            if w.down_bias is not None:
                y = y + w.down_bias[e]
            out[t] += weights[t, j] * y
    return out
