"""The steering acceptance demo (docs/steering.md): mean answer length of the held-out
prompts, greedy, under a control vector at several scales.

    .venv/bin/python -m ds4d steer build --positive tests/data/steering/verbose.txt \
        --negative tests/data/steering/terse.txt --layers 4:12 -o /tmp/verbosity.gguf
    .venv/bin/python scripts/steering_demo.py /tmp/verbosity.gguf --scales -0.5 0 0.5

Prints one line per scale: the mean and median answer length in tokens over the prompts
(an answer ends at an end-of-generation token or at --max-tokens)."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from ds4d.chat.oneshot import one_shot_prompt
from ds4d.cli.steer import read_prompts
from ds4d.engine import Engine
from ds4d.engine.default_model import resolve_model_path
from ds4d.engine.sampler import SamplingParams, make_rng, sample
from ds4d.engine.steering import load_control_vectors

HELD_OUT = Path(__file__).resolve().parents[2] / "tests/data/steering/heldout.txt"


def answer_lengths(engine: Engine, prompts: list[str], max_tokens: int) -> list[int]:
    greedy = SamplingParams(temperature=0.0)
    out = []
    for text in prompts:
        _, ids = one_shot_prompt(engine, text)
        with engine.new_session(len(ids) + max_tokens + 1) as s:
            s.eval(ids)
            n = 0
            while n < max_tokens:
                token = sample(s.compute_logits(), greedy, make_rng(0))
                if token in engine.tokenizer.eog_ids:
                    break
                s.eval([token])
                n += 1
        out.append(n)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("vector", type=Path)
    ap.add_argument("--scales", type=float, nargs="+", default=[-0.5, 0.0, 0.5])
    ap.add_argument("--prompts", type=Path, default=HELD_OUT)
    ap.add_argument("--model", default=None)
    ap.add_argument("--max-tokens", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--attn", type=float, default=0.0, help="attention scale per unit of scale")
    args = ap.parse_args()
    prompts = read_prompts(args.prompts)
    with Engine.open(resolve_model_path(args.model), threads=args.threads) as engine:
        for scale in args.scales:
            engine.set_steering(load_control_vectors(
                [(args.vector, 1.0)], engine.info.n_layer, engine.info.n_embd,
                attn_scale=args.attn * scale, ffn_scale=scale,
            ))  # fmt: skip
            n = answer_lengths(engine, prompts, args.max_tokens)
            print(f"scale {scale:+g}: mean {statistics.mean(n):.1f} tokens, median "
                  f"{statistics.median(n):g}, {len(n)} prompts", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
