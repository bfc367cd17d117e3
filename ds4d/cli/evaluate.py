"""`ds4d eval`: does the model still solve these? The embedded question set
(ds4d/cli/evalset.py: arithmetic, code reading, facts, tool calls) run through the real
inference path in-process — the family's chat format, the engine, the output parser —
greedy by default, each reply judged by exact answer extraction. Prints one line per
question and a summary line; exit status 0 (a low score is a result, not an error).
`--self-test` checks the extractors and exits. See docs/eval.md."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from ds4d.cli.steer import add_steering_flags, steering_from_args
from ds4d.daemon.exitcodes import CliError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", help="GGUF file of any family (default: the embedded model)")
    p.add_argument("--threads", type=int, default=None, help="default: physical cores")
    p.add_argument("--ctx", type=int, default=2048, help="session context size")
    p.add_argument(
        "--chat-template",
        type=Path,
        metavar="FILE",
        help="a jinja chat template to use instead of the GGUF's own",
    )
    p.add_argument("-n", "--max-tokens", type=int, default=96, help="per answer")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kind", action="append", choices=("arithmetic", "code", "facts", "tools"),
                   help="only questions of this kind (repeatable)")  # fmt: skip
    p.add_argument("--progress", action="store_true", help="a progress bar on stderr")
    p.add_argument("--verbose", action="store_true", help="print every reply in full")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")
    p.add_argument("--self-test", action="store_true", help="check the extractors and exit")
    add_steering_flags(p)


def run(args: argparse.Namespace) -> int:
    from ds4d.cli.evalset import KINDS, QUESTIONS, judge, self_test

    if args.self_test:
        failures = self_test()
        for f in failures:
            print(f"FAIL {f}")
        print(f"extractor self-test: {'ok' if not failures else f'{len(failures)} failed'}")
        return 1 if failures else 0
    from ds4d.chat.local import LocalChat, template_format
    from ds4d.chat.types import ChatRequest, Message, Sampling
    from ds4d.engine import Engine, EngineError
    from ds4d.engine.default_model import resolve_model_path

    questions = [q for q in QUESTIONS if not args.kind or q.kind in args.kind]
    try:
        engine = Engine.open(resolve_model_path(args.model), threads=args.threads)
    except (EngineError, FileNotFoundError) as e:
        raise CliError(str(e)) from None
    results: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    with engine:
        steering_from_args(args, engine)
        fmt = None
        if args.chat_template:
            try:
                fmt = template_format(engine, args.chat_template.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError) as e:
                raise CliError(f"cannot read --chat-template: {e}", 2) from None
        chat = LocalChat(engine, args.ctx, fmt)
        sampling = Sampling(temperature=args.temperature, top_p=1.0, min_p=0.0, seed=args.seed)
        for i, q in enumerate(questions):
            if args.progress:
                _bar(i, len(questions), q.id)
            req = ChatRequest(messages=[Message("user", q.prompt)], tools=list(q.tools),
                              sampling=sampling, max_tokens=args.max_tokens)  # fmt: skip
            try:
                reply = chat.generate(req)
            except ValueError as e:
                raise CliError(str(e)) from None
            ok, got = judge(q, reply.text, reply.tool_calls)
            results.append({"id": q.id, "kind": q.kind, "ok": ok, "expected": q.expected,
                            "got": got, "reply": reply.text, "tool_calls": reply.tool_calls,
                            "tokens": reply.completion_tokens})  # fmt: skip
            if args.progress:
                _bar(i + 1, len(questions), "")
            mark = "PASS" if ok else "FAIL"
            print(f"{mark}  {q.kind:10s} {q.id:15s} got {_short(got)}", flush=True)
            if args.verbose:
                print("      " + reply.text.replace("\n", "\n      "))
        chat.close()
        name = engine.info.name or Path(engine.info.path).stem
    seconds = time.perf_counter() - t0
    passed = sum(r["ok"] for r in results)
    per_kind = ", ".join(
        f"{k} {sum(r['ok'] for r in results if r['kind'] == k)}/"
        f"{sum(1 for r in results if r['kind'] == k)}"
        for k in KINDS
        if any(r["kind"] == k for r in results)
    )
    pct = 100.0 * passed / max(len(results), 1)
    print(f"score {passed}/{len(results)} ({pct:.1f}%): {per_kind}; {name}, "
          f"{'greedy' if args.temperature == 0 else f'temperature {args.temperature}'}, "
          f"{seconds:.1f} s")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"model": name, "passed": passed, "total": len(results),
                                         "results": results}, indent=1) + "\n")  # fmt: skip
    return 0


def _short(text: str, width: int = 60) -> str:
    one = json.dumps(text, ensure_ascii=False)
    return one if len(one) <= width else one[: width - 1] + "…"


def _bar(done: int, total: int, label: str) -> None:
    width = 30
    filled = width * done // max(total, 1)
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label:15s}")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()
