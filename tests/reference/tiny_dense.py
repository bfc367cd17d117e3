"""Writes tiny random GGUFs of the dense families (llama, qwen2, qwen3, gemma3, phi3) with
gguf.GGUFWriter, in the tensor names and metadata keys llama.cpp's converter writes, for the
forward tests against tests/reference/dense_ref.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q

from tests.reference.tiny_gguf import TinyGGUF

N_VOCAB, N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_LAYER = 96, 64, 4, 2, 96, 2


def write_tiny(
    path: Path,
    arch: str,
    *,
    matrix_type: Q = Q.F16,
    head_dim: int = 16,
    n_layer: int = N_LAYER,
    window: int = 0,
    softcap: float = 0.0,
    rope_factors: bool = False,
    linear_scale: float = 0.0,
    yarn_factor: float = 0.0,
    biases: bool = False,
    untied_output: bool = True,
    override_shape: dict[str, tuple[int, ...]] | None = None,
    drop: tuple[str, ...] = (),
    seed: int = 0,
) -> Path:
    """Shapes are numpy order (rows, row length)."""
    t = TinyGGUF(path, arch, seed=seed, drop=drop, override_shape=override_shape)
    w, add, rng = t.writer, t.add, t.rng
    hd = head_dim
    E, F, V = N_EMBD, N_FF, N_VOCAB
    n_q, n_kv = N_HEAD * hd, N_HEAD_KV * hd
    w.add_block_count(n_layer)
    w.add_context_length(4096 if arch == "phi3" else 256)
    w.add_embedding_length(E)
    w.add_feed_forward_length(F)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(1000.0 if arch in ("gemma3", "llama") else 10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(hd)
    if window:
        w.add_sliding_window(window)
    if softcap:
        w.add_final_logit_softcapping(softcap)
    if linear_scale:
        w.add_rope_scaling_type(__import__("gguf").RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(linear_scale)
    if yarn_factor:
        w.add_rope_scaling_type(__import__("gguf").RopeScalingType.YARN)
        w.add_rope_scaling_factor(yarn_factor)
        w.add_rope_scaling_orig_ctx_len(64)
    if arch == "phi3":
        w.add_rope_scaling_orig_ctx_len(1024)
        if rope_factors:
            w.add_rope_scaling_attn_factors(1.19)

    norm = dict(qtype=Q.F32, scale=0.1, offset=1.0)
    add("token_embd.weight", (V, E), matrix_type, 1.0 if arch != "gemma3" else 0.15)
    add("output_norm.weight", (E,), **norm)
    if untied_output:
        add("output.weight", (V, E), matrix_type)
    if rope_factors:
        w.add_tensor("rope_factors_long.weight", (1.0 + 3 * rng.random(hd // 2)).astype(np.float32))
        w.add_tensor("rope_factors_short.weight", (1.0 + rng.random(hd // 2)).astype(np.float32))
    for il in range(n_layer):
        p = f"blk.{il}."
        add(p + "attn_norm.weight", (E,), **norm)
        if arch == "phi3":
            add(p + "attn_qkv.weight", (n_q + 2 * n_kv, E), matrix_type)
        else:
            add(p + "attn_q.weight", (n_q, E), matrix_type)
            add(p + "attn_k.weight", (n_kv, E), matrix_type)
            add(p + "attn_v.weight", (n_kv, E), matrix_type)
        add(p + "attn_output.weight", (E, n_q), matrix_type)
        if arch == "qwen2" or biases:
            add(p + "attn_q.bias", (n_q,), Q.F32)
            add(p + "attn_k.bias", (n_kv,), Q.F32)
            add(p + "attn_v.bias", (n_kv,), Q.F32)
        if biases:
            add(p + "attn_output.bias", (E,), Q.F32)
        if arch in ("qwen3", "gemma3"):
            add(p + "attn_q_norm.weight", (hd,), **norm)
            add(p + "attn_k_norm.weight", (hd,), **norm)
        if arch == "gemma3":
            add(p + "post_attention_norm.weight", (E,), **norm)
            add(p + "post_ffw_norm.weight", (E,), **norm)
        add(p + "ffn_norm.weight", (E,), **norm)
        if arch == "phi3":
            add(p + "ffn_up.weight", (2 * F, E), matrix_type)
        else:
            add(p + "ffn_gate.weight", (F, E), matrix_type)
            add(p + "ffn_up.weight", (F, E), matrix_type)
        add(p + "ffn_down.weight", (E, F), matrix_type)
    return t.close()
