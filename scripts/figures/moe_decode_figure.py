"""Measures that a qwen3moe decode token reads only its selected experts.

Writes three random qwen3moe GGUFs of the same layer shape (Q8_0 experts) into a temporary
directory: 64 experts with 8 used, the same 64 experts with all 64 used, and 8 experts with
8 used (a model whose stored experts are exactly one token's active set). For each it
reports the expert bytes per decode token from the session's counter and the decode time
per token (median over the run, after a warm-up). If decode reads only the selected experts,
64/8 costs what 8/8 costs, and 64/64 costs about 8 times more.

    PYTHONPATH=. .venv/bin/python scripts/figures/moe_decode_figure.py [--threads 2] [--tokens 64]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ds4d.engine import native, qwen3moe  # noqa: E402
from ds4d.engine.gguf_file import GGUFFile  # noqa: E402
from tests.reference.tiny_moe import write_tiny_moe  # noqa: E402

SHAPE = dict(n_layer=4, n_embd=512, n_ff_exp=256, n_vocab=1024, head_dim=32,
             expert_type=Q.Q8_0, matrix_type=Q.Q8_0)  # fmt: skip
CASES = (("64 experts, 8 used", 64, 8), ("64 experts, 64 used", 64, 64),
         ("8 experts, 8 used", 8, 8))  # fmt: skip


def measure(path: Path, threads: int, n_tokens: int) -> tuple[float, float, int, float]:
    """(expert bytes per decode token, median seconds per decode token, total expert bytes,
    prefill tokens per second over one 256-token chunk)."""
    gf = GGUFFile(path)
    total = sum(gf.tensor(f"blk.{il}.ffn_{p}_exps.weight").n_bytes
                for il in range(SHAPE["n_layer"]) for p in ("gate", "up", "down"))  # fmt: skip
    tokens = np.random.default_rng(0).integers(0, SHAPE["n_vocab"], n_tokens + 8)
    with native.Pool(threads) as pool:
        model = qwen3moe.load(gf, pool)
        state = model.new_state(n_tokens + 16)
        logits = np.empty(model.n_vocab, np.float32)
        for tok in tokens[:8]:  # warm-up: page the weights in, grow the scratch
            state.eval(np.array([tok], np.int32), logits)
        before = model.expert_bytes
        times = []
        for tok in tokens[8:]:
            t0 = time.perf_counter()
            state.eval(np.array([tok], np.int32), logits)
            times.append(time.perf_counter() - t0)
        per_token = (model.expert_bytes - before) / n_tokens
        state.close()
        chunk = np.random.default_rng(1).integers(0, SHAPE["n_vocab"], 256).astype(np.int32)
        state = model.new_state(256)
        t0 = time.perf_counter()
        state.eval(chunk, logits)
        prefill = 256 / (time.perf_counter() - t0)
        state.close()
        model.close()
    return per_token, statistics.median(times), total, prefill


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(f"qwen3moe, {SHAPE['n_layer']} layers, n_embd {SHAPE['n_embd']}, expert width "
              f"{SHAPE['n_ff_exp']}, Q8_0 experts; {args.threads} threads, "
              f"{args.tokens} decode tokens")  # fmt: skip
        for label, n_expert, n_used in CASES:
            path = write_tiny_moe(Path(tmp) / f"{n_expert}-{n_used}.gguf", "qwen3moe",
                                  n_expert=n_expert, n_used=n_used, **SHAPE)  # fmt: skip
            per_token, seconds, total, prefill = measure(path, args.threads, args.tokens)
            print(f"  {label:20s} stored experts {total / 1e6:6.2f} MB, read per decode token "
                  f"{per_token / 1e6:6.2f} MB ({per_token / total:6.1%}), decode "
                  f"{seconds * 1e3:6.2f} ms/token, prefill {prefill:7.0f} tokens/s")  # fmt: skip


if __name__ == "__main__":
    main()
