"""llama.cpp's distance from the kit's float32 references, on the same GGUFs and inputs as
tests/engine/test_embedding.py measures ds4d's (a development yardstick, not a test): run
with the peer llama-cpp-python,

    LLAMA_CPP_LIB_PATH=/work/peer/build/bin /work/peer/venv/bin/python \\
        scripts/embed_llamacpp_distance.py [--ds4d]

Prints one line per family and input: tokens, llama.cpp's cosine distance (its own
tokenization, embedding=True, the GGUF's pooling, L2-normalised). With --ds4d (run by the
project's .venv python instead) the same for ds4d's engine.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.helpers.kit import KIT_DIR, embed_kit_families, kit_manifest, kit_model  # noqa: E402


def distance(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return abs(1.0 - float(a64 @ b64 / np.linalg.norm(a64) / np.linalg.norm(b64)))


def main() -> None:
    use_ds4d = "--ds4d" in sys.argv
    for family in embed_kit_families():
        m = kit_manifest(family)
        path = kit_model(family)
        if use_ds4d:
            from ds4d.engine import Engine

            engine = Engine.open(path, threads=2)
        else:
            import llama_cpp

            llm = llama_cpp.Llama(str(path), embedding=True, n_ctx=512, n_batch=512,
                                  n_ubatch=512, n_threads=2, verbose=False)  # fmt: skip
        with np.load(KIT_DIR / m["reference"]) as z:
            worst = 0.0
            for name in m["embedding"]["inputs"]:
                text, ref = m["texts"][name], z[f"{name}.vector"]
                ref_ids = z[f"{name}.tokens"].tolist()
                if use_ds4d:
                    ids = engine.embedding_tokens(text)
                    vec = engine.embed([ids])[0]
                else:
                    ids = llm.tokenize(text.encode(), add_bos=True, special=True)
                    vec = np.asarray(llm.embed(text, normalize=True), np.float32)
                d = distance(vec, ref)
                worst = max(worst, d)
                same = "same tokens" if ids == ref_ids else f"TOKENS DIFFER ({len(ids)})"
                print(f"{family:15s} {name:6s} {len(ref_ids):4d} tokens  {same:12s} "
                      f"cosine distance {d:.2e}")  # fmt: skip
            print(f"{family:15s} worst {worst:.2e}")


if __name__ == "__main__":
    main()
