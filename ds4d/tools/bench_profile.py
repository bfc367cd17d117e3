"""`ds4d bench --profile`: where the time of one decoded token goes, against the machine's bound.

The native library times every pool dispatch and every matmul part (ds4n_profile_*, off
unless asked for); this module runs a profiled generation at a context frontier and splits
each token's wall time into:

  matvec <type>   the layers' weight matvecs, by quant type
  output head     the vocabulary projection
  attention       the pool's other work (attention over the KV cache)
  pool sync       each dispatch's wall time beyond its busiest thread's work: publishing
                  the job, waking the workers, the barrier at its end
  native serial   the forward pass's single-threaded steps between dispatches (norms, RoPE,
                  KV writes, split-softmax merges)
  sampling        picking the next token from the logits (ds4d.engine.sampler)
  python          everything else: the Python side of Session.eval, ctypes, the loop

Each part that reads memory is also given as a fraction of the bound: the time its bytes
would take at the read bandwidth measured by ds4n_read_bandwidth, over the time it took.
"""

from __future__ import annotations

import csv
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ds4d.engine import native
from ds4d.engine.decoder import DecoderModel
from ds4d.engine.engine import Engine, Session
from ds4d.engine.family import FamilyModel
from ds4d.engine.sampler import SamplingParams, make_rng, sample

PROFILE_FIELDS = ("ctx", "part", "ms_per_token", "share", "bytes_per_token", "gb_per_s",
                  "fraction_of_bound")  # fmt: skip
# A typical chat request's sampler: what a served token pays for.
PROFILE_SAMPLING = SamplingParams(temperature=0.7, top_k=40, top_p=0.95, seed=0)


@dataclass
class Part:
    ctx: int
    part: str
    ms_per_token: float
    share: float  # of the token's wall time
    bytes_per_token: int  # memory the part must read (0: not a streaming part)
    gb_per_s: float
    fraction_of_bound: float  # bytes / bandwidth over the time taken (0: not applicable)


def kv_bytes_read(model: FamilyModel, n_keys: int, kv_type: str = "f32") -> int:
    """K and V bytes one decode step reads at n_keys positions, in the KV type (0 if
    unknown: a family with its own KV format)."""
    if not isinstance(model, DecoderModel):
        return 0
    return model.kv_token_bytes(kv_type) * n_keys


@dataclass
class PoolStats:
    """How the pool's workers joined the profiled dispatches."""

    dispatches_per_token: float
    join_us: float  # mean delay from a dispatch's start to a worker's first share
    absent: float  # fraction of (dispatch, worker) pairs where the worker ran no share


def pool_stats(totals: dict[str, int], n_tokens: int) -> PoolStats:
    pairs = totals["joins"] + totals["absent"]
    return PoolStats(
        dispatches_per_token=totals["dispatches"] / max(n_tokens, 1),
        join_us=totals["join_ns"] / 1e3 / totals["joins"] if totals["joins"] else 0.0,
        absent=totals["absent"] / pairs if pairs else 0.0,
    )


def token_stream_bytes(engine: Engine, ctx: int) -> int:
    """The bytes one decode step at ctx reads: every tensor of the model (the output head
    included) and the KV of ctx positions in the session's type."""
    gf = engine.gguf
    weights = sum(gf.tensor(name).n_bytes for name in gf.tensor_names())
    return weights + kv_bytes_read(engine.model, ctx, engine.kv_type)


def profile_decode(engine: Engine, session: Session, n_tokens: int, stop_ids: np.ndarray,
                   bandwidth: float) -> tuple[list[Part], PoolStats]:  # fmt: skip
    """Generates n_tokens on session with the native profile on (the session keeps them)
    and returns the per-token split (the parts' ms add up to the measured token time) and
    how the pool's workers joined the dispatches."""
    ctx = session.n_tokens
    rng = make_rng(PROFILE_SAMPLING.seed)
    stop = set(stop_ids.tolist())
    sample_s = 0.0
    session.compute_logits()  # after a rewind this is a forward pass: not part of the profile
    native.Profile.enable()
    try:
        t_start = time.perf_counter()
        for _ in range(n_tokens):
            t0 = time.perf_counter()
            logits = session.compute_logits()
            token = sample(logits, PROFILE_SAMPLING, rng)
            if token in stop:  # keep the count fixed, as the timed generation does
                masked = logits.copy()
                masked[stop_ids] = -np.inf
                token = int(np.argmax(masked))
            sample_s += time.perf_counter() - t0
            session.eval([token])
            native.Profile.mark()
        total_s = time.perf_counter() - t_start
        entries, totals = native.Profile.read()
    finally:
        native.Profile.disable()
    parts = _split(engine, entries, totals, total_s, sample_s, n_tokens, ctx, bandwidth)
    return parts, pool_stats(totals, n_tokens)


def _split(engine: Engine, entries: list[native.ProfileEntry], totals: dict[str, int],
           total_s: float, sample_s: float, n: int, ctx: int, bandwidth: float) -> list[Part]:  # fmt: skip
    n_vocab = engine.info.n_vocab
    names = native.TYPES_BY_ID
    by_part: dict[str, list[float]] = {}  # name -> [wall s, bytes]
    for e in entries:
        if e.prefill:
            continue
        head = e.rows == n_vocab
        name = f"output head {names.get(e.type, e.type)}" if head else (
            f"matvec {names.get(e.type, e.type)}")  # fmt: skip
        acc = by_part.setdefault(name, [0.0, 0.0])
        acc[0] += e.wall_ns / 1e9
        acc[1] += e.calls * e.rows * native.row_bytes(e.type, e.K)
    # Mean keys over the run: the tokens sit at ctx+1 .. ctx+n.
    kv = kv_bytes_read(engine.model, ctx + (n + 1) // 2, engine.kv_type) * n
    serial_s = (totals["span_ns"] - totals["wall_ns"]) / 1e9  # dispatches never overlap
    python_s = total_s - totals["span_ns"] / 1e9 - sample_s
    rows = [(name, s, b) for name, (s, b) in sorted(by_part.items())]
    sync_s = totals["sync_ns"] / 1e9
    # The dispatches' wall time given neither to a matmul nor to synchronisation: the other
    # pool work (attention).
    attention_s = totals["wall_ns"] / 1e9 - sync_s - sum(s for s, _ in by_part.values())
    rows += [("attention", attention_s, kv), ("pool sync", sync_s, 0),
             ("native serial", serial_s, 0), ("sampling", sample_s, 0),
             ("python", python_s, 0)]  # fmt: skip
    stream_bytes = sum(b for _, _, b in rows)
    rows.append(("token", total_s, stream_bytes))
    parts = []
    for name, s, b in rows:
        per_token_bytes = int(b / n)
        gbps = b / s / 1e9 if s > 0 and b else 0.0
        frac = (b / bandwidth) / s if s > 0 and b else 0.0
        parts.append(Part(ctx=ctx, part=name, ms_per_token=1e3 * s / n,
                          share=s / total_s if total_s > 0 else 0.0,
                          bytes_per_token=per_token_bytes, gb_per_s=gbps,
                          fraction_of_bound=frac))  # fmt: skip
    return parts


def print_pool(stats: PoolStats) -> None:
    print(f"# pool: {stats.dispatches_per_token:.0f} dispatches per token, workers join "
          f"{stats.join_us:.1f} us after a dispatch starts, absent from "
          f"{100 * stats.absent:.1f}% of dispatches", flush=True)  # fmt: skip


def print_parts(parts: list[Part]) -> None:
    print(f"{'ctx':>7} {'part':<22} {'ms/token':>9} {'share':>7} {'MB/token':>9} {'GB/s':>7} "
          f"{'of bound':>9}")  # fmt: skip
    for p in parts:
        mb = f"{p.bytes_per_token / 1e6:9.2f}" if p.bytes_per_token else f"{'':9}"
        gb = f"{p.gb_per_s:7.1f}" if p.bytes_per_token else f"{'':7}"
        fr = f"{100 * p.fraction_of_bound:8.1f}%" if p.bytes_per_token else f"{'':9}"
        print(f"{p.ctx:>7} {p.part:<22} {p.ms_per_token:9.3f} {100 * p.share:6.1f}% {mb} {gb} {fr}")
    token = parts[-1]
    bound_ms = token.ms_per_token * token.fraction_of_bound
    if bound_ms > 0:
        print(f"# ctx {token.ctx}: {1e3 / token.ms_per_token:.1f} t/s profiled; the bound "
              f"({token.bytes_per_token / 1e6:.1f} MB per token) is {1e3 / bound_ms:.1f} t/s",
              flush=True)  # fmt: skip


def write_parts_csv(path: Path, parts: list[Part]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=PROFILE_FIELDS)
        w.writeheader()
        for p in parts:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v)
                        for k, v in asdict(p).items()})  # fmt: skip


def write_parts_plot(path: Path, parts: list[Part], title: str) -> None:
    """One stacked bar per context: ms per token by part, and the bound as a marker."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    ctxs = sorted({p.ctx for p in parts})
    names = [p.part for p in parts if p.ctx == ctxs[0] and p.part != "token"]
    for p in parts:  # parts that show up only at some frontiers
        if p.part != "token" and p.part not in names:
            names.append(p.part)
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.6 * len(ctxs)))
    y = np.arange(len(ctxs))
    left = np.zeros(len(ctxs))
    for name in names:
        ms = np.array([sum(p.ms_per_token for p in parts if p.ctx == c and p.part == name)
                       for c in ctxs])  # fmt: skip
        ax.barh(y, ms, left=left, label=name)
        left += ms
    bound = [next(p.ms_per_token * p.fraction_of_bound for p in parts
                  if p.ctx == c and p.part == "token") for c in ctxs]  # fmt: skip
    ax.scatter(bound, y, marker="|", s=400, color="black", zorder=3, label="bandwidth bound")
    ax.set_yticks(y, [f"ctx {c}" for c in ctxs])
    ax.set_xlabel("ms per decoded token")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="lower right", ncol=2)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
