"""The DeepSeek V4 Flash GGUF layout as ds4 defines it, as data, and its validation.

Everything the forward pass relies on is checked here once, so the family code can trust
the file: the `deepseek4.*` hyper-parameters (types and values), every tensor name, its
GGUF dims and quant type, that each tensor's bytes lie inside the file, and that the
hash-routing tables name only existing experts (the forward indexes expert arrays with
them). The file is read through GGUFFile's own index, never gguf.GGUFReader (seconds of
per-element objects for a real vocabulary). A problem is reported as one line; all
problems of a file are reported together, the first on the message's first line.

Shapes come from metadata so that tiny synthetic models (`ds4d synth-gguf`) can exist.
A file that does not declare itself synthetic (key `ds4d.synthetic`) must carry exactly
the shape of the released model (`DS4_FLASH`), as ds4 requires.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ds4d.engine import gguf_reader as R
from ds4d.engine.errors import ModelLoadError
from ds4d.engine.gguf_file import GGUFArray, GGUFFile, Tensor

ARCH = "deepseek4"
SYNTHETIC_KEY = "ds4d.synthetic"

T = GGMLQuantizationType
# The two released expert encodings: (gate/up type, down type).
EXPERT_TYPES = {"q2": (T.IQ2_XXS, T.Q2_K), "q4": (T.Q4_K, T.Q4_K)}


@dataclass(frozen=True)
class DS4Params:
    """The hyper-parameters of one deepseek4 GGUF (defaults: the released model)."""

    n_layer: int = 43
    n_embd: int = 4096
    n_vocab: int = 129280
    n_head: int = 64
    n_head_kv: int = 1
    head_dim: int = 512  # key_length == value_length: K and V are one latent row
    n_rot: int = 64
    q_lora_rank: int = 1024
    o_lora_rank: int = 1024
    o_groups: int = 8
    n_expert: int = 256
    n_expert_used: int = 6
    n_ff_exp: int = 2048
    n_expert_shared: int = 1
    n_hash_layer: int = 3
    window: int = 128
    idx_n_head: int = 64
    idx_head_dim: int = 128
    idx_top_k: int = 512
    n_hc: int = 4
    sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    rms_eps: float = 1e-6
    swiglu_clamp: float = 10.0
    rope_base: float = 10000.0
    compress_rope_base: float = 160000.0
    rope_scale: float = 16.0
    rope_orig_ctx: int = 65536
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    expert_weight_scale: float = 1.5
    n_ctx_train: int = 1048576
    compress_ratios: tuple[int, ...] = ()  # filled by __post_init__ when empty

    def __post_init__(self) -> None:
        if not self.compress_ratios:
            object.__setattr__(self, "compress_ratios", default_ratios(self.n_layer))

    def ratio(self, il: int) -> int:
        return self.compress_ratios[il]

    @property
    def hc_dim(self) -> int:
        return self.n_hc * self.n_embd

    @property
    def hc_mix(self) -> int:
        return 2 * self.n_hc + self.n_hc * self.n_hc

    @property
    def n_nope(self) -> int:
        return self.head_dim - self.n_rot


def default_ratios(n_layer: int) -> tuple[int, ...]:
    """ds4's schedule: layers 0,1 window only; then even layers ratio 4, odd ratio 128."""
    return tuple(0 if il < 2 else (4 if il % 2 == 0 else 128) for il in range(n_layer))


DS4_FLASH = DS4Params()


# ---------------------------------------------------------------------------------------
# Metadata keys: (key, DS4Params field, kind). Kinds say which GGUF value types are taken.

_INT = (R.UINT32, R.INT32, R.UINT64, R.INT64)
_FLOAT = (R.FLOAT32, R.FLOAT64, R.UINT32, R.INT32)

INT_KEYS: tuple[tuple[str, str], ...] = (
    ("block_count", "n_layer"),
    ("embedding_length", "n_embd"),
    ("vocab_size", "n_vocab"),
    ("attention.head_count", "n_head"),
    ("attention.head_count_kv", "n_head_kv"),
    ("attention.key_length", "head_dim"),
    ("attention.value_length", "head_dim"),
    ("rope.dimension_count", "n_rot"),
    ("attention.q_lora_rank", "q_lora_rank"),
    ("attention.output_lora_rank", "o_lora_rank"),
    ("attention.output_group_count", "o_groups"),
    ("expert_count", "n_expert"),
    ("expert_used_count", "n_expert_used"),
    ("expert_feed_forward_length", "n_ff_exp"),
    ("expert_shared_count", "n_expert_shared"),
    ("hash_layer_count", "n_hash_layer"),
    ("attention.sliding_window", "window"),
    ("attention.indexer.head_count", "idx_n_head"),
    ("attention.indexer.key_length", "idx_head_dim"),
    ("attention.indexer.top_k", "idx_top_k"),
    ("hyper_connection.count", "n_hc"),
    ("hyper_connection.sinkhorn_iterations", "sinkhorn_iters"),
    ("rope.scaling.original_context_length", "rope_orig_ctx"),
)
FLOAT_KEYS: tuple[tuple[str, str], ...] = (
    ("hyper_connection.epsilon", "hc_eps"),
    ("rope.freq_base", "rope_base"),
    ("rope.scaling.factor", "rope_scale"),
    ("rope.scaling.yarn_beta_fast", "yarn_beta_fast"),
    ("rope.scaling.yarn_beta_slow", "yarn_beta_slow"),
    ("attention.compress_rope_freq_base", "compress_rope_base"),
    ("expert_weights_scale", "expert_weight_scale"),
    ("attention.layer_norm_rms_epsilon", "rms_eps"),
)
# Keys whose value is part of the math the code implements: equal in every valid file.
FIXED_FIELDS = (
    "n_head_kv",
    "n_expert_shared",
    "n_hash_layer",
    "window",
    "n_hc",
    "sinkhorn_iters",
    "hc_eps",
    "rms_eps",
    "swiglu_clamp",
    "rope_base",
    "compress_rope_base",
    "rope_scale",
    "rope_orig_ctx",
    "yarn_beta_fast",
    "yarn_beta_slow",
    "expert_weight_scale",
    "n_rot",
)
OPTIONAL_ZERO_KEYS = ("expert_group_count", "expert_group_used_count")
RATIOS_KEY = "attention.compress_ratios"
CLAMP_KEY = "swiglu_clamp_exp"
NORM_KEY = "expert_weights_norm"
CTX_KEY = "context_length"


def key(name: str) -> str:
    return f"{ARCH}.{name}"


# ---------------------------------------------------------------------------------------
# Tensors


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dims: tuple[int, ...]  # GGUF order: ne0 (contiguous) first
    types: tuple[GGMLQuantizationType, ...]
    optional: bool = False


def expected_tensors(p: DS4Params, expert: str | None = None) -> Iterator[TensorSpec]:
    """Every tensor of the layout. `expert` ("q2"/"q4") fixes the routed-expert types;
    None accepts either (the file must still be consistent, see validate)."""
    F32, F16, Q8, I32 = (T.F32,), (T.F16,), (T.Q8_0,), (T.I32,)
    gu_types = (EXPERT_TYPES[expert][0],) if expert else tuple(v[0] for v in EXPERT_TYPES.values())
    dn_types = (
        (EXPERT_TYPES[expert][1],) if expert else tuple({v[1] for v in EXPERT_TYPES.values()})
    )
    E, hd, hc = p.n_embd, p.head_dim, p.hc_dim
    yield TensorSpec("token_embd.weight", (E, p.n_vocab), F16)
    yield TensorSpec("output_hc_base.weight", (p.n_hc,), F32)
    yield TensorSpec("output_hc_fn.weight", (hc, p.n_hc), F16)
    yield TensorSpec("output_hc_scale.weight", (1,), F32)
    yield TensorSpec("output_norm.weight", (E,), F32)
    yield TensorSpec("output.weight", (E, p.n_vocab), Q8)
    heads_per_group = p.n_head // p.o_groups
    for il in range(p.n_layer):
        b = f"blk.{il}."
        r = p.ratio(il)
        yield TensorSpec(b + "hc_attn_fn.weight", (hc, p.hc_mix), F16)
        yield TensorSpec(b + "hc_attn_scale.weight", (3,), F32)
        yield TensorSpec(b + "hc_attn_base.weight", (p.hc_mix,), F32)
        yield TensorSpec(b + "attn_norm.weight", (E,), F32)
        yield TensorSpec(b + "attn_q_a.weight", (E, p.q_lora_rank), Q8)
        yield TensorSpec(b + "attn_q_a_norm.weight", (p.q_lora_rank,), F32)
        yield TensorSpec(b + "attn_q_b.weight", (p.q_lora_rank, p.n_head * hd), Q8)
        yield TensorSpec(b + "attn_kv.weight", (E, hd), Q8)
        yield TensorSpec(b + "attn_kv_a_norm.weight", (hd,), F32)
        yield TensorSpec(b + "attn_sinks.weight", (p.n_head,), F32)
        yield TensorSpec(
            b + "attn_output_a.weight", (heads_per_group * hd, p.o_groups * p.o_lora_rank), Q8
        )
        yield TensorSpec(b + "attn_output_b.weight", (p.o_groups * p.o_lora_rank, E), Q8)
        if r:
            coff = 2 if r == 4 else 1
            yield TensorSpec(b + "attn_compressor_ape.weight", (coff * hd, r), F16)
            yield TensorSpec(b + "attn_compressor_kv.weight", (E, coff * hd), F16)
            yield TensorSpec(b + "attn_compressor_gate.weight", (E, coff * hd), F16)
            yield TensorSpec(b + "attn_compressor_norm.weight", (hd,), F32)
        if r == 4:
            ihd = p.idx_head_dim
            yield TensorSpec(
                b + "indexer.attn_q_b.weight", (p.q_lora_rank, p.idx_n_head * ihd), F16
            )
            yield TensorSpec(b + "indexer.proj.weight", (E, p.idx_n_head), F16)
            yield TensorSpec(b + "indexer_compressor_ape.weight", (2 * ihd, 4), F16)
            yield TensorSpec(b + "indexer_compressor_kv.weight", (E, 2 * ihd), F16)
            yield TensorSpec(b + "indexer_compressor_gate.weight", (E, 2 * ihd), F16)
            yield TensorSpec(b + "indexer_compressor_norm.weight", (ihd,), F32)
        yield TensorSpec(b + "hc_ffn_fn.weight", (hc, p.hc_mix), F16)
        yield TensorSpec(b + "hc_ffn_scale.weight", (3,), F32)
        yield TensorSpec(b + "hc_ffn_base.weight", (p.hc_mix,), F32)
        yield TensorSpec(b + "ffn_norm.weight", (E,), F32)
        yield TensorSpec(b + "ffn_gate_inp.weight", (E, p.n_expert), F16)
        yield TensorSpec(b + "exp_probs_b.bias", (p.n_expert,), F32, optional=True)
        yield TensorSpec(b + "ffn_gate_exps.weight", (E, p.n_ff_exp, p.n_expert), gu_types)
        yield TensorSpec(b + "ffn_up_exps.weight", (E, p.n_ff_exp, p.n_expert), gu_types)
        yield TensorSpec(b + "ffn_down_exps.weight", (p.n_ff_exp, E, p.n_expert), dn_types)
        yield TensorSpec(b + "ffn_gate_shexp.weight", (E, p.n_ff_exp), Q8)
        yield TensorSpec(b + "ffn_up_shexp.weight", (E, p.n_ff_exp), Q8)
        yield TensorSpec(b + "ffn_down_shexp.weight", (p.n_ff_exp, E), Q8)
        if il < p.n_hash_layer:
            yield TensorSpec(b + "ffn_gate_tid2eid.weight", (p.n_expert_used, p.n_vocab), I32)


def tensor_nbytes(qtype: int, dims: tuple[int, ...]) -> int:
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    n = math.prod(dims)
    return n // block * size


# ---------------------------------------------------------------------------------------
# Validation


class DS4LayoutError(ModelLoadError):
    """A GGUF that claims (or must be) deepseek4 but does not fit ds4's layout. The first
    line names the path and the first problem; further problems follow, one a line."""

    def __init__(self, path: str, problems: list[str]) -> None:
        self.problems = problems
        more = f" (and {len(problems) - 1} more below)" if len(problems) > 1 else ""
        head = f"{path}: not a valid deepseek4 GGUF: {problems[0]}{more}"
        super().__init__("\n".join([head, *problems[1:]]))


@dataclass
class DS4Layout:
    """A validated file: its parameters, expert encoding and tensors (mmapped, not read)."""

    params: DS4Params
    expert: str  # "q2" or "q4"
    synthetic: bool
    tensors: dict[str, Tensor] = dataclasses.field(default_factory=dict)

    def data(self, name: str) -> np.ndarray:
        """The tensor's bytes/values as a view on the mmap."""
        return self.tensors[name].data


def field_value(gf: GGUFFile, name: str) -> tuple[Any, Any]:
    """(value, value type) of a metadata key, or (None, None). Numeric arrays come back as
    lists with the type (ARRAY, item type); string arrays stay undecoded (a GGUFArray:
    only their length is needed here, and decoding a vocabulary costs time)."""
    vtype = gf.index.value_types.get(name)
    if vtype is None:
        return None, None
    if vtype == R.ARRAY:
        arr = gf.get_array(name)
        if arr is None:  # an array of arrays
            return [], (vtype, R.ARRAY)
        if arr.item_type == R.STRING:
            return arr, vtype
        return arr.numpy().tolist(), (vtype, arr.item_type)
    return gf.get(name), vtype


def read_params(gf: GGUFFile, problems: list[str]) -> DS4Params | None:
    """The parameters the metadata declares; type/absence problems appended to problems."""
    values: dict[str, object] = {}
    for k, fld in INT_KEYS:
        v, t = field_value(gf, key(k))
        if v is None:
            problems.append(f"metadata {key(k)}: missing")
        elif t not in _INT:
            problems.append(f"metadata {key(k)}: type {_tname(t)}, expected an integer")
        elif fld in values and values[fld] != v:
            problems.append(f"metadata {key(k)}: {v} differs from key_length {values[fld]}")
        else:
            values[fld] = int(v)
    for k, fld in FLOAT_KEYS:
        v, t = field_value(gf, key(k))
        if v is None:
            problems.append(f"metadata {key(k)}: missing")
        elif t not in _FLOAT:
            problems.append(f"metadata {key(k)}: type {_tname(t)}, expected a number")
        else:
            values[fld] = float(v)
    for k in OPTIONAL_ZERO_KEYS:
        v, t = field_value(gf, key(k))
        if v is not None and v != 0:
            problems.append(f"metadata {key(k)}: {v}, expected 0 (no group-limited routing)")
    v, t = field_value(gf, key(NORM_KEY))
    if v is None:
        problems.append(f"metadata {key(NORM_KEY)}: missing")
    elif t != R.BOOL or not v:
        problems.append(f"metadata {key(NORM_KEY)}: {v!r}, expected bool true")
    v, t = field_value(gf, key(CTX_KEY))
    if v is not None and t in _INT:
        values["n_ctx_train"] = int(v)
    found_layers = values.get("n_layer")
    n_layer = found_layers if isinstance(found_layers, int) else None

    def per_layer(name: str, types: tuple[int, ...], type_text: str) -> list[Any] | None:
        """The first n_layer entries of a per-layer array, or None with the problem noted
        (entries past n_layer belong to MTP layers and are ignored)."""
        v, t = field_value(gf, key(name))
        if v is None:
            problems.append(f"metadata {key(name)}: missing")
        elif not isinstance(t, tuple) or t[1] not in types:
            problems.append(f"metadata {key(name)}: expected an array of {type_text}")
        elif n_layer is not None and len(v) < n_layer:
            problems.append(f"metadata {key(name)}: {len(v)} entries for {n_layer} layers")
        elif n_layer is not None:
            return list(v[:n_layer])
        return None

    ratio_list = per_layer(RATIOS_KEY, (R.UINT32, R.INT32), "u32/i32")
    if ratio_list is not None and n_layer is not None:
        ratios = tuple(int(x) for x in ratio_list)
        want = default_ratios(n_layer)
        bad = [il for il in range(n_layer) if ratios[il] != want[il]]
        if bad:
            il = bad[0]
            problems.append(
                f"metadata {key(RATIOS_KEY)}: layer {il} has ratio {ratios[il]}, ds4's "
                f"schedule needs {want[il]} (0 for layers 0-1, then 4 even / 128 odd)"
            )
        values["compress_ratios"] = ratios
    clamps = per_layer(CLAMP_KEY, (R.FLOAT32, R.FLOAT64), "f32/f64")
    if clamps is not None:
        odd = {float(x) for x in clamps} - {10.0}
        if odd:
            problems.append(
                f"metadata {key(CLAMP_KEY)}: {sorted(odd)[0]}, expected 10.0 for every layer"
            )
        values["swiglu_clamp"] = 10.0
    for name in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        tv, tt = field_value(gf, name)
        if tv is None:
            problems.append(f"metadata {name}: missing")
        elif tt != R.ARRAY or not isinstance(tv, GGUFArray):
            problems.append(f"metadata {name}: expected an array of strings")
        elif (
            name == "tokenizer.ggml.tokens" and "n_vocab" in values and len(tv) != values["n_vocab"]
        ):
            problems.append(f"metadata {name}: {len(tv)} tokens, vocab_size is {values['n_vocab']}")
    if problems:
        return None
    return DS4Params(**values)  # type: ignore[arg-type]


def check_params(p: DS4Params, synthetic: bool, problems: list[str]) -> None:
    """Fixed values, the released shape (unless synthetic), and internal consistency."""
    for fld in FIXED_FIELDS:
        got, want = getattr(p, fld), getattr(DS4_FLASH, fld)
        if not _close(got, want):
            problems.append(f"hyper-parameter {fld}: {got}, ds4 requires {want}")
    if not synthetic:
        for f in dataclasses.fields(DS4Params):
            if f.name in FIXED_FIELDS or f.name in ("n_ctx_train", "compress_ratios"):
                continue
            got, want = getattr(p, f.name), getattr(DS4_FLASH, f.name)
            if not _close(got, want):
                problems.append(
                    f"hyper-parameter {f.name}: {got}, the DeepSeek V4 Flash shape is {want}"
                )
    rules = [
        (p.n_layer > p.n_hash_layer, "block_count must exceed hash_layer_count"),
        (p.n_embd % 256 == 0, "embedding_length must be a multiple of 256 (k-quant blocks)"),
        (p.n_ff_exp % 256 == 0, "expert_feed_forward_length must be a multiple of 256"),
        (
            p.head_dim % 64 == 0 and p.head_dim > p.n_rot,
            "key_length must be a multiple of 64 above the rope dims",
        ),
        (p.n_rot % 2 == 0, "rope.dimension_count must be even"),
        (
            p.o_groups > 0 and p.n_head % p.o_groups == 0,
            "head_count must divide into output groups",
        ),
        (p.q_lora_rank % 32 == 0 and p.o_lora_rank % 32 == 0, "lora ranks must be multiples of 32"),
        (
            p.idx_head_dim >= p.n_rot
            and p.idx_head_dim & (p.idx_head_dim - 1) == 0
            and p.idx_head_dim % 32 == 0,
            "indexer key_length must be a power of two >= 32 and >= the rope dims",
        ),
        (0 < p.n_expert_used <= p.n_expert, "expert_used_count must be in 1..expert_count"),
        (p.idx_top_k > 0, "indexer top_k must be positive"),
    ]
    problems.extend(f"hyper-parameter: {msg}" for ok, msg in rules if not ok)


def validate(gf: GGUFFile, path: str | None = None) -> DS4Layout:
    """Check a GGUF against the layout; raise DS4LayoutError listing every problem."""
    path = str(gf.path) if path is None else path
    problems: list[str] = []
    arch, _ = field_value(gf, "general.architecture")
    if arch != ARCH:
        raise DS4LayoutError(path, [f"general.architecture is {arch!r}, expected {ARCH!r}"])
    synth, _ = field_value(gf, SYNTHETIC_KEY)
    synthetic = bool(synth)
    p = read_params(gf, problems)
    if p is not None:
        check_params(p, synthetic, problems)
    if problems or p is None:
        raise DS4LayoutError(path, problems)

    have = {name: gf.tensor(name) for name in gf.tensor_names()}
    expert_kinds = set()
    seen = set()
    for spec in expected_tensors(p):
        seen.add(spec.name)
        t = have.get(spec.name)
        if t is None:
            if not spec.optional:
                problems.append(f"tensor {spec.name}: missing")
            continue
        dims = tuple(int(d) for d in t.shape)
        if dims != spec.dims:
            problems.append(f"tensor {spec.name}: dims {list(dims)}, expected {list(spec.dims)}")
        if t.type not in spec.types:
            want = " or ".join(x.name for x in spec.types)
            problems.append(f"tensor {spec.name}: type {t.type_name}, expected {want}")
        elif "_exps." in spec.name:
            expert_kinds.add((spec.name.split(".")[-2].split("_")[1], T(t.type)))
        if dims == spec.dims and t.type in spec.types:
            want_bytes = tensor_nbytes(t.type, dims)
            if t.n_bytes != want_bytes:
                problems.append(
                    f"tensor {spec.name}: {t.n_bytes} bytes in file, expected {want_bytes}"
                    " (truncated?)"
                )
            elif spec.name.endswith(TID2EID):
                problems.extend(check_routing_table(spec.name, t.data, p.n_expert))
    for name in have:
        if name not in seen and not name.startswith("mtp."):
            problems.append(f"tensor {name}: not part of the deepseek4 layout")
    expert = _expert_kind(expert_kinds, problems)
    if problems:
        raise DS4LayoutError(path, problems)
    return DS4Layout(params=p, expert=expert, synthetic=synthetic, tensors=have)


TID2EID = "ffn_gate_tid2eid.weight"


def check_routing_table(name: str, table: np.ndarray, n_expert: int) -> list[str]:
    """The hash-routing table (n_vocab rows of n_expert_used expert ids): every id must
    name an existing expert, since the forward indexes expert arrays with it."""
    bad = np.flatnonzero((table < 0) | (table >= n_expert))
    if not len(bad):
        return []
    tok, k = divmod(int(bad[0]), table.shape[1])
    return [
        f"tensor {name}: expert id {int(table[tok, k])} for token {tok} (slot {k}), expected"
        f" 0 to {n_expert - 1} ({len(bad)} bad entries)"
    ]


def load(path: str | Path) -> DS4Layout:
    """Open and validate a GGUF (ModelLoadError, one line, for an unreadable file)."""
    return validate(GGUFFile(path), str(path))


def _expert_kind(kinds: set[tuple[str, Any]], problems: list[str]) -> str:
    gu = {t for role, t in kinds if role in ("gate", "up")}
    dn = {t for role, t in kinds if role == "down"}
    for name, (g, d) in EXPERT_TYPES.items():
        if gu == {g} and dn == {d}:
            return name
    if kinds:
        problems.append(
            "routed experts: mixed types "
            f"(gate/up {sorted(x.name for x in gu)}, down {sorted(x.name for x in dn)}); "
            "expected IQ2_XXS+Q2_K or Q4_K throughout"
        )
    return "q2"


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return abs(float(a) - float(b)) <= 1e-6 * max(abs(float(b)), 1e-30)
    return bool(a == b)


def _tname(t: Any) -> str:
    return str(getattr(t, "name", str(t)))
