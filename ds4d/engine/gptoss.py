"""The gpt-oss model family (GGUF architecture `gpt-oss`: gpt-oss-20b, gpt-oss-120b): GGUF
validation and the ctypes face of native/gptoss.{c,h}.

Attention with q/k/v/o biases, per-head sink logits and a sliding window on the layers the
file's pattern marks (every other layer, starting with the first, by default), half-split
RoPE with YaRN; a mixture-of-experts FFN on every layer: router with bias, top-k of the
logits then softmax over the selected, clamped SwiGLU experts (alpha 1.702, limit 7) with
biases. The session state is decoder.DecoderState.

YaRN: the blend of interpolated and extrapolated rates is computed here as per-pair factors
over an untruncated correction range, as gpt-oss's reference implementation (transformers'
`truncate: false`) does; llama.cpp rounds the range to whole dimensions.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np

from ds4d.engine import native
from ds4d.engine.decoder import ShapeC
from ds4d.engine.errors import ModelLoadError
from ds4d.engine.gguf_file import GGUFFile
from ds4d.engine.moe_decoder import ExpertsC, MoEDecoderModel

FAMILY = "gpt-oss"
SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0  # fixed by the architecture (no GGUF key)

# Slot order of native/gptoss.h (after decoder.SHARED_GLOBAL_SLOTS, its only globals).
LAYER_SLOTS = (
    "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
    "attn_output.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias",
    "attn_sinks.weight", "post_attention_norm.weight", "ffn_gate_inp.weight",
    "ffn_gate_inp.bias", "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight",
    "ffn_gate_exps.bias", "ffn_up_exps.bias", "ffn_down_exps.bias",
)  # fmt: skip


class HParamsC(ctypes.Structure):
    """struct ds4n_gptoss_hparams."""

    _fields_ = [
        ("shape", ShapeC),
        ("experts", ExpertsC),
        ("window", ctypes.c_int32),
        ("sliding", ctypes.POINTER(ctypes.c_uint8)),
        ("rope_factors", ctypes.POINTER(ctypes.c_float)),
        *[(n, ctypes.c_float) for n in ("rope_attn_factor", "swiglu_alpha", "swiglu_limit")],
    ]  # fmt: skip


def sliding_layers(gf: GGUFFile, n_layer: int) -> list[bool]:
    """Which layers use the sliding window: the file's per-layer flags, or its period n
    (layer il slides when il % n < n - 1; 2 by default), as llama.cpp reads them."""
    key = f"{gf.architecture}.attention.sliding_window_pattern"
    pattern = gf.get(key, 2)
    if isinstance(pattern, (list, tuple)):
        if len(pattern) != n_layer:
            raise ModelLoadError(f"{key} has {len(pattern)} entries for {n_layer} layers")
        return [bool(v) for v in pattern]
    n = int(pattern)
    return [n == 0 or il % n < n - 1 for il in range(n_layer)]


def yarn_rates(base: float, n_rot: int, factor: float, orig_ctx: float, beta_fast: float,
               beta_slow: float) -> np.ndarray:  # fmt: skip
    """Angle rate of each rotated pair: extrapolated (base^(-2i/n_rot)) for fast-turning
    pairs, interpolated (divided by factor) for slow ones, a linear blend between."""

    def correction_dim(rotations: float) -> float:
        return n_rot * math.log(orig_ctx / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(correction_dim(beta_fast), 0.0)
    high = min(correction_dim(beta_slow), n_rot - 1.0)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(n_rot // 2) - low) / (high - low), 0.0, 1.0)
    rates = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    freqs: np.ndarray = rates / factor * ramp + rates * (1.0 - ramp)
    return freqs


class GptOssModel(MoEDecoderModel):
    family = FAMILY
    prefix = "gptoss"

    def __init__(self, gf: GGUFFile, pool: native.Pool) -> None:
        super().__init__(gf, pool)
        hp = self.hp
        gating = int(hp("expert_gating_func", 3))
        if gating != 3:
            raise ModelLoadError(
                f"gpt-oss: expert gating function {gating} is not softmax over the selected (3)"
            )
        if bool(hp("expert_weights_norm", False)):
            raise ModelLoadError("gpt-oss: renormalised expert weights are not supported")
        window = int(hp("attention.sliding_window"))
        if window <= 0:
            raise ModelLoadError(f"gpt-oss: sliding window {window} must be positive")
        self.sliding = sliding_layers(gf, self.n_layer)
        sliding = (ctypes.c_uint8 * self.n_layer)(*self.sliding)
        factors, attn_factor = self._rope()
        params = HParamsC(
            self.shape.c_shape(), self.c_experts(), window=window, sliding=sliding,
            rope_factors=None if factors is None else factors.ctypes.data_as(
                ctypes.POINTER(ctypes.c_float)),
            rope_attn_factor=attn_factor, swiglu_alpha=SWIGLU_ALPHA, swiglu_limit=SWIGLU_LIMIT,
        )  # fmt: skip
        # Every tensor is required: the output head is never tied.
        self.open_native(LAYER_SLOTS, self.tensor_shapes(), (), params)

    def _rope(self) -> tuple[np.ndarray | None, float]:
        """The per-pair divisors of the plain rates for the file's YaRN (None without
        scaling) and the factor on cos and sin."""
        hp = self.hp
        scaling = str(hp("rope.scaling.type", "none"))
        if scaling == "none":
            return None, 1.0
        if scaling != "yarn":
            raise ModelLoadError(f"gpt-oss: rope scaling type {scaling!r} is not supported")
        factor = float(hp("rope.scaling.factor"))
        if not factor >= 1.0:
            raise ModelLoadError(f"gpt-oss: YaRN factor {factor} must be at least 1")
        base, n_rot = self.shape.rope_base, self.shape.n_rot
        rates = yarn_rates(
            base, n_rot, factor,
            float(hp("rope.scaling.original_context_length")),
            float(hp("rope.scaling.yarn_beta_fast", 32.0)),
            float(hp("rope.scaling.yarn_beta_slow", 1.0)),
        )  # fmt: skip
        plain = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
        factors = (plain / rates).astype(np.float32)
        return factors, float(hp("rope.scaling.yarn_attn_factor", 0.1 * math.log(factor) + 1.0))


def load(gf: GGUFFile, pool: native.Pool) -> GptOssModel:
    return GptOssModel(gf, pool)
