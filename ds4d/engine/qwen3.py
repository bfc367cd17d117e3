"""The qwen3 model family (Qwen 3 dense): the llama layer with NEOX RoPE and a per-head
RMSNorm of q and k before it."""

from __future__ import annotations

from ds4d.engine import native
from ds4d.engine.gguf_file import GGUFFile
from ds4d.engine.llama import LlamaModel

FAMILY = "qwen3"


class Qwen3Model(LlamaModel):
    family = FAMILY
    rope_neox = True
    required = frozenset({"attn_q_norm.weight", "attn_k_norm.weight"})


def load(gf: GGUFFile, pool: native.Pool) -> Qwen3Model:
    return Qwen3Model(gf, pool)
