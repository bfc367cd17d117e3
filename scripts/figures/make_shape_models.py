"""Writes random-weight GGUFs at the shapes of models people run, for measuring speed at
real sizes (docs/benchmarks-real-sizes.md): each with its family's real tokenizer and chat
template, quantized by llama.cpp's own quantizer.

    .venv/bin/python scripts/figures/make_shape_models.py [--out shape-models] \
        [--quantize PEER_BUILD/bin/llama-quantize] [--threads 2] [NAME ...]

NAME is one of the SHAPES below (default: all but the MoE, smallest first); each writes
OUT/NAME-TYPE.gguf for its TYPES. The tokenizer and chat template come from the
verification kit (tests/helpers/kit.py rebuilds the kit GGUFs, which carry the real vocabularies),
or for SmolLM2 from the embedded SmolLM2-135M (the same 49k vocabulary as SmolLM2-1.7B).
Qwen2.5-Coder's FIM tokens (<|fim_prefix|> ...) are in the Qwen2.5 vocabulary, and their
ids are also written under the tokenizer.ggml.fim_*_token_id keys as llama.cpp reads them.

Weights are seeded per tensor (the shape's seed and the tensor name), so a rerun writes the
same F16 file: norm weights 1 + N(0, 0.02), every other tensor N(0, 0.02) (projections,
embeddings, biases, the MoE router), which keeps activations finite through every layer in
both engines. The F16 file is written tensor by tensor (one tensor in memory at a time) to
--work (default OUT/.f16), quantized to each type, and deleted. The MoE, too large for an
F16 intermediate on a shared disk, is written as Q8_0 (numpy, slow) and requantized.

Measured on the 2-core Zen 4 VM while other work held it at load 20-24 (a quiet machine is
several times faster; docs/benchmarks-real-sizes.md lists every file):
  qwen2.5-coder-1.5b  F16 3.09 GB in 180 s; Q4_K_M 0.99 GB in 880 s
  smollm2-1.7b        F16 3.42 GB in 246 s; Q4_K_M 1.06 GB in 1463 s, Q4_0 0.99 GB in
                      215 s, Q8_0 1.82 GB in 270 s, Q6_K 1.41 GB in 603 s
  llama-3.2-3b        F16 6.43 GB in 584 s; Q4_K_M 2.02 GB in 2365 s
  qwen3-8b            F16 16.4 GB, Q4_K_M about 5 GB expected (not generated yet)
  qwen3-30b-a3b       Q8_0 about 32 GB, Q4_K_M about 18 GB expected (bench only; not
                      generated yet)
A development tool: llama.cpp is never a ds4d dependency.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

WEIGHT_STD = 0.02
NORM_STD = 0.02
# Rows generated at once: bounds the float32 scratch to ~64 MB whatever the tensor.
CHUNK_VALUES = 1 << 24


@dataclass(frozen=True)
class Shape:
    arch: str  # GGUF architecture
    tokenizer: str  # "kit:<family>" or "embedded"
    seed: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    tied: bool
    rope_theta: float
    eps: float
    context: int
    head_dim: int | None = None  # None: hidden / heads
    qkv_bias: bool = False  # qwen2
    qk_norm: bool = False  # qwen3, qwen3moe
    llama3_rope: dict[str, float] | None = None  # Llama 3.x rope scaling (rope_freqs tensor)
    experts: int = 0
    experts_used: int = 0
    expert_ffn: int = 0
    fim: bool = False
    types: tuple[str, ...] = ("Q4_K_M",)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads


# Shapes from each model's published config.json.
SHAPES: dict[str, Shape] = {
    "qwen2.5-coder-1.5b": Shape(
        "qwen2", "kit:qwen2", seed=2501, hidden=1536, layers=28, heads=12, kv_heads=2,
        ffn=8960, vocab=151936, tied=True, rope_theta=1e6, eps=1e-6, context=32768,
        qkv_bias=True, fim=True,
    ),
    "smollm2-1.7b": Shape(
        "llama", "embedded", seed=2502, hidden=2048, layers=24, heads=32, kv_heads=32,
        ffn=8192, vocab=49152, tied=True, rope_theta=130000.0, eps=1e-5, context=8192,
        types=("Q4_K_M", "Q4_0", "Q8_0", "Q6_K"),
    ),
    "llama-3.2-3b": Shape(
        "llama", "kit:llama", seed=2503, hidden=3072, layers=28, heads=24, kv_heads=8,
        ffn=8192, vocab=128256, tied=True, rope_theta=500000.0, eps=1e-5, context=131072,
        head_dim=128,
        llama3_rope=dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                         original_max_position_embeddings=8192),
    ),
    "qwen3-8b": Shape(
        "qwen3", "kit:qwen3", seed=2504, hidden=4096, layers=36, heads=32, kv_heads=8,
        ffn=12288, vocab=151936, tied=False, rope_theta=1e6, eps=1e-6, context=40960,
        head_dim=128, qk_norm=True,
    ),
    "qwen3-30b-a3b": Shape(
        "qwen3moe", "kit:qwen3moe", seed=2505, hidden=2048, layers=48, heads=32, kv_heads=4,
        ffn=6144, vocab=151936, tied=False, rope_theta=1e6, eps=1e-6, context=40960,
        head_dim=128, qk_norm=True, experts=128, experts_used=8, expert_ffn=768,
    ),
}  # fmt: skip
DEFAULT_SHAPES = ["qwen2.5-coder-1.5b", "smollm2-1.7b", "llama-3.2-3b", "qwen3-8b"]

# Qwen2.5's FIM and repository tokens (in every Qwen2.5 vocabulary), under llama.cpp's keys.
QWEN_FIM = dict(fim_pre=151659, fim_mid=151660, fim_suf=151661, fim_pad=151662,
                fim_rep=151663, fim_sep=151664)  # fmt: skip


# -- tensors ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]  # numpy order: the GGUF dimensions reversed
    kind: str  # "weight", "norm" or "const"
    const: np.ndarray | None = None  # the values of a "const" tensor (float32)

    @property
    def f32(self) -> bool:
        """1-D tensors and the MoE router stay float32, as the converter writes them."""
        return len(self.shape) == 1 or self.name.endswith("ffn_gate_inp.weight")


def llama3_rope_factors(s: Shape) -> np.ndarray:
    """Llama 3.x's per-frequency RoPE divisors (the rope_freqs tensor): 1 for the short
    wavelengths, `factor` for the long ones, a smooth blend between (Meta's published rule)."""
    assert s.llama3_rope is not None
    p = s.llama3_rope
    freqs = 1.0 / (s.rope_theta ** (np.arange(0, s.hd, 2, dtype=np.float64) / s.hd))
    old = p["original_max_position_embeddings"]
    low_wl, high_wl = old / p["low_freq_factor"], old / p["high_freq_factor"]
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(p["factor"])
        else:
            smooth = (old / wl - p["low_freq_factor"]) / (
                p["high_freq_factor"] - p["low_freq_factor"]
            )
            out.append(1.0 / ((1 - smooth) / p["factor"] + smooth))
    return np.asarray(out, np.float32)


def tensors(s: Shape) -> list[Tensor]:
    h, q, kv = s.hidden, s.heads * s.hd, s.kv_heads * s.hd
    out = [Tensor("token_embd.weight", (s.vocab, h), "weight")]
    if s.llama3_rope is not None:
        out.append(Tensor("rope_freqs.weight", (s.hd // 2,), "const", llama3_rope_factors(s)))
    for i in range(s.layers):
        b = f"blk.{i}."
        out += [
            Tensor(b + "attn_norm.weight", (h,), "norm"),
            Tensor(b + "attn_q.weight", (q, h), "weight"),
            Tensor(b + "attn_k.weight", (kv, h), "weight"),
            Tensor(b + "attn_v.weight", (kv, h), "weight"),
        ]
        if s.qkv_bias:
            out += [Tensor(b + f"attn_{x}.bias", (n,), "weight")
                    for x, n in (("q", q), ("k", kv), ("v", kv))]  # fmt: skip
        if s.qk_norm:
            out += [Tensor(b + "attn_q_norm.weight", (s.hd,), "norm"),
                    Tensor(b + "attn_k_norm.weight", (s.hd,), "norm")]  # fmt: skip
        out += [Tensor(b + "attn_output.weight", (h, q), "weight"),
                Tensor(b + "ffn_norm.weight", (h,), "norm")]  # fmt: skip
        if s.experts:
            e, f = s.experts, s.expert_ffn
            out += [
                Tensor(b + "ffn_gate_inp.weight", (e, h), "weight"),
                Tensor(b + "ffn_gate_exps.weight", (e, f, h), "weight"),
                Tensor(b + "ffn_up_exps.weight", (e, f, h), "weight"),
                Tensor(b + "ffn_down_exps.weight", (e, h, f), "weight"),
            ]
        else:
            out += [
                Tensor(b + "ffn_gate.weight", (s.ffn, h), "weight"),
                Tensor(b + "ffn_up.weight", (s.ffn, h), "weight"),
                Tensor(b + "ffn_down.weight", (h, s.ffn), "weight"),
            ]
    out.append(Tensor("output_norm.weight", (h,), "norm"))
    if not s.tied:
        out.append(Tensor("output.weight", (s.vocab, h), "weight"))
    return out


def values(s: Shape, t: Tensor) -> Iterator[np.ndarray]:
    """The tensor's float32 values in row chunks, from a generator seeded by the shape's
    seed and the tensor's name (so every tensor is reproducible on its own)."""
    if t.const is not None:
        yield t.const
        return
    rng = np.random.Generator(np.random.PCG64([s.seed, zlib.crc32(t.name.encode())]))
    row = t.shape[-1]
    n = int(np.prod(t.shape))
    step = max(row, CHUNK_VALUES // row * row)
    for start in range(0, n, step):
        x = rng.standard_normal(min(step, n - start), dtype=np.float32)
        if t.kind == "norm":
            x = 1.0 + NORM_STD * x
        else:
            x *= WEIGHT_STD
        yield x


# -- GGUF ---------------------------------------------------------------------------------------


def tokenizer_source(s: Shape) -> Path:
    if s.tokenizer == "embedded":
        from ds4d.engine.default_model import default_model_path

        return default_model_path()
    from tests.helpers.kit import kit_model

    return kit_model(s.tokenizer.removeprefix("kit:"))


def add_metadata(w: Any, name: str, s: Shape) -> None:
    import gguf

    src = gguf.GGUFReader(tokenizer_source(s))
    w.add_type("model")
    w.add_name(f"{name} shape (random weights, ds4d scripts/figures/make_shape_models.py)")
    a = s.arch
    w.add_uint32(f"{a}.block_count", s.layers)
    w.add_uint32(f"{a}.context_length", s.context)
    w.add_uint32(f"{a}.embedding_length", s.hidden)
    w.add_uint32(f"{a}.feed_forward_length", s.ffn)
    w.add_uint32(f"{a}.attention.head_count", s.heads)
    w.add_uint32(f"{a}.attention.head_count_kv", s.kv_heads)
    w.add_float32(f"{a}.rope.freq_base", s.rope_theta)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", s.eps)
    if s.head_dim is not None:
        w.add_uint32(f"{a}.attention.key_length", s.hd)
        w.add_uint32(f"{a}.attention.value_length", s.hd)
    if a == "llama":
        w.add_uint32(f"{a}.vocab_size", s.vocab)
        w.add_uint32(f"{a}.rope.dimension_count", s.hd)
    if s.experts:
        w.add_uint32(f"{a}.expert_count", s.experts)
        w.add_uint32(f"{a}.expert_used_count", s.experts_used)
        w.add_uint32(f"{a}.expert_feed_forward_length", s.expert_ffn)
    w.add_uint32("general.file_type", int(gguf.LlamaFileType.MOSTLY_F16))
    w.add_uint32("general.quantization_version", 2)
    for f in src.fields.values():
        if not f.name.startswith("tokenizer."):
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), f.types[0], sub_type=sub)
    tokens = src.fields["tokenizer.ggml.tokens"]
    if len(tokens.data) != s.vocab:
        raise SystemExit(f"{name}: tokenizer has {len(tokens.data)} tokens, shape {s.vocab}")
    if s.fim:
        for key, tid in QWEN_FIM.items():
            text = bytes(tokens.parts[tokens.data[tid]]).decode()
            if "fim" not in text and "repo" not in text and "file_sep" not in text:
                raise SystemExit(f"{name}: token {tid} is {text!r}, not a FIM token")
            w.add_uint32(f"tokenizer.ggml.{key}_token_id", tid)


def write_source(name: str, s: Shape, path: Path, q8: bool) -> None:
    """The model in F16 (or Q8_0 when q8), one tensor in memory at a time."""
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf import quants

    w = gguf.GGUFWriter(path, arch=s.arch)
    add_metadata(w, name, s)
    ts = tensors(s)
    for t in ts:
        if t.f32:
            w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), 4 * int(np.prod(t.shape)))
        elif q8:
            nbytes = int(np.prod(t.shape)) // 32 * 34
            w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), nbytes, Q.Q8_0)
        else:
            w.add_tensor_info(t.name, t.shape, np.dtype(np.float16), 2 * int(np.prod(t.shape)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in ts:
        chunks = values(s, t)
        if t.f32:
            data = np.concatenate(list(chunks)).astype(np.float32)
        elif q8:
            data = np.concatenate([quants.quantize(c.reshape(-1, t.shape[-1]), Q.Q8_0).ravel()
                                   for c in chunks])  # fmt: skip
        else:
            data = np.empty(int(np.prod(t.shape)), np.float16)
            pos = 0
            for c in chunks:
                data[pos : pos + c.size] = c
                pos += c.size
        w.write_tensor_data(data)
    w.close()


def quantize(tool: Path, src: Path, dst: Path, qtype: str, threads: int, requant: bool) -> None:
    while not tool.is_file():  # the peer build may still be running
        time.sleep(30)
    part = dst.with_suffix(".gguf.part")
    argv = [str(tool), *(["--allow-requantize"] if requant else []), str(src), str(part),
            qtype, str(threads)]  # fmt: skip
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.replace(part, dst)  # readers never see half a file


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", choices=[*SHAPES, []], default=[])
    ap.add_argument("--out", type=Path, default=Path("shape-models"))
    ap.add_argument("--work", type=Path, help="where the F16 intermediate goes (OUT/.f16)")
    ap.add_argument(
        "--quantize",
        type=Path,
        default=Path("llama-quantize"),
        help="llama.cpp's quantizer (default: the one on PATH)",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--types", nargs="+", help="override each shape's types")
    ap.add_argument("--keep-source", action="store_true", help="keep the F16/Q8_0 file")
    ap.add_argument("--source-only", action="store_true", help="only write the F16/Q8_0 file")
    args = ap.parse_args()
    work = args.work or args.out / ".f16"
    work.mkdir(parents=True, exist_ok=True)
    for name in args.names or DEFAULT_SHAPES:
        s = SHAPES[name]
        q8 = s.experts > 0
        src = work / f"{name}-{'Q8_0' if q8 else 'F16'}.gguf"
        t0 = time.monotonic()
        if not src.is_file():
            write_source(name, s, src.with_suffix(".part"), q8)
            os.replace(src.with_suffix(".part"), src)
        t1 = time.monotonic()
        print(f"{name}: {src.name} {src.stat().st_size / 1e9:.2f} GB in {t1 - t0:.0f} s",
              flush=True)  # fmt: skip
        if args.source_only:
            continue
        for qtype in args.types or s.types:
            dst = args.out / f"{name}-{qtype}.gguf"
            t2 = time.monotonic()
            quantize(args.quantize, src, dst, qtype, args.threads, requant=q8)
            print(f"{name}: {dst} {dst.stat().st_size / 1e9:.2f} GB, quantized in "
                  f"{time.monotonic() - t2:.0f} s", flush=True)  # fmt: skip
        if not args.keep_source:
            src.unlink()


if __name__ == "__main__":
    main()
