"""The gemma3 model family (Gemma 3 text): GGUF validation and the ctypes face of
native/gemma3.{c,h}.

Read as llama.cpp reads it: local (sliding-window) layers in the file's pattern (every
`attention.sliding_window_pattern`-th layer is global, 6 when absent) with their own RoPE
base (`rope.freq_base_swa`, 10000 when absent), the query scale from `attention.scale`
(else 1/sqrt(head_dim), or 1/sqrt(n_embd/n_head) for the 62-layer 27B), final logit
soft-capping when declared. The converter has already added Gemma's +1 to the norm weights.
"""

from __future__ import annotations

import ctypes
import math

from ds4d.engine import native
from ds4d.engine.decoder import DecoderModel, DenseShape, RopeScaling, ShapeC
from ds4d.engine.errors import ModelLoadError
from ds4d.engine.gguf_file import GGUFFile

FAMILY = "gemma3"

# Slot order of native/gemma3.h (after decoder.SHARED_GLOBAL_SLOTS, its only globals).
LAYER_SLOTS = (
    "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
    "attn_output.weight", "attn_q_norm.weight", "attn_k_norm.weight",
    "post_attention_norm.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight",
    "ffn_down.weight", "post_ffw_norm.weight",
)  # fmt: skip
OPTIONAL = {"output.weight"}
DEFAULT_SWA_PATTERN = 6
DEFAULT_LOCAL_BASE = 10000.0


class HParamsC(ctypes.Structure):
    """struct ds4n_gemma3_hparams."""

    _fields_ = [
        ("shape", ShapeC),
        *[(n, ctypes.c_float) for n in ("rope_scale", "rope_base_local", "q_scale", "softcap")],
        ("window", ctypes.c_int32),
        ("swa_pattern", ctypes.c_int32),
        ("bidirectional", ctypes.c_int32),
    ]  # fmt: skip


class Gemma3Model(DecoderModel):
    family = FAMILY
    prefix = "gemma3"
    # Causal attention; EmbeddingGemma's subclass (gemma_embedding.py) attends both ways.
    encoder = False

    def __init__(self, gf: GGUFFile, pool: native.Pool) -> None:
        sh = DenseShape(gf, self.family)
        super().__init__(gf, pool, sh)
        hp = sh.hp
        scaling = RopeScaling(hp, sh.n_ctx_train, ("none", "linear"))
        window = int(hp("attention.sliding_window", 0))
        pattern = gf.get(f"{gf.architecture}.attention.sliding_window_pattern",
                         DEFAULT_SWA_PATTERN)  # fmt: skip
        if isinstance(pattern, (list, tuple)):
            raise ModelLoadError(
                f"{self.family}: a per-layer sliding_window_pattern is not supported"
            )
        pattern = int(pattern)
        base_local = float(hp("rope.freq_base_swa", DEFAULT_LOCAL_BASE))
        softcap = float(hp("final_logit_softcapping", 0.0))
        if hp.has("attention.scale"):
            q_scale = float(hp("attention.scale"))
        elif sh.n_layer == 62:  # Gemma 3 27B scales by the model width per head
            q_scale = 1.0 / math.sqrt(sh.n_embd // sh.n_head)
        else:
            q_scale = 1.0 / math.sqrt(sh.head_dim)
        if window < 0 or pattern <= 0 or softcap < 0 or base_local <= 0:
            raise ModelLoadError(
                f"unsupported {self.family} attention: window {window}, pattern {pattern},"
                f" local rope base {base_local}, soft-cap {softcap}"
            )
        if self.encoder and window > 0:
            # The file's window W spans both sides: a key at most W // 2 positions away, as
            # transformers (a distance below W // 2 + 1) and llama.cpp (symmetric) read it;
            # the native window is "a distance below it".
            window = window // 2 + 1
        params = HParamsC(
            sh.c_shape(), rope_scale=scaling.freq_scale, rope_base_local=base_local,
            q_scale=q_scale, softcap=softcap, window=window, swa_pattern=pattern,
            bidirectional=int(self.encoder),
        )  # fmt: skip
        self.open_native(LAYER_SLOTS, sh.tensor_shapes(), OPTIONAL, params)


def load(gf: GGUFFile, pool: native.Pool) -> Gemma3Model:
    return Gemma3Model(gf, pool)
