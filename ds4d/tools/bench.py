"""`ds4d bench`: prefill and generation speed at growing context frontiers.

A linear sweep in the manner of ds4-bench: the prompt file is tokenized once; for each
frontier ctx-start, ctx-start+step, ... ctx-max the session is extended by prefilling only
the span added since the previous frontier (so each row measures prefill at that depth),
then `--gen-tokens` tokens are generated greedily (end-of-generation tokens skipped so
every row generates the same count) and rewound, leaving the prompt state for the next
span. Output: a table on stdout, `--csv FILE`, `--plot FILE.png`.

`--batch N` measures batched decode instead: 1, 2, 4, ... N sessions (each prefilled
with its own `--ctx-start` prompt tokens) generate `--gen-tokens` greedy tokens together,
one Engine.eval_batch per step, and each count's aggregate tokens/s is reported against
one session's (`--csv` writes those rows).

`--bandwidth` measures the machine's multi-threaded read bandwidth (the decode bound) and
exits; `--profile` adds, at each frontier, a profiled prefill of the span it added (its time
per prompt token by part, each matmul type's multiply-adds against the compute peak of the
precision in force) and a profiled generation that splits a token's time into its parts
(see ds4d/tools/bench_profile.py), written with `--profile-csv` / `--profile-plot`.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ds4d.daemon.config import add_engine_flags, open_engine
from ds4d.daemon.exitcodes import CliError

if TYPE_CHECKING:  # imported where used: `ds4d bench --help` loads no native library
    from ds4d.engine.engine import Engine, Session
    from ds4d.engine.native import MacPeak
    from ds4d.tools.bench_profile import Part

CSV_FIELDS = (
    "ctx",
    "prefill_tokens",
    "prefill_s",
    "prefill_tps",
    "gen_tokens",
    "gen_s",
    "gen_tps",
    "kv_bytes",
    "peak_rss_bytes",
)


@dataclass
class Row:
    ctx: int
    prefill_tokens: int
    prefill_s: float
    prefill_tps: float
    gen_tokens: int
    gen_s: float
    gen_tps: float
    kv_bytes: int
    peak_rss_bytes: int


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", help="GGUF file (default: the embedded model)")
    p.add_argument("--prompt-file", help="text to prefill (repeated if short); required "
                   "unless --bandwidth")  # fmt: skip
    p.add_argument("--ctx-start", type=int, default=512, help="first frontier (tokens)")
    p.add_argument("--ctx-max", type=int, default=4096, help="last frontier (tokens)")
    p.add_argument("--step-incr", type=int, default=512, help="tokens added per frontier")
    p.add_argument("--gen-tokens", type=int, default=64, help="greedy tokens per frontier")
    p.add_argument("--threads", type=int, default=None, help="default: physical cores")
    add_engine_flags(p, "kv_type", "weights", "precision")
    p.add_argument("--csv", type=Path, help="write rows as CSV to this file")
    p.add_argument("--plot", type=Path, help="write a PNG of t/s against context")
    p.add_argument(
        "--bandwidth",
        action="store_true",
        help="measure the read bandwidth of --threads threads and exit",
    )
    p.add_argument(
        "--bandwidth-mib",
        type=int,
        default=None,
        help="buffer streamed by the bandwidth measure (default: 512 for --bandwidth, far "
        "above the caches; for --profile, the bytes one decode step reads at each frontier)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="also profile the prefill and a generation at each frontier (time per part)",
    )
    p.add_argument("--profile-csv", type=Path, help="write the profile as CSV (implies --profile)")
    p.add_argument("--profile-plot", type=Path,
                   help="write the profile as a PNG (implies --profile)")  # fmt: skip
    p.add_argument("--batch", type=int, metavar="N",
                   help="decode 1, 2, 4, ... N sessions together and report aggregate t/s"
                   " against one (prompts of --ctx-start tokens)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    if args.bandwidth:
        return run_bandwidth(args)
    if not args.prompt_file:
        raise CliError("--prompt-file is required (unless --bandwidth)", 2)
    if args.batch is not None:
        return run_batch(args)
    _check_sweep(args)
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise CliError("--plot needs matplotlib: pip install 'ds4d[plot]'", 2)
    engine = open_engine(args, "kv_type", "weights", "precision")
    text = _read_prompt(args.prompt_file)
    tokens = _prompt_tokens(engine, text, args.ctx_max)
    info = engine.info
    print(
        f"# model {info.name} ({info.family}, {info.quant}, {info.file_bytes / 1e6:.1f} MB), "
        f"threads {engine.threads}, kv {engine.kv_type}, precision {info.precision}, "
        f"kernels {_kernels()}, "
        f"weights {info.weight_memory}, prompt {args.prompt_file}",
        flush=True,
    )
    profiler = None
    if args.profile or args.profile_csv or args.profile_plot:
        profiler = _Profiler(engine, args.bandwidth_mib)
    rows = sweep(engine, tokens, args.ctx_start, args.ctx_max, args.step_incr, args.gen_tokens,
                 after_generation=profiler,
                 after_prefill=profiler.prefill if profiler else None)  # fmt: skip
    if args.csv:
        write_csv(args.csv, rows)
    if args.plot:
        write_plot(
            args.plot,
            rows,
            title=f"ds4d bench: {info.name}, {engine.threads} threads, kv {engine.kv_type}",
        )
    if profiler is not None:
        profiler.report(args, title=f"ds4d profile: {info.name}, {engine.threads} threads, "
                        f"precision {info.precision}")  # fmt: skip
    return 0


BATCH_FIELDS = ("sessions", "prompt_tokens", "gen_tokens", "gen_s", "gen_tps", "vs_one")


@dataclass
class BatchRow:
    sessions: int
    prompt_tokens: int
    gen_tokens: int  # per session
    gen_s: float
    gen_tps: float  # all sessions' tokens / gen_s
    vs_one: float  # gen_tps / one session's gen_tps


def batch_counts(n: int) -> list[int]:
    """1, 2, 4, ... below n, then n."""
    counts = [1]
    while counts[-1] * 2 < n:
        counts.append(counts[-1] * 2)
    return counts + ([n] if n > 1 else [])


def run_batch(args: argparse.Namespace) -> int:
    if args.batch < 1 or args.ctx_start < 1 or args.gen_tokens < 1:
        raise CliError("--batch, --ctx-start and --gen-tokens must be ≥ 1", 2)
    engine = open_engine(args, "weights", "precision")
    # Each session its own prompt: consecutive spans of the text.
    tokens = _prompt_tokens(engine, _read_prompt(args.prompt_file), args.ctx_start * args.batch)
    info = engine.info
    print(f"# model {info.name} ({info.family}, {info.quant}), threads {engine.threads}, "
          f"precision {info.precision}, kernels {_kernels()}, weights {info.weight_memory}, "
          f"{args.ctx_start}-token "
          f"prompts, {args.gen_tokens} greedy "
          "tokens per session", flush=True)  # fmt: skip
    print(f"{'sessions':>8} {'gen t/s':>9} {'per session':>12} {'vs one':>7}", flush=True)
    rows: list[BatchRow] = []
    for n in batch_counts(args.batch):
        prompts = [tokens[i * args.ctx_start : (i + 1) * args.ctx_start] for i in range(n)]
        gen_s = batch_decode(engine, prompts, args.gen_tokens)
        tps = n * args.gen_tokens / gen_s
        row = BatchRow(n, args.ctx_start, args.gen_tokens, gen_s, tps,
                       tps / rows[0].gen_tps if rows else 1.0)  # fmt: skip
        rows.append(row)
        print(f"{n:>8} {tps:>9.1f} {tps / n:>12.1f} {row.vs_one:>6.2f}x", flush=True)
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with args.csv.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=BATCH_FIELDS)
            w.writeheader()
            for r in rows:
                w.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v)
                            for k, v in asdict(r).items()})  # fmt: skip
    engine.close()
    return 0


def batch_decode(engine: Engine, prompts: list[list[int]], gen_tokens: int) -> float:
    """Prefills one session per prompt, then times gen_tokens greedy steps of all of them
    together (end-of-generation tokens never chosen); seconds."""
    stop_ids = np.fromiter(engine.tokenizer.eog_ids, dtype=np.int64)
    sessions = [engine.new_session(len(p) + gen_tokens) for p in prompts]
    try:
        for s, p in zip(sessions, prompts, strict=True):
            s.eval(p)
        t0 = time.perf_counter()
        for _ in range(gen_tokens):
            steps: list[tuple[Session, list[int]]] = []
            for s in sessions:
                logits = s.compute_logits().copy()
                logits[stop_ids] = -np.inf
                steps.append((s, [int(np.argmax(logits))]))
            engine.eval_batch(steps)
        return time.perf_counter() - t0
    finally:
        for s in sessions:
            s.close()


def run_bandwidth(args: argparse.Namespace) -> int:
    from ds4d.engine import EngineError, native

    mib = 512 if args.bandwidth_mib is None else args.bandwidth_mib
    if mib < 1:
        raise CliError("--bandwidth-mib must be ≥ 1", 2)
    try:
        with native.Pool(args.threads) as pool:
            huge = native.read_bandwidth(pool, mib << 20, huge_pages=True)
            small = native.read_bandwidth(pool, mib << 20, huge_pages=False)
            threads = pool.threads
    except EngineError as e:
        raise CliError(str(e)) from None
    print(f"read bandwidth: {huge / 1e9:.1f} GB/s on huge pages, {small / 1e9:.1f} GB/s on "
          f"4 KB pages ({threads} threads, {mib} MiB buffer, 8 streams per thread, "
          "best of 5)")  # fmt: skip
    return 0


class _Profiler:
    """The --profile hooks of the sweep: a profiled prefill and generation at every frontier."""

    def __init__(self, engine: Engine, bandwidth_mib: int | None) -> None:
        self.engine = engine
        self.bandwidth_mib = bandwidth_mib
        self.parts: list[Part] = []
        self.peaks: dict[int, MacPeak] | None = None  # measured at the first prefill

    def prefill(self, session: Session, ctx: int, span: list[int]) -> None:
        """Prefills the span again, profiled (rewound to where it started: the session is
        back at ctx after)."""
        from ds4d.tools import bench_profile as bp

        if not span:
            return
        if self.peaks is None:
            self.peaks = bp.model_peaks(self.engine)
            bp.print_peaks(self.peaks, self.engine.info.precision)
        session.rewind(ctx - len(span))
        parts, pool = bp.profile_prefill(self.engine, session, span, self.peaks)
        bp.print_prefill_parts(parts)
        bp.print_pool(pool, per="chunk")
        self.parts += parts

    def _bound(self, ctx: int) -> float:
        """The read bandwidth over a buffer of the bytes a decode step reads at ctx (or
        --bandwidth-mib), on huge pages: the bound the profile's parts are held against."""
        from ds4d.engine import native
        from ds4d.tools.bench_profile import token_stream_bytes

        n = (self.bandwidth_mib << 20) if self.bandwidth_mib else token_stream_bytes(
            self.engine, ctx)  # fmt: skip
        bw = native.read_bandwidth(self.engine.pool, n)
        print(f"# read bandwidth {bw / 1e9:.1f} GB/s ({self.engine.threads} threads, "
              f"{n / 1e6:.0f} MB on huge pages): the bound of the profile", flush=True)  # fmt: skip
        return bw

    def __call__(self, session: Session, ctx: int, gen_tokens: int, stop_ids: np.ndarray) -> None:
        from ds4d.tools.bench_profile import print_parts, print_pool, profile_decode

        if gen_tokens == 0:
            return
        bound = self._bound(ctx)
        parts, pool = profile_decode(self.engine, session, gen_tokens, stop_ids, bound)
        session.rewind(ctx)
        print_parts(parts)
        print_pool(pool)
        self.parts += parts

    def report(self, args: argparse.Namespace, title: str) -> None:
        from ds4d.tools.bench_profile import write_parts_csv, write_parts_plot

        if args.profile_csv and self.parts:
            write_parts_csv(args.profile_csv, self.parts)
        if args.profile_plot and self.parts:
            write_parts_plot(args.profile_plot, self.parts, title)


def sweep(
    engine: Engine,
    tokens: list[int],
    ctx_start: int,
    ctx_max: int,
    step: int,
    gen_tokens: int,
    after_generation: Callable[[Session, int, int, np.ndarray], None] | None = None,
    after_prefill: Callable[[Session, int, list[int]], None] | None = None,
) -> list[Row]:
    """Runs the sweep on one session and returns one Row per frontier (also printed).
    after_prefill(session, ctx, span) and then after_generation(session, ctx, gen_tokens,
    stop_ids), if given, run at each frontier after the timed generation (the session rewound
    to ctx; span: the tokens its prefill added), and must leave it at ctx."""
    session = engine.new_session(ctx_max + gen_tokens)
    stop_ids = np.fromiter(engine.tokenizer.eog_ids, dtype=np.int64)
    print(
        f"{'ctx':>7} {'prefill':>8} {'prefill t/s':>12} {'gen t/s':>9} {'KV MB':>8} "
        f"{'peak RSS MB':>12}",
        flush=True,
    )
    rows: list[Row] = []
    frontier = 0
    for ctx in range(ctx_start, ctx_max + 1, step):
        span = tokens[frontier:ctx]
        t0 = time.perf_counter()
        session.eval(span)
        prefill_s = time.perf_counter() - t0
        gen_s = _generate_greedy(session, gen_tokens, stop_ids)
        session.rewind(ctx)
        frontier = ctx
        row = Row(
            ctx=ctx,
            prefill_tokens=len(span),
            prefill_s=prefill_s,
            prefill_tps=len(span) / prefill_s,
            gen_tokens=gen_tokens,
            gen_s=gen_s,
            gen_tps=gen_tokens / gen_s if gen_tokens else 0.0,
            kv_bytes=session.kv_bytes,
            peak_rss_bytes=_peak_rss(),
        )
        rows.append(row)
        print(
            f"{row.ctx:>7} {row.prefill_tokens:>8} {row.prefill_tps:>12.1f} "
            f"{row.gen_tps:>9.1f} {row.kv_bytes / 1e6:>8.1f} "
            f"{row.peak_rss_bytes / 1e6:>12.1f}",
            flush=True,
        )
        if after_prefill is not None:
            after_prefill(session, ctx, span)
        if after_generation is not None:
            after_generation(session, ctx, gen_tokens, stop_ids)
    session.close()
    return rows


def _generate_greedy(session: Session, n: int, stop_ids: np.ndarray) -> float:
    """Greedy decode of n tokens, never choosing an end-of-generation token; seconds."""
    t0 = time.perf_counter()
    for _ in range(n):
        logits = session.compute_logits().copy()
        logits[stop_ids] = -np.inf
        session.eval([int(np.argmax(logits))])
    return time.perf_counter() - t0


def write_csv(path: Path, rows: list[Row]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow(
                {k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in asdict(r).items()}
            )


def write_plot(path: Path, rows: list[Row], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    ctx = [r.ctx for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(ctx, [r.prefill_tps for r in rows], marker="o", label="prefill t/s")
    ax.plot(ctx, [r.gen_tps for r in rows], marker="s", label="generation t/s")
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("tokens / second")
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _check_sweep(args: argparse.Namespace) -> None:
    if args.ctx_start < 1 or args.step_incr < 1 or args.gen_tokens < 0:
        raise CliError("--ctx-start and --step-incr must be ≥ 1, --gen-tokens ≥ 0", 2)
    if args.ctx_max < args.ctx_start:
        raise CliError("--ctx-max must be ≥ --ctx-start", 2)


def _kernels() -> str:
    """The native kernel level in force (DS4N_SIMD or the best the CPU runs)."""
    from ds4d.engine import native

    return native.SIMD_NAMES.get(native.simd_level(), str(native.simd_level()))


def _read_prompt(path: str) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise CliError(f"cannot read --prompt-file {path}: {e.strerror}") from None
    if not text.strip():
        raise CliError(f"--prompt-file {path} is empty")
    return text


def _prompt_tokens(engine: Engine, text: str, needed: int) -> list[int]:
    # Tokenize only a prefix that surely covers `needed` tokens (a token is rarely under
    # 2 bytes): encoding a whole novel would inflate the peak RSS the bench reports.
    chars = needed * 8
    while True:
        tokens = engine.tokenizer.encode(text[:chars], special=False)
        if len(tokens) > needed or chars >= len(text):
            break
        chars *= 2
    if len(tokens) < needed:
        reps = -(-needed // len(tokens))
        print(
            f"# prompt has {len(tokens)} tokens; repeated {reps}x to reach {needed}",
            file=sys.stderr,
        )
        tokens = tokens * reps
    return tokens[:needed]


def _peak_rss() -> int:
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb * 1024 if sys.platform != "darwin" else kb  # macOS reports bytes
