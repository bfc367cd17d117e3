"""`ds4d generate -p "..."`: one chat reply streamed to stdout, to see the engine work.

The prompt is rendered with the model's own chat template (one user message, optional
system message), prefilled, then sampled token by token until an end-of-generation
token or -n tokens. Timing goes to stderr so stdout stays the reply alone.

Debugging dumps (docs/dumps.md): `--dump-tokens` prints the prompt's tokens exactly as the
engine will evaluate them and exits; `--dump-logprobs FILE` / `--dump-logits FILE` write a
greedy continuation as JSON in the project's golden-vector shape.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from ds4d.cli.steer import add_steering_flags, steering_from_args
from ds4d.daemon.config import add_engine_flags, open_engine
from ds4d.daemon.exitcodes import CliError


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("-p", "--prompt", help="the user message")
    src.add_argument("--prompt-file", type=Path, help="read the user message from a file")
    p.add_argument("-s", "--system", help="a system message")
    p.add_argument("-m", "--model", help="GGUF file (default: the embedded model)")
    p.add_argument("-n", "--max-tokens", type=int, default=256)
    p.add_argument("--temperature", "--temp", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--ctx", type=int, default=4096, help="session context size")
    p.add_argument("--threads", type=int, default=None, help="default: physical cores")
    add_engine_flags(p, "kv_type", "weights", "precision")
    p.add_argument("--raw", action="store_true", help="send the prompt as is, no template")
    add_steering_flags(p)
    dump = p.add_argument_group("debugging dumps (docs/dumps.md)")
    dump.add_argument("--dump-tokens", action="store_true",
                      help="print the prompt's token ids and pieces as the engine sees them, "
                      "then exit")  # fmt: skip
    dump.add_argument("--dump-logprobs", metavar="FILE", type=Path,
                      help="write a greedy continuation with each step's top alternatives "
                      "as JSON (no text is printed)")  # fmt: skip
    dump.add_argument(
        "--logprobs-top-k",
        metavar="N",
        type=int,
        default=20,
        help="alternatives per step in --dump-logprobs (default 20)",
    )
    dump.add_argument(
        "--dump-logits",
        metavar="FILE",
        type=Path,
        help="as --dump-logprobs, each step also with its n_vocab raw logits",
    )
    dump.add_argument(
        "--dump-id",
        default=None,
        help="the document's id (default: the prompt file's stem, or 'prompt')",
    )


def run(args: argparse.Namespace) -> int:
    from ds4d.chat.oneshot import one_shot_prompt
    from ds4d.chat.template import TemplateError
    from ds4d.engine import SamplingParams, sample
    from ds4d.engine.sampler import make_rng

    try:
        params = SamplingParams(
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            min_p=args.min_p,
            seed=args.seed,
        )
    except ValueError as e:
        raise CliError(str(e), 2) from None
    if args.max_tokens < 1:
        raise CliError("--max-tokens must be ≥ 1", 2)
    if args.logprobs_top_k < 1:
        raise CliError("--logprobs-top-k must be ≥ 1", 2)
    if args.prompt_file is not None:
        try:
            args.prompt = args.prompt_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise CliError(f"cannot read --prompt-file: {e}", 2) from None
    engine = open_engine(args, "kv_type", "weights", "precision")
    steering_from_args(args, engine)

    tok = engine.tokenizer
    try:
        text, prompt = one_shot_prompt(engine, args.prompt, args.system, args.raw)
    except TemplateError as e:
        raise CliError(f"the model's chat template failed: {e}") from None
    if args.dump_tokens:
        _print_tokens(engine, prompt)
        return 0
    if len(prompt) + args.max_tokens > args.ctx:
        raise CliError(f"prompt ({len(prompt)} tokens) + --max-tokens exceeds --ctx {args.ctx}", 2)
    if args.dump_logprobs or args.dump_logits:
        return _dump(engine, args, text, prompt)

    session = engine.new_session(args.ctx)
    t0 = time.perf_counter()
    session.eval(prompt)
    t1 = time.perf_counter()
    rng = make_rng(params.seed)
    decoder = tok.incremental_decoder()
    stop = set(tok.eog_ids)
    generated = 0
    for _ in range(args.max_tokens):
        token = sample(session.compute_logits(), params, rng)
        if token in stop:
            break
        sys.stdout.write(decoder.feed(token))
        sys.stdout.flush()
        generated += 1
        session.eval([token])
    sys.stdout.write(decoder.flush() + "\n")
    t2 = time.perf_counter()
    print(
        f"[{len(prompt)} prompt tokens, {len(prompt) / (t1 - t0):.1f} t/s prefill; "
        f"{generated} generated, {generated / max(t2 - t1, 1e-9):.1f} t/s]",
        file=sys.stderr,
    )
    return 0


def _print_tokens(engine: Any, prompt: list[int]) -> None:
    from ds4d.engine.dumps import token_table

    for row in token_table(engine.tokenizer, prompt):
        piece = json.dumps(row["piece"], ensure_ascii=False)
        mark = " special" if row["special"] else ""
        print(f"{row['index']:5d} {row['id']:7d} {piece}{mark}")
    print(f"[{len(prompt)} tokens]", file=sys.stderr)


def _dump(engine: Any, args: argparse.Namespace, text: str, prompt: list[int]) -> int:
    from ds4d import __version__
    from ds4d.engine.dumps import greedy_dump

    case_id = args.dump_id or (args.prompt_file.stem if args.prompt_file else "prompt")
    doc = greedy_dump(
        engine, text, prompt, max_tokens=args.max_tokens, top_k=args.logprobs_top_k,
        chat=not args.raw and bool(engine.chat_template), case_id=case_id, n_ctx=args.ctx,
        with_logits=args.dump_logits is not None, producer=f"ds4d {__version__}",
    )  # fmt: skip
    if args.dump_logits:
        _write_json(args.dump_logits, doc)
    if args.dump_logprobs:
        for step in doc["steps"]:
            step.pop("logits", None)
        _write_json(args.dump_logprobs, doc)
    print(f"[{len(prompt)} prompt tokens, {len(doc['steps'])} steps dumped]", file=sys.stderr)
    return 0


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    try:
        path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    except OSError as e:
        raise CliError(f"cannot write {path}: {e}") from None
