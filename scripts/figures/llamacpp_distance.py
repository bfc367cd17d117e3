"""llama.cpp's distance to a reference: teacher-forces the reference sequences through
llama-cpp-python (the yardstick venv, never a ds4d dependency) and prints the mean |Δ| of
the top-20 log-probabilities, as tests/engine/test_gemma3_real.py and tests/engine/test_family_vectors.py
measure ds4d's. Either a kit family or the Gemma 3 270M reference:

    PEER/bin/python scripts/figures/llamacpp_distance.py --kit llama
    PEER/bin/python scripts/figures/llamacpp_distance.py --gemma3-270m GGUF
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.helpers.kit import kit_model, kit_reference, load_sequences, log_softmax  # noqa: E402


def main() -> None:
    from llama_cpp import Llama

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--kit", metavar="FAMILY")
    group.add_argument("--gemma3-270m", metavar="GGUF", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.kit:
        path, seqs = kit_model(args.kit), kit_reference(args.kit)
    else:
        data = REPO / "tests" / "data" / "gemma3_270m"
        meta = json.loads((data / "reference.json").read_text())
        path, seqs = args.gemma3_270m, load_sequences(data / "reference.npz", meta["sequences"])
    n_ctx = max(len(s.tokens) for s in seqs)
    llm = Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, logits_all=True,
                n_threads=args.threads, verbose=False)  # fmt: skip
    for s in seqs:
        llm.reset()
        llm.eval(s.tokens.tolist())
        lp = log_softmax(np.asarray(llm.scores[: len(s.tokens)]))
        diff = np.abs(np.take_along_axis(lp, s.top_ids, axis=1) - s.top_logprobs)
        margin = s.top_logprobs[:, 0] - s.top_logprobs[:, 1]
        agree = float((lp.argmax(axis=1) == s.top_ids[:, 0]).mean())
        decisive = margin > 0.5
        miss = int((decisive & (lp.argmax(axis=1) != s.top_ids[:, 0])).sum())
        print(f"llama.cpp {path.name} {s.name}: {len(s.tokens)} tokens, mean |Δ logprob| "
              f"{diff.mean():.2e}, max {diff.max():.2e}, argmax agreement {agree:.3f}, "
              f"misses where margin > 0.5: {miss}")  # fmt: skip


if __name__ == "__main__":
    main()
