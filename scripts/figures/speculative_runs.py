"""Where prompt-lookup drafts fail, without timing: the greedy continuation of a prompt
(a `ds4d bench spec` workload, or a text file), then, replayed step by step, what
`PromptLookup` drafts (k tokens at most) and how many of them the greedy text accepts.
Greedy output is the same with speculation on and off, so the replay is exact for drafts
of k tokens; it also says how far the output is a faithful copy of the (renamed) source
file, i.e. whether the model copies at all.

Usage: .venv/bin/python scripts/figures/speculative_runs.py [--model PATH]
       [--workload rewrite | --prompt FILE] [--tokens 256] [--k 7]
A measuring tool, not a test: it prints what it saw, asserts nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from ds4d.engine import Engine
from ds4d.engine.default_model import resolve_model_path
from ds4d.serving.lookup import PromptLookup
from ds4d.tools.bench_spec import DEFAULT_FILE, workloads

RENAME = "ChatRequest=GenerationRequest"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="")
    ap.add_argument("--workload", default="rewrite")
    ap.add_argument("--prompt", type=Path, help="a prompt file instead of a workload")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--k", type=int, default=7)
    args = ap.parse_args()
    prompt = (
        args.prompt.read_text() if args.prompt else workloads(DEFAULT_FILE, RENAME)[args.workload]
    )
    old, _, new = RENAME.partition("=")
    source = DEFAULT_FILE.read_text().replace(old, new)
    with Engine.open(resolve_model_path(args.model), threads=2) as engine:
        tok = engine.tokenizer
        ids = tok.encode(prompt)
        session = engine.new_session(len(ids) + args.tokens + 8)
        session.eval(ids)
        out: list[int] = []
        for _ in range(args.tokens):
            t = int(np.argmax(session.compute_logits()))
            if t in tok.eog_ids:
                break
            out.append(t)
            session.eval([t])
        session.close()
        text = tok.decode(out)
    print(text[:1500])
    print("-----")
    faithful = 0  # the longest start of the output found in the renamed source
    while faithful < len(text) and text[: faithful + 1] in source:
        faithful += 1
    lookup = PromptLookup(ids)
    i = steps = drafted = accepted = no_draft = 0
    runs: list[int] = []
    while i < len(out):
        draft = lookup.propose(args.k)
        a = 0
        while a < len(draft) and i + a < len(out) and draft[a] == out[i + a]:
            a += 1
        steps += 1
        drafted += len(draft)
        accepted += a
        if draft:
            runs.append(a)
        else:
            no_draft += 1
        lookup.extend(out[i : i + a + 1])  # the accepted tokens and the model's own
        i += a + 1
    print(f"{len(out)} tokens; faithful copy of the source for its first {faithful} of "
          f"{len(text)} characters; {steps} steps with drafts of up to {args.k}: drafted "
          f"{drafted}, accepted {accepted} ({accepted / max(1, drafted):.0%}), {no_draft} "
          f"steps without a draft; accepted runs (count by length 0..{args.k}): "
          f"{np.bincount(runs, minlength=args.k + 1).tolist()}")  # fmt: skip


if __name__ == "__main__":
    main()
