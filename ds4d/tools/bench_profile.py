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

The prompt's prefill is profiled the same way (profile_prefill: the span a frontier adds,
prefilled in the engine's chunks), per prompt token: matmul <type> (the layers' weight
matmuls of a chunk), output head (the last token's logits), attention (the pool's other work:
attention over the chunk, and the FFN's activation, a dispatch of its own when a chunk has
several tokens), pool sync, native serial and python. Prefill is bound by arithmetic, not by memory, so each matmul part is
held against the compute peak instead: its multiply-adds (rows x K x tokens, summed from
the logged calls) over its time, and the time they would take at the peak of the
instruction its kernel runs at the engine's precision (ds4n_mac_peak: one core's measured
rate, times the engine's threads) over the time taken.
"""

from __future__ import annotations

import csv
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ds4d.engine import native
from ds4d.engine.decoder import DecoderModel
from ds4d.engine.engine import Engine, Session
from ds4d.engine.family import FamilyModel
from ds4d.engine.sampler import SamplingParams, make_rng, sample

PROFILE_FIELDS = ("phase", "ctx", "part", "ms_per_token", "share", "bytes_per_token", "gb_per_s",
                  "fraction_of_bound", "macs_per_token", "gmac_per_s",
                  "fraction_of_peak")  # fmt: skip
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
    phase: str = "decode"  # or "prefill": ms per prompt token, no bytes (not bound by them)
    macs_per_token: int = 0  # weight multiply-adds (prefill's matmul parts; 0: not counted)
    gmac_per_s: float = 0.0
    fraction_of_peak: float = 0.0  # MACs / compute peak over the time taken (0: no peak)


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


def _part_name(e: native.ProfileEntry, n_vocab: int, kind: str) -> str:
    """An entry's part: the output head (its rows are the vocabulary), else `kind` and its type."""
    name = native.TYPES_BY_ID.get(e.type, str(e.type))
    return f"output head {name}" if e.rows == n_vocab else f"{kind} {name}"


def _split(engine: Engine, entries: list[native.ProfileEntry], totals: dict[str, int],
           total_s: float, sample_s: float, n: int, ctx: int, bandwidth: float) -> list[Part]:  # fmt: skip
    n_vocab = engine.info.n_vocab
    by_part: dict[str, list[float]] = {}  # name -> [wall s, bytes]
    for e in entries:
        if e.prefill:
            continue
        acc = by_part.setdefault(_part_name(e, n_vocab, "matvec"), [0.0, 0.0])
        acc[0] += e.wall_ns / 1e9
        acc[1] += e.calls * e.rows * native.row_bytes(e.type, e.K)
    # Mean keys over the run: the tokens sit at ctx+1 .. ctx+n.
    kv = kv_bytes_read(engine.model, ctx + (n + 1) // 2, engine.kv_type) * n
    python_s = total_s - totals["span_ns"] / 1e9 - sample_s
    rows = [(name, s, b) for name, (s, b) in sorted(by_part.items())]
    attention_s, sync_s, serial_s = _pool_rest(totals, sum(s for s, _ in by_part.values()))
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


def _pool_rest(totals: dict[str, int], matmul_s: float) -> tuple[float, float, float]:
    """Seconds of attention (the dispatches' wall time given neither to a matmul nor to
    synchronisation: the other pool work), pool sync and native serial (between dispatches,
    which never overlap)."""
    sync_s = totals["sync_ns"] / 1e9
    attention_s = totals["wall_ns"] / 1e9 - sync_s - matmul_s
    serial_s = (totals["span_ns"] - totals["wall_ns"]) / 1e9
    return attention_s, sync_s, serial_s


def model_peaks(engine: Engine) -> dict[int, native.MacPeak]:
    """The compute peak of each matrix type of the model's file at the engine's precision,
    by type id (native.mac_peak, scaled by the engine's threads)."""
    gf = engine.gguf
    types = {gf.tensor(n).type for n in gf.tensor_names() if len(gf.tensor(n).shape) >= 2}
    return {t: native.mac_peak(t, engine.info.precision, engine.threads)
            for t in sorted(types) if native.type_supported(t)}  # fmt: skip


def profile_prefill(engine: Engine, session: Session, tokens: list[int],
                    peaks: dict[int, native.MacPeak]) -> tuple[list[Part], PoolStats]:  # fmt: skip
    """Prefills tokens on session as Session.eval does (in the engine's chunks) with the
    native profile on, and returns the split per prompt token (the parts' ms add up to the
    measured time), each matmul part held against peaks[its type], and how the pool's workers
    joined the dispatches (per chunk)."""
    native.Profile.enable()
    try:
        t_start = time.perf_counter()
        session.eval(tokens, on_chunk=lambda done, total: native.Profile.mark())
        native.Profile.mark()
        total_s = time.perf_counter() - t_start
        entries, totals = native.Profile.read()
    finally:
        native.Profile.disable()
    parts = _split_prefill(engine, entries, totals, total_s, len(tokens), session.n_tokens, peaks)
    return parts, pool_stats(totals, totals["passes"])


def _split_prefill(engine: Engine, entries: list[native.ProfileEntry], totals: dict[str, int],
                   total_s: float, n: int, ctx: int,
                   peaks: dict[int, native.MacPeak]) -> list[Part]:  # fmt: skip
    n_vocab = engine.info.n_vocab
    by_part: dict[str, list[float]] = {}  # name -> [wall s, MACs, s at the peak (NaN: none)]
    for e in entries:
        acc = by_part.setdefault(_part_name(e, n_vocab, "matmul"), [0.0, 0.0, 0.0])
        macs = e.tokens * e.rows * e.K
        peak = peaks.get(e.type)
        acc[0] += e.wall_ns / 1e9
        acc[1] += macs
        acc[2] += macs / peak.rate if peak is not None and peak.rate > 0 else math.nan
    rows = [(name, s, m, p) for name, (s, m, p) in sorted(by_part.items())]
    attention_s, sync_s, serial_s = _pool_rest(totals, sum(v[0] for v in by_part.values()))
    python_s = total_s - totals["span_ns"] / 1e9
    rows += [(name, s, 0.0, 0.0) for name, s in (("attention", attention_s),
             ("pool sync", sync_s), ("native serial", serial_s), ("python", python_s))]  # fmt: skip
    rows.append(("token", total_s, sum(r[2] for r in rows), sum(r[3] for r in rows)))
    parts = []
    for name, s, macs, at_peak in rows:
        parts.append(Part(ctx=ctx, part=name, ms_per_token=1e3 * s / n,
                          share=s / total_s if total_s > 0 else 0.0, bytes_per_token=0,
                          gb_per_s=0.0, fraction_of_bound=0.0, phase="prefill",
                          macs_per_token=round(macs / n),
                          gmac_per_s=macs / s / 1e9 if s > 0 else 0.0,
                          fraction_of_peak=at_peak / s if s > 0 and macs and not math.isnan(at_peak)
                          else 0.0))  # fmt: skip
    return parts


def print_peaks(peaks: dict[int, native.MacPeak], precision: str) -> None:
    """One line per type: the instruction, one core's rate and the engine's."""
    for t, p in peaks.items():
        name = native.TYPES_BY_ID.get(t, str(t))
        if not p.instr:
            print(f"# compute peak {name} ({precision}): no probe on this SIMD level", flush=True)
            continue
        per = f" / {p.products} products per MAC" if p.products > 1 else ""
        print(f"# compute peak {name} ({precision}): {p.instr} {p.lane_rate / 1e9:.1f} G MAC/s "
              f"per core{per} = {p.per_core / 1e9:.1f} G weight MAC/s per core, x {p.threads} "
              f"threads = {p.rate / 1e9:.1f} G MAC/s", flush=True)  # fmt: skip


def _cell(value: float, width: int, spec: str, present: bool, unit: str = "") -> str:
    """A right-aligned column of the parts tables, blank where the part has no such figure."""
    return f"{value:{width}{spec}}{unit}" if present else " " * (width + len(unit))


def _part_cells(p: Part) -> str:
    """The columns both parts tables open with: frontier, part, time and share."""
    return f"{p.ctx:>7} {p.part:<22} {p.ms_per_token:9.3f} {100 * p.share:6.1f}%"


def print_prefill_parts(parts: list[Part]) -> None:
    print(f"{'ctx':>7} {'prefill part':<22} {'ms/token':>9} {'share':>7} {'MMAC/token':>11} "
          f"{'G MAC/s':>8} {'of peak':>8}")  # fmt: skip
    for p in parts:
        mm = _cell(p.macs_per_token / 1e6, 11, ".2f", p.macs_per_token > 0)
        g = _cell(p.gmac_per_s, 8, ".1f", p.macs_per_token > 0)
        fr = _cell(100 * p.fraction_of_peak, 7, ".1f", p.fraction_of_peak > 0, "%")
        print(f"{_part_cells(p)} {mm} {g} {fr}")
    token = parts[-1]
    peak_ms = token.ms_per_token * token.fraction_of_peak
    if peak_ms > 0:
        print(f"# ctx {token.ctx} prefill: {1e3 / token.ms_per_token:.1f} t/s profiled; the "
              f"compute peak ({token.macs_per_token / 1e6:.1f} M MAC per token) is "
              f"{1e3 / peak_ms:.1f} t/s", flush=True)  # fmt: skip


def print_pool(stats: PoolStats, per: str = "token") -> None:
    print(f"# pool: {stats.dispatches_per_token:.0f} dispatches per {per}, workers join "
          f"{stats.join_us:.1f} us after a dispatch starts, absent from "
          f"{100 * stats.absent:.1f}% of dispatches", flush=True)  # fmt: skip


def print_parts(parts: list[Part]) -> None:
    print(f"{'ctx':>7} {'part':<22} {'ms/token':>9} {'share':>7} {'MB/token':>9} {'GB/s':>7} "
          f"{'of bound':>9}")  # fmt: skip
    for p in parts:
        mb = _cell(p.bytes_per_token / 1e6, 9, ".2f", p.bytes_per_token > 0)
        gb = _cell(p.gb_per_s, 7, ".1f", p.bytes_per_token > 0)
        fr = _cell(100 * p.fraction_of_bound, 8, ".1f", p.bytes_per_token > 0, "%")
        print(f"{_part_cells(p)} {mb} {gb} {fr}")
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
    """One panel per phase (decode, then prefill), one stacked bar per context: ms per token
    by part, and the bound as a marker (decode: the read bandwidth's; prefill: the compute
    peak's)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    phases = [ph for ph in ("decode", "prefill") if any(p.phase == ph for p in parts)]
    n_ctx = len({p.ctx for p in parts})
    fig, axes = plt.subplots(len(phases), 1, squeeze=False,
                             figsize=(11, len(phases) * (1.4 + 0.6 * n_ctx)))  # fmt: skip
    for ax, phase in zip(axes[:, 0], phases, strict=True):
        _plot_phase(ax, [p for p in parts if p.phase == phase], phase)
    axes[0, 0].set_title(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_phase(ax: Any, parts: list[Part], phase: str) -> None:
    ctxs = sorted({p.ctx for p in parts})
    names = [p.part for p in parts if p.ctx == ctxs[0] and p.part != "token"]
    for p in parts:  # parts that show up only at some frontiers
        if p.part != "token" and p.part not in names:
            names.append(p.part)
    y = np.arange(len(ctxs))
    left = np.zeros(len(ctxs))
    for name in names:
        ms = np.array([sum(p.ms_per_token for p in parts if p.ctx == c and p.part == name)
                       for c in ctxs])  # fmt: skip
        ax.barh(y, ms, left=left, label=name)
        left += ms
    totals = [next(p for p in parts if p.ctx == c and p.part == "token") for c in ctxs]
    if phase == "decode":
        bound = [t.ms_per_token * t.fraction_of_bound for t in totals]
        label, unit = "bandwidth bound", "ms per decoded token"
    else:
        bound = [t.ms_per_token * t.fraction_of_peak for t in totals]
        label, unit = "compute peak", "ms per prompt token (prefill)"
    ax.scatter(bound, y, marker="|", s=400, color="black", zorder=3, label=label)
    ax.set_yticks(y, [f"ctx {c}" for c in ctxs])
    ax.set_xlabel(unit)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars
