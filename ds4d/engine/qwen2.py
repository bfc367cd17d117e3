"""The qwen2 model family (Qwen 2 / 2.5, Qwen2.5-Coder, QwQ): the llama layer with NEOX
RoPE; its q/k/v biases are the llama layer's optional biases."""

from __future__ import annotations

from ds4d.engine import native
from ds4d.engine.gguf_file import GGUFFile
from ds4d.engine.llama import LlamaModel

FAMILY = "qwen2"


class Qwen2Model(LlamaModel):
    family = FAMILY
    rope_neox = True


def load(gf: GGUFFile, pool: native.Pool) -> Qwen2Model:
    return Qwen2Model(gf, pool)
