"""Writes tiny random qwen3moe and gpt-oss GGUFs with gguf.GGUFWriter, in the tensor names,
shapes and keys llama.cpp's converter produces, for tests of the MoE families against
tests/reference/moe_model_ref.py (quant types, biases, sliding windows, YaRN) and for
malformed files."""

from __future__ import annotations

from pathlib import Path

from gguf import GGMLQuantizationType as Q
from gguf import RopeScalingType

from tests.reference.tiny_gguf import TinyGGUF

N_VOCAB, N_EMBD, N_HEAD, N_HEAD_KV, N_LAYER = 128, 64, 4, 2, 3
N_EXPERT, N_FF_EXP = 8, 64
WINDOW = 8  # gpt-oss sliding window: a 40-token test crosses it


def write_tiny_moe(
    path: Path,
    arch: str = "qwen3moe",
    *,
    expert_type: Q = Q.F16,
    matrix_type: Q = Q.F16,
    n_used: int = 2,
    head_dim: int = 32,
    tied_output: bool = False,
    override_shape: dict[str, tuple[int, ...]] | None = None,
    drop: tuple[str, ...] = (),
    extra_keys: dict[str, object] | None = None,
    seed: int = 0,
    n_layer: int = N_LAYER,
    n_embd: int = N_EMBD,
    n_expert: int = N_EXPERT,
    n_ff_exp: int = N_FF_EXP,
    n_vocab: int = N_VOCAB,
) -> Path:
    """A 3-layer MoE model (8 experts) with random weights unless sized otherwise. Shapes
    are numpy order."""
    oss = arch == "gpt-oss"
    t = TinyGGUF(path, arch, seed=seed, drop=drop, override_shape=override_shape)
    w, add = t.writer, t.add
    hd = head_dim
    w.add_block_count(n_layer)
    w.add_context_length(512)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff_exp)
    w.add_expert_feed_forward_length(n_ff_exp)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(n_vocab)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    if oss:
        w.add_rope_freq_base(150000.0)
        w.add_sliding_window(WINDOW)
        w.add_rope_scaling_type(RopeScalingType.YARN)
        w.add_rope_scaling_factor(32.0)
        w.add_rope_scaling_orig_ctx_len(4096)
    else:
        w.add_rope_freq_base(1000000.0)
    for key, value in (extra_keys or {}).items():
        if isinstance(value, str):
            w.add_string(f"{arch}.{key}", value)
        elif isinstance(value, bool):
            w.add_bool(f"{arch}.{key}", value)
        elif isinstance(value, int):
            w.add_uint32(f"{arch}.{key}", value)
        else:
            w.add_float32(f"{arch}.{key}", float(value))

    E, F, n = n_embd, n_ff_exp, n_expert
    add("token_embd.weight", (n_vocab, E), matrix_type, 1.0)
    add("output_norm.weight", (E,), Q.F32)
    if not tied_output:
        add("output.weight", (n_vocab, E), matrix_type)
    for il in range(n_layer):
        p = f"blk.{il}."
        add(p + "attn_norm.weight", (E,), Q.F32)
        add(p + "attn_q.weight", (N_HEAD * hd, E), matrix_type)
        add(p + "attn_k.weight", (N_HEAD_KV * hd, E), matrix_type)
        add(p + "attn_v.weight", (N_HEAD_KV * hd, E), matrix_type)
        add(p + "attn_output.weight", (E, N_HEAD * hd), matrix_type)
        add(p + "ffn_gate_inp.weight", (n, E), Q.F32, 0.5)
        add(p + "ffn_gate_exps.weight", (n, F, E), expert_type)
        add(p + "ffn_up_exps.weight", (n, F, E), expert_type)
        add(p + "ffn_down_exps.weight", (n, E, F), expert_type)
        if oss:
            for name, size in (("attn_q", N_HEAD * hd), ("attn_k", N_HEAD_KV * hd),
                               ("attn_v", N_HEAD_KV * hd), ("attn_output", E)):  # fmt: skip
                add(p + f"{name}.bias", (size,), Q.F32)
            add(p + "attn_sinks.weight", (N_HEAD,), Q.F32, 1.0)
            add(p + "post_attention_norm.weight", (E,), Q.F32)
            add(p + "ffn_gate_inp.bias", (n,), Q.F32)
            add(p + "ffn_gate_exps.bias", (n, F), Q.F32)
            add(p + "ffn_up_exps.bias", (n, F), Q.F32)
            add(p + "ffn_down_exps.bias", (n, E), Q.F32)
        else:
            add(p + "attn_q_norm.weight", (hd,), Q.F32)
            add(p + "attn_k_norm.weight", (hd,), Q.F32)
            add(p + "ffn_norm.weight", (E,), Q.F32)
    return t.close()
