"""The verification kit: tiny random models of every family with reference log-probabilities.

Each family in tests/data/kit/ has
  <family>.json       manifest: architecture, the GGUF's sha256, the byte ranges to refill,
                      the reference texts
  <family>.gguf.xz    the F16 GGUF with its vocabulary-sized tensors and its vocabulary
                      arrays zeroed (xz)
  blobs/<sha>.xz      the vocabulary arrays (tokens, merges) of the GGUFs, stored once for
                      families that share a tokenizer
  <family>.ref.npz    per sequence: tokens, and at every position the reference top-20 ids
                      and log-probabilities (transformers, float32)

The vocabulary-sized tensors (token embedding, untied output) are most of a GGUF's bytes and
are pure noise, so they are not committed: `draw_f16` regenerates them from their seed and
`kit_model` rebuilds the exact file (checked against the sha256 recorded at generation) in a
cache directory. scripts/fixtures/make_family_kit.py writes the kit; this module needs numpy only.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

KIT_DIR = Path(__file__).resolve().parents[1] / "data" / "kit"
TOP_K = 20


def draw_f16(seed: int, shape: tuple[int, ...], scale: float) -> np.ndarray:
    """Uniform values in [-scale, scale) as float16, from PCG64's raw 64-bit stream (whose
    output numpy guarantees across versions; Generator's distributions it does not)."""
    n = int(np.prod(shape))
    raw = np.random.PCG64(seed).random_raw(n)
    unit = (raw >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return ((2.0 * unit - 1.0) * scale).astype(np.float16).reshape(shape)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ds4d-test" / "kit"


# Embedding fixtures (scripts/fixtures/make_embed_kit.py) are named embed-<family>: reference
# vectors, not teacher-forced log-probabilities.
EMBED_PREFIX = "embed-"


def kit_families() -> list[str]:
    """Generation families whose fixture is in the kit."""
    names = (p.name.removesuffix(".json") for p in KIT_DIR.glob("*.json"))
    return sorted(n for n in names if not n.startswith(EMBED_PREFIX))


def embed_kit_families() -> list[str]:
    """Embedding fixtures in the kit (embed-<family>)."""
    return sorted(p.name.removesuffix(".json") for p in KIT_DIR.glob(f"{EMBED_PREFIX}*.json"))


def kit_manifest(family: str) -> dict:
    path = KIT_DIR / f"{family}.json"
    if not path.is_file():
        raise FileNotFoundError(f"no kit fixture for family {family!r} in {KIT_DIR}")
    return json.loads(path.read_text())


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def kit_model(family: str) -> Path:
    """The family's F16 GGUF, rebuilt in the cache on first use and verified by sha256."""
    manifest = kit_manifest(family)
    target = cache_dir() / f"{family}-{manifest['sha256'][:16]}.gguf"
    if target.is_file() and target.stat().st_size == manifest["size"]:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    data = bytearray(lzma.decompress((KIT_DIR / manifest["gguf_xz"]).read_bytes()))
    if len(data) != manifest["size"]:
        raise ValueError(f"kit {family}: decompressed size {len(data)} != {manifest['size']}")
    for t in manifest["refill"]:
        values = draw_f16(t["seed"], tuple(t["shape"]), t["scale"]).astype("<f2").tobytes()
        data[t["offset"] : t["offset"] + len(values)] = values
    for b in manifest["blobs"]:
        raw = lzma.decompress((KIT_DIR / "blobs" / f"{b['sha256']}.xz").read_bytes())
        if len(raw) != b["length"]:
            raise ValueError(f"kit {family}: blob {b['sha256']} holds {len(raw)} bytes")
        data[b["offset"] : b["offset"] + len(raw)] = raw
    digest = hashlib.sha256(data).hexdigest()
    if digest != manifest["sha256"]:
        raise ValueError(f"kit {family}: rebuilt GGUF sha256 {digest} != {manifest['sha256']}")
    # Written beside the target and renamed, so a concurrent run never sees half a file.
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".part")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, target)
    return target


@dataclass(frozen=True)
class Sequence:
    name: str
    tokens: np.ndarray  # int32 (n,)
    top_ids: np.ndarray  # int32 (n, TOP_K): reference top-k after each position, best first
    top_logprobs: np.ndarray  # float32 (n, TOP_K)


def load_sequences(npz: Path, names: list[str]) -> list[Sequence]:
    with np.load(npz) as z:
        return [
            Sequence(name, z[f"{name}.tokens"], z[f"{name}.top_ids"], z[f"{name}.top_logprobs"])
            for name in names
        ]


def kit_reference(family: str) -> list[Sequence]:
    """The teacher-forced reference sequences of a family (plain text, chat, code)."""
    manifest = kit_manifest(family)
    return load_sequences(KIT_DIR / manifest["reference"], manifest["sequences"])


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def logprobs_of(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """log_softmax(logits) at `ids` (per row), in float64, without a float64 copy of every
    logit: the normaliser sums float32 exponentials in float64 (off by ~1e-7 from the
    full float64 computation), several times faster over a 200k-token vocabulary."""
    x = np.asarray(logits, np.float32)
    top = x.max(axis=-1, keepdims=True)
    total = np.exp(x - top).sum(axis=-1, keepdims=True, dtype=np.float64)
    return np.take_along_axis(x, ids, axis=-1).astype(np.float64) - top - np.log(total)


# Tokens per prefill call in teacher_forced: small enough that a 262k vocabulary's logits
# stay ~40 MB, and calls start at different offsets within the sliding windows.
PREFILL_CALL = 40


@dataclass(frozen=True)
class Comparison:
    mean_abs: float  # mean |ours - reference| over every position's top-k
    max_abs: float
    argmax_misses: list[int]  # positions whose reference margin exceeds the bar


def teacher_forced(engine: Any, seq: Sequence, margin: float) -> Comparison:
    """Runs seq through an ds4d Engine and compares with the reference: the first two
    thirds through prefill calls (several tokens, all logits), the rest through
    single-token decode calls, so both paths are measured."""
    n = len(seq.tokens)
    split = 2 * n // 3
    ours = np.empty(seq.top_logprobs.shape)
    argmax = np.empty(n, np.int64)
    session = engine.new_session(n)
    try:
        pos = 0
        while pos < n:
            if pos < split:
                end = min(pos + PREFILL_CALL, split)
                logits = session.eval_all_logits(seq.tokens[pos:end].tolist())
            else:
                end = pos + 1
                session.eval([int(seq.tokens[pos])])
                logits = session.compute_logits()[None, :]
            ours[pos:end] = logprobs_of(logits, seq.top_ids[pos:end])
            argmax[pos:end] = logits.argmax(axis=-1)  # the log-softmax's argmax
            pos = end
    finally:
        session.close()
    diff = np.abs(ours - seq.top_logprobs)
    ref_margin = seq.top_logprobs[:, 0] - seq.top_logprobs[:, 1]
    misses = np.nonzero((ref_margin > margin) & (argmax != seq.top_ids[:, 0]))[0]
    return Comparison(float(diff.mean()), float(diff.max()), misses.tolist())
