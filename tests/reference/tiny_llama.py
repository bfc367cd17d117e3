"""Writes tiny random llama GGUFs with gguf.GGUFWriter, for tests of paths the embedded
model does not take (biases, an untied output head, rope factors, other quant types) and
for malformed files (unsupported architecture or quant type, wrong shapes, missing parts).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter

from tests.reference.tiny_gguf import TinyGGUF

N_VOCAB, N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_LAYER = 96, 64, 4, 2, 96, 2


def write_tiny_llama(
    path: Path,
    *,
    arch: str = "llama",
    matrix_type: Q = Q.Q8_0,
    embd_type: Q = Q.Q4_0,
    biases: bool = False,
    untied_output: bool = False,
    rope_freqs: bool = False,
    override_type: dict[str, Q] | None = None,
    override_shape: dict[str, tuple[int, ...]] | None = None,
    drop: tuple[str, ...] = (),
    seed: int = 0,
    extra: Callable[[GGUFWriter], None] | None = None,
) -> Path:
    """A 2-layer llama (GQA 2, head_dim 16) with random weights. Shapes are numpy order
    (rows, row length); override_type names a tensor to store in another type (raw
    random bytes when gguf cannot quantize it). `extra` may add metadata (a tokenizer)."""
    t = TinyGGUF(path, arch, seed=seed, drop=drop, override_shape=override_shape,
                 override_type=override_type)  # fmt: skip
    w, add, rng = t.writer, t.add, t.rng
    hd = N_EMBD // N_HEAD
    w.add_block_count(N_LAYER)
    w.add_context_length(256)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(N_VOCAB)
    w.add_rope_dimension_count(hd)
    if extra is not None:
        extra(w)

    add("token_embd.weight", (N_VOCAB, N_EMBD), embd_type, 1.0)
    add("output_norm.weight", (N_EMBD,), Q.F32)
    if untied_output:
        add("output.weight", (N_VOCAB, N_EMBD), matrix_type)
    if rope_freqs:
        w.add_tensor("rope_freqs.weight", (1.0 + rng.random(hd // 2)).astype(np.float32))
    for il in range(N_LAYER):
        p = f"blk.{il}."
        add(p + "attn_norm.weight", (N_EMBD,), Q.F32)
        add(p + "attn_q.weight", (N_HEAD * hd, N_EMBD), matrix_type)
        add(p + "attn_k.weight", (N_HEAD_KV * hd, N_EMBD), matrix_type)
        add(p + "attn_v.weight", (N_HEAD_KV * hd, N_EMBD), matrix_type)
        add(p + "attn_output.weight", (N_EMBD, N_HEAD * hd), matrix_type)
        if biases:
            add(p + "attn_q.bias", (N_HEAD * hd,), Q.F32)
            add(p + "attn_k.bias", (N_HEAD_KV * hd,), Q.F32)
            add(p + "attn_v.bias", (N_HEAD_KV * hd,), Q.F32)
        add(p + "ffn_norm.weight", (N_EMBD,), Q.F16)
        add(p + "ffn_gate.weight", (N_FF, N_EMBD), matrix_type)
        add(p + "ffn_up.weight", (N_FF, N_EMBD), matrix_type)
        add(p + "ffn_down.weight", (N_EMBD, N_FF), matrix_type)
    return t.close()
