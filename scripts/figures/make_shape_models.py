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
both engines.

Quantizing a whole F16 model on 2 cores takes long (the 3B took 40 min) and an 8B or 30B
F16 file hardly fits on disk, yet speed depends only on each tensor's type, shape and
bytes, never on the values. So by default (--distinct-layers 2) the script writes a
shallow F16 model of the same shape, with the embeddings, head and only that many layers,
quantizes it, and assembles the full-depth file from it: every layer of the full model
gets its own copy of the quantized tensors of one shallow layer (layers repeat, but each
is distinct bytes in the file, so no cache serves one layer's weights to another). The
type mix is the full model's: Q4_K_M (Q5_K_M) gives attn_v and ffn_down Q6_K in the
layers llama.cpp's use_more_bits picks by layer index and count (src/llama-quant.cpp), so
the shallow file's even layers are quantized with those tensors forced to Q6_K
(--tensor-type) and its odd layers with them forced to Q4_K (Q5_K), and each full layer
copies a shallow layer of its kind. --check DIRECT.gguf compares every tensor's name,
type and shape with a directly quantized file of the same shape. --full quantizes the
whole-depth F16 file instead (the MoE's whole-depth source is Q8_0, written by numpy and
requantized, as an F16 one would not fit).

Measured on the 2-core Zen 4 VM (docs/benchmarks-real-sizes.md lists every file and time).
Whole-depth (--full), while other work held the machine at load 20-24:
  qwen2.5-coder-1.5b  F16 3.09 GB in 180 s; Q4_K_M 0.99 GB in 880 s
  smollm2-1.7b        F16 3.42 GB in 246 s; Q4_K_M 1.06 GB in 1463 s, Q4_0 0.99 GB in
                      215 s, Q8_0 1.82 GB in 270 s, Q6_K 1.41 GB in 603 s
  llama-3.2-3b        F16 6.43 GB in 584 s; Q4_K_M 2.02 GB in 2365 s
Shallow (the default), at load 5-10:
  qwen2.5-coder-1.5b  F16 0.66 GB in 38 s; Q4_K_M quantized in 37 s, assembled in 29 s
                      (0.99 GB, the whole-depth file's tensors, types and size exactly)
  qwen3-8b            F16 3.27 GB in 96 s; Q4_K_M quantized in 272 s, assembled in 51 s
                      (5.03 GB)
  qwen3-30b-a3b       F16 3.74 GB in 172 s; Q4_K_M quantized in 400 s, assembled in 49 s
                      (18.56 GB; bench only)
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


# -- quantizing a shallow model, assembling the full depth ------------------------------------

# The mixes whose type for a layer's attn_v and ffn_down depends on the layer: (the type
# of the other layers, the type of the ones use_more_bits picks), per llama.cpp's
# llama_tensor_get_type_impl for these architectures (not Falcon, not 8-expert MoEs).
MIXES: dict[str, tuple[str, str]] = {"Q4_K_M": ("Q4_K", "Q6_K"), "Q5_K_M": ("Q5_K", "Q6_K")}
# Types that give every layer the same types (only the output head / tied embedding differs,
# and it is quantized for real in the shallow model).
UNIFORM = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q6_K")
# The tensors of a layer the mixes give more bits (the MoE's *_exps match by prefix).
MIXED_TENSORS = ("attn_v", "ffn_down")


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama.cpp's rule for the layers that get more bits in a _M mix: the first and last
    eighth and every third layer between."""
    return (
        i_layer < n_layers // 8
        or i_layer >= 7 * n_layers // 8
        or (i_layer - n_layers // 8) % 3 == 2
    )


def shallow_kind(j: int, qtype: str) -> bool:
    """Whether shallow layer j holds the more-bits variant (even layers do, for a mix)."""
    return qtype in MIXES and j % 2 == 0


def source_layers(s: Shape, distinct: int, qtype: str) -> list[int]:
    """For every layer of the full model, the shallow layer whose tensors it copies: one of
    the same kind, taking the candidates in turn."""
    kinds: dict[bool, list[int]] = {}
    for j in range(distinct):
        kinds.setdefault(shallow_kind(j, qtype), []).append(j)
    used = {k: 0 for k in kinds}
    out = []
    for i in range(s.layers):
        kind = qtype in MIXES and use_more_bits(i, s.layers)
        out.append(kinds[kind][used[kind] % len(kinds[kind])])
        used[kind] += 1
    return out


def tensor_type_overrides(distinct: int, qtype: str) -> list[str]:
    """llama-quantize arguments forcing each shallow layer's mixed tensors to its kind."""
    if qtype not in MIXES:
        return []
    argv = []
    for j in range(distinct):
        typ = MIXES[qtype][1 if shallow_kind(j, qtype) else 0]
        for t in MIXED_TENSORS:
            argv += ["--tensor-type", rf"blk\.{j}\.{t}={typ.lower()}"]
    return argv


def quantize(tool: Path, src: Path, dst: Path, qtype: str, threads: int, requant: bool,
             extra: list[str] | None = None) -> None:  # fmt: skip
    while not tool.is_file():  # the peer build may still be running
        time.sleep(30)
    part = dst.with_suffix(".gguf.part")
    argv = [str(tool), *(["--allow-requantize"] if requant else []), *(extra or []), str(src),
            str(part), qtype, str(threads)]  # fmt: skip
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.replace(part, dst)  # readers never see half a file


def assemble(shallow: Path, dst: Path, s: Shape, sources: list[int]) -> None:
    """The full-depth file: the shallow file's metadata with the full layer count, its
    non-layer tensors, and for full layer i a copy of shallow layer sources[i]'s tensors
    (quantized bytes copied as they are, one tensor at a time through the mapping)."""
    import gguf

    r = gguf.GGUFReader(shallow)
    by_name = {t.name: t for t in r.tensors}
    w = gguf.GGUFWriter(dst, arch=s.arch)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue  # the writer writes its own header and architecture
        if f.name == f"{s.arch}.block_count":
            w.add_uint32(f.name, s.layers)
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), f.types[0], sub_type=sub)
    # The shallow file's tensor order (llama-quantize's), with its layers' run replaced by
    # the full depth, each layer's tensors in shallow layer 0's order.
    want = {t.name: t.shape for t in tensors(s)}
    rests = [t.name.split(".", 2)[2] for t in r.tensors if t.name.startswith("blk.0.")]
    order: list[str] = []
    for t in r.tensors:
        if not t.name.startswith("blk."):
            order.append(t.name)
        elif t.name == f"blk.0.{rests[0]}":
            order += [f"blk.{i}.{rest}" for i in range(s.layers) for rest in rests]
    if sorted(order) != sorted(want):
        raise SystemExit(f"{shallow.name}: its tensors are not the shape's")
    plan = []
    for name in order:
        src_name = name
        if name.startswith("blk."):
            layer, rest = name.removeprefix("blk.").split(".", 1)
            src_name = f"blk.{sources[int(layer)]}.{rest}"
        src = by_name[src_name]
        plan.append((name, src))
        shape = tuple(int(d) for d in reversed(src.shape))  # numpy order
        if shape != want[name]:
            raise SystemExit(f"{src.name}: shape {shape}, the full model wants {want[name]}")
        w.add_tensor_info(name, shape, np.dtype(np.float32), int(src.n_bytes),
                          src.tensor_type)  # fmt: skip
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _, src in plan:
        w.write_tensor_data(np.asarray(src.data).view(np.uint8).reshape(-1))
    w.close()


def describe(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    import gguf

    return {t.name: (t.tensor_type.name, tuple(int(d) for d in t.shape))
            for t in gguf.GGUFReader(path).tensors}  # fmt: skip


def check_against(made: Path, direct: Path) -> None:
    """Every tensor of `made` has the name, type and shape of `direct`'s (a file of the same
    shape quantized whole); prints both type histograms."""
    from collections import Counter

    a, b = describe(made), describe(direct)
    for label, d in ((made, a), (direct, b)):
        hist = sorted(Counter(t for t, _ in d.values()).items())
        print(f"{label}: {len(d)} tensors, " + ", ".join(f"{k} {v}" for k, v in hist))
    bad = [n for n in sorted(a.keys() | b.keys()) if a.get(n) != b.get(n)]
    for n in bad[:20]:
        print(f"  differs: {n}: {a.get(n)} against {b.get(n)}")
    if bad:
        raise SystemExit(f"{made}: {len(bad)} tensors differ from {direct}")
    if list(a) != list(b):
        raise SystemExit(f"{made}: the same tensors as {direct}, in another order")
    print(f"{made}: every tensor's name, type and shape match {direct}, in order")


def make_layered(name: str, s: Shape, args: argparse.Namespace, work: Path) -> None:
    from dataclasses import replace

    distinct = args.distinct_layers
    qtypes = args.types or s.types
    for qtype in qtypes:
        if qtype not in MIXES and qtype not in UNIFORM:
            raise SystemExit(f"{qtype}: the layer rule of this type is not reproduced; use --full")
        if qtype in MIXES and distinct < 2:
            raise SystemExit(f"{qtype} needs --distinct-layers of at least 2 (one of each kind)")
    shallow = replace(s, layers=min(distinct, s.layers))
    src = work / f"{name}-{distinct}layers-F16.gguf"
    t0 = time.monotonic()
    if not src.is_file():
        write_source(name, shallow, src.with_suffix(".part"), q8=False)
        os.replace(src.with_suffix(".part"), src)
    print(f"{name}: {src.name} {src.stat().st_size / 1e9:.2f} GB in {time.monotonic() - t0:.0f} s",
          flush=True)  # fmt: skip
    for qtype in qtypes:
        small = work / f"{name}-{distinct}layers-{qtype}.gguf"
        dst = args.out / f"{name}-{qtype}.gguf"
        t1 = time.monotonic()
        quantize(args.quantize, src, small, qtype, args.threads, requant=False,
                 extra=tensor_type_overrides(shallow.layers, qtype))  # fmt: skip
        t2 = time.monotonic()
        part = dst.with_suffix(".gguf.part")
        assemble(small, part, s, source_layers(s, shallow.layers, qtype))
        os.replace(part, dst)
        small.unlink()
        print(f"{name}: {dst} {dst.stat().st_size / 1e9:.2f} GB: shallow {qtype} quantized in "
              f"{t2 - t1:.0f} s, assembled in {time.monotonic() - t2:.0f} s", flush=True)  # fmt: skip
    if not args.keep_source:
        src.unlink()


def make_full(name: str, s: Shape, args: argparse.Namespace, work: Path) -> None:
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
        return
    for qtype in args.types or s.types:
        dst = args.out / f"{name}-{qtype}.gguf"
        t2 = time.monotonic()
        quantize(args.quantize, src, dst, qtype, args.threads, requant=q8)
        print(f"{name}: {dst} {dst.stat().st_size / 1e9:.2f} GB, quantized in "
              f"{time.monotonic() - t2:.0f} s", flush=True)  # fmt: skip
    if not args.keep_source:
        src.unlink()


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
    ap.add_argument("--distinct-layers", type=int, default=2,
                    help="layers of the shallow model the full depth is assembled from")  # fmt: skip
    ap.add_argument("--full", action="store_true", help="quantize the whole-depth model")
    ap.add_argument("--keep-source", action="store_true", help="keep the F16/Q8_0 file")
    ap.add_argument("--source-only", action="store_true",
                    help="only write the whole-depth F16/Q8_0 file (with --full)")  # fmt: skip
    ap.add_argument("--check", type=Path, nargs=2, metavar=("MADE", "DIRECT"),
                    help="compare two files' tensor names, types and shapes, and exit")  # fmt: skip
    args = ap.parse_args()
    if args.check:
        check_against(*args.check)
        return
    work = args.work or args.out / ".f16"
    work.mkdir(parents=True, exist_ok=True)
    for name in args.names or DEFAULT_SHAPES:
        if args.full or args.source_only:
            make_full(name, SHAPES[name], args, work)
        else:
            make_layered(name, SHAPES[name], args, work)


if __name__ == "__main__":
    main()
