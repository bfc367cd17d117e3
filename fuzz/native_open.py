"""Structure-aware fuzzing of what ds4d reads from disk into the C library.

GGUF: each seed (a tiny llama, the synthetic DeepSeek V4, SmolLM2 and every kit family)
is mutated where its structure lies (counts, lengths, value and tensor types, dimensions,
offsets, the alignment, routing-table entries, truncation, noise in the index) and opened
through the native open path: GGUF validation (GGUFFile), the family's binding
(`family.load`), a session and a two-token forward pass. Seeds whose tokenizer builds in
well under a second (tiny llama, DeepSeek V4) go through `Engine.open` itself; for the
large vocabularies the Python tokenizer (fuzzed by tests/engine/test_gguf_mutation.py) would
cost seconds per mutant and no native code, so it is left out.

Checkpoints: a session payload of each seed (tokens, logits, KV rows; DeepSeek V4's own
state header) is mutated the same way (header fields, token ids, KV section words,
truncation, noise) and loaded into a fresh session.

Every mutant must be refused with a message whose first line names the problem
(ModelLoadError / EngineError) or
load consistently: every tensor inside the file and apart from the others, each bound
tensor of the type and shape it had in the seed unless its table entry was the mutated
field, the forward pass working; a loaded checkpoint must hold in-vocabulary tokens
within its context and take the next token. Anything else (another exception, a crash,
an ASan/UBSan report under `make check-sanitize`'s environment) is a finding: the mutant
is written to --crash-dir and the run fails.

    python -m fuzz.native_open --budget 10000 [--seconds S] [--seeds a,b] [--crash-dir DIR]
`make fuzz-native` runs it under ASan + UBSan.
"""

from __future__ import annotations

import argparse
import importlib
import io
import struct
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ds4d.engine import engine as E
from ds4d.engine import native
from ds4d.engine.errors import EngineError, ModelLoadError
from ds4d.engine.gguf_file import GGUFFile
from tests.helpers.gguf_structure import Field, structure, write_tiny_model

# Seeds: how to make each, and whether Engine.open (with its tokenizer) is cheap enough.
FULL_OPEN = {"tiny-llama", "deepseek4"}


def _kit(family: str) -> Callable[[Path], Path]:
    def make(_: Path) -> Path:
        from tests.helpers.kit import kit_model

        return kit_model(family)

    return make


def _tiny(d: Path) -> Path:
    return write_tiny_model(d / "tiny-llama.gguf")


def _ds4(d: Path) -> Path:
    from ds4d.tools.synth import write_deepseek4

    path = d / "deepseek4.gguf"
    write_deepseek4(path, seed=3)
    return path


def _smollm2(_: Path) -> Path:
    from ds4d.engine.default_model import default_model_path

    return default_model_path()


def seed_makers() -> dict[str, Callable[[Path], Path]]:
    from tests.helpers.kit import kit_families

    makers: dict[str, Callable[[Path], Path]] = {
        "tiny-llama": _tiny,
        "deepseek4": _ds4,
        "smollm2": _smollm2,
    }
    for family in kit_families():
        makers[family] = _kit(family)
    return makers


# Relative share of the GGUF budget per seed: cheap seeds get many mutants; a seed whose
# index holds a 150k-260k token vocabulary costs a second or more per open, so few.
# Checkpoint mutants cost the same for every seed and are shared out evenly.
GGUF_WEIGHT = {"tiny-llama": 40, "deepseek4": 30, "smollm2": 6, "phi3": 6}
DEFAULT_WEIGHT = 1


# ---- mutation ----------------------------------------------------------------------------

Patch = tuple[int, bytes]  # write these bytes at this offset


@dataclass
class Mutant:
    what: str
    patches: list[Patch]
    cut: int | None = None  # truncate to this length
    field: str = ""  # the structural field changed, when one was


def edge_value(value: int, size: int, rng: np.random.Generator) -> int:
    top = (1 << (8 * size)) - 1
    choices = [0, 1, 2, 3, 4, 7, 8, 16, 31, 32, 33, 64, 255, 256, 1024, 4096, 65535, 65536,
               2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, top, value + 1,
               value - 1, value * 2, value + 32, value - 32, value // 2, value + 4096,
               value ^ (1 << int(rng.integers(8 * size))), int(rng.integers(0, 1 << 16))]  # fmt: skip
    return int(choices[int(rng.integers(len(choices)))]) & top


class GGUFMutator:
    """Mutants of one GGUF, described as patches so a large file is never copied whole."""

    def __init__(self, path: Path, gf: GGUFFile | None = None) -> None:
        self.size = path.stat().st_size
        self.fields: list[Field] = structure(path)
        self.offsets = [f for f in self.fields if f.what.endswith(" offset")]
        self.types = [f for f in self.fields if f.what.endswith(" type") and "." in f.what
                      and not f.what.endswith("item type")]  # fmt: skip
        self.index_end = max(f.offset + f.size for f in self.fields)
        gf = gf or GGUFFile(path)
        self.data_start = min(t.offset for t in gf.index.tensors)
        self.alignment = int(gf.get("general.alignment", 32))
        # Id tables inside tensor data (DeepSeek V4's hash routing: token -> expert ids).
        self.id_tables = [(t.offset, t.n_bytes) for t in gf.index.tensors
                          if t.name.endswith("ffn_gate_tid2eid.weight")]  # fmt: skip
        with open(path, "rb") as f:
            self.head = f.read(self.index_end + 64)

    def mutants(self, rng: np.random.Generator) -> Iterator[Mutant]:
        while True:
            yield self.one(rng)

    def one(self, rng: np.random.Generator) -> Mutant:
        kind = int(rng.integers(100))
        if kind < 50:  # one structural field to an edge value
            f = self.fields[int(rng.integers(len(self.fields)))]
            v = edge_value(f.value, f.size, rng)
            return Mutant(f"{f.what} = {v}", [(f.offset, v.to_bytes(f.size, "little"))],
                          field=f.what)  # fmt: skip
        if kind < 58 and self.types:  # a tensor type to another known (or unknown) type
            f = self.types[int(rng.integers(len(self.types)))]
            ids = [*native.TYPES.values(), 4, 5, 15, 24, 26, 31, 40, 41, 1000]
            v = int(ids[int(rng.integers(len(ids)))])
            return Mutant(f"{f.what} = {v}", [(f.offset, v.to_bytes(4, "little"))], field=f.what)
        if kind < 66 and len(self.offsets) > 1:  # a tensor onto another / by an alignment
            a, b = (self.offsets[int(i)] for i in rng.choice(len(self.offsets), 2, replace=False))
            if rng.integers(2):
                v = b.value
            else:
                v = a.value + int(rng.choice([-2, -1, 1, 2])) * self.alignment
            v &= (1 << 64) - 1
            return Mutant(f"{a.what} = {v}", [(a.offset, v.to_bytes(8, "little"))], field=a.what)
        if kind < 74 and self.id_tables:  # routing-table entries out of range
            off, n = self.id_tables[int(rng.integers(len(self.id_tables)))]
            at = off + 4 * int(rng.integers(n // 4))
            v = int(rng.choice([-1, -(2**31), 2**31 - 1, 256, 4096, int(rng.integers(-64, 64))]))
            return Mutant(f"routing entry at {at} = {v}", [(at, struct.pack("<i", v))],
                          field="id table")  # fmt: skip
        if kind < 82:  # truncation: inside the index, the data, or by a few bytes
            where = int(rng.integers(3))
            if where == 0:
                cut = int(rng.integers(0, self.index_end))
            elif where == 1:
                cut = int(rng.integers(self.data_start, self.size))
            else:
                cut = self.size - int(rng.integers(1, 64))
            return Mutant(f"truncated to {cut} bytes", [], cut=max(cut, 0), field="size")
        if kind < 86:  # two fields at once
            fs = [self.fields[int(i)] for i in rng.choice(len(self.fields), 2, replace=False)]
            patches = []
            for f in fs:
                patches.append(
                    (f.offset, edge_value(f.value, f.size, rng).to_bytes(f.size, "little"))
                )
            return Mutant(" and ".join(f.what for f in fs) + " changed", patches,
                          field=fs[0].what)  # fmt: skip
        # byte noise in the header, metadata and tensor index
        at = rng.integers(0, self.index_end, size=int(rng.integers(1, 9)))
        patches = [(int(i), bytes([int(rng.integers(256))])) for i in at]
        return Mutant(f"noise at {sorted(int(i) for i in at)}", patches, field="noise")


class WorkingCopy:
    """A private copy of a seed that mutants are applied to and undone in place."""

    def __init__(self, seed: Path, directory: Path) -> None:
        self.seed = seed
        self.original = seed.read_bytes()
        self.path = directory / f"mutant-{seed.stem}.gguf"
        self.path.write_bytes(self.original)

    def apply(self, m: Mutant) -> None:
        with open(self.path, "r+b") as f:
            for at, data in m.patches:
                f.seek(at)
                f.write(data)
            if m.cut is not None:
                f.truncate(m.cut)

    def undo(self, m: Mutant) -> None:
        with open(self.path, "r+b") as f:
            if m.cut is not None:
                f.seek(m.cut)
                f.write(self.original[m.cut :])
            for at, data in m.patches:
                f.seek(at)
                f.write(self.original[at : at + len(data)])

    def bytes_of(self, m: Mutant) -> bytes:
        data = bytearray(self.original)
        for at, patch in m.patches:
            data[at : at + len(patch)] = patch
        if m.cut is not None:
            del data[m.cut :]
        return bytes(data)


# ---- the target ------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorShape:
    type: int
    shape: tuple[int, ...]


def tensor_table(gf: GGUFFile) -> dict[str, TensorShape]:
    return {t.name: TensorShape(t.type.id, tuple(t.shape)) for t in gf.index.tensors}


class Inconsistent(AssertionError):
    """A mutant that opened although its structure does not hold together."""


def check_spans(gf: GGUFFile) -> None:
    spans = sorted((t.offset, t.n_bytes, t.name) for t in gf.index.tensors)
    for (start, size, name), (after, _, nxt) in zip(spans, spans[1:] + [(gf.file_bytes, 0, "end")],
                                                    strict=True):  # fmt: skip
        if not (0 <= start and start + size <= after):
            raise Inconsistent(
                f"tensor {name} [{start}, {start + size}) runs into {nxt} at {after}"
            )


def open_native(path: Path, full: bool) -> E.Engine:
    """The native open path: Engine.open, or the same steps without the tokenizer."""
    if full:
        return E.Engine.open(path, threads=1)
    gf = GGUFFile(path)
    module = E.FAMILIES.get(gf.architecture)
    if module is None:
        raise ModelLoadError(f"unsupported model architecture {gf.architecture!r}")
    family = importlib.import_module(module)
    pool = native.Pool(1)
    try:
        model = family.load(gf, pool)
    except BaseException:
        pool.close()
        raise
    return E.Engine(gf, family, model, pool, None)


def forward(engine: E.Engine) -> None:
    n_vocab = engine.info.n_vocab
    with engine.new_session(8) as s:
        s.eval([1 % n_vocab, 2 % n_vocab])
        logits = s.compute_logits()
        if logits.shape != (n_vocab,):
            raise Inconsistent(f"logits of shape {logits.shape}, expected ({n_vocab},)")


def run_gguf(path: Path, full: bool, seed_table: dict[str, TensorShape], field: str) -> str:
    """'refused' or an 'opened...' outcome; raises for a finding."""
    try:
        engine = open_native(path, full)
    except ModelLoadError as e:
        one_line(str(e))
        return "refused"
    try:
        check_spans(engine.gguf)
        table = tensor_table(engine.gguf)
        changed = [n for n in table if n in seed_table and table[n] != seed_table[n]]
        # A tensor may differ only when its own entry was the mutated field (its type to
        # one of the same size, its dims in a way the family still accepts, e.g. padding).
        foreign = [n for n in changed if not field.startswith(n + " ")]
        if foreign:
            n = foreign[0]
            raise Inconsistent(f"tensor {n} opened as {table[n]}, seed has {seed_table[n]}")
        forward(engine)
        return "opened (tensor table changed)" if changed else "opened"
    finally:
        engine.close()


def one_line(text: str) -> None:
    """A refusal's first line names the problem (DeepSeek V4's layout check lists further
    problems on the lines after it); never Python's own traceback text."""
    first = text.split("\n", 1)[0]
    if not first.strip() or "Traceback" in text:
        raise AssertionError(f"refusal does not name the problem on its first line: {text!r}")


# ---- checkpoints --------------------------------------------------------------------------

_HDR = E._HEADER  # magic, version, fingerprint, n_tokens, n_vocab, has_logits, kv bytes, kv type


class PayloadMutator:
    def __init__(self, payload: bytes, n_tokens: int, n_vocab: int, has_logits: bool) -> None:
        self.raw = payload
        self.n = n_tokens
        self.n_vocab = n_vocab
        self.tokens_at = _HDR.size
        self.kv_at = _HDR.size + 4 * n_tokens + (4 * n_vocab if has_logits else 0)
        # header fields as (name, offset, size)
        self.fields = [("version", 8, 4), ("n_tokens", 44, 8), ("n_vocab", 52, 4),
                       ("has_logits", 56, 4), ("kv bytes", 60, 8), ("kv type", 68, 8)]  # fmt: skip
        assert _HDR.size == 76

    def one(self, rng: np.random.Generator) -> tuple[str, bytes]:
        data = bytearray(self.raw)
        kind = int(rng.integers(100))
        if kind < 25:
            name, at, size = self.fields[int(rng.integers(len(self.fields)))]
            v = edge_value(int.from_bytes(data[at : at + size], "little"), size, rng)
            data[at : at + size] = v.to_bytes(size, "little")
            return f"payload {name} = {v}", bytes(data)
        if kind < 50 and self.n:
            i = int(rng.integers(self.n))
            v = int(rng.choice([-1, -(2**31), self.n_vocab, self.n_vocab - 1, self.n_vocab + 1,
                                2**31 - 1, int(rng.integers(0, self.n_vocab))]))  # fmt: skip
            struct.pack_into("<i", data, self.tokens_at + 4 * i, v)
            return f"token {i} = {v}", bytes(data)
        if kind < 70:  # a word of the family's KV section (DeepSeek V4: its state header)
            span = min(256, len(data) - self.kv_at)
            at = self.kv_at + 4 * int(rng.integers(max(span // 4, 1)))
            old = int.from_bytes(data[at : at + 4], "little")
            v = edge_value(old, 4, rng)
            data[at : at + 4] = v.to_bytes(4, "little")
            return f"kv word at {at - self.kv_at} = {v}", bytes(data)
        if kind < 85:
            cut = int(rng.integers(0, len(data)))
            return f"truncated to {cut}", bytes(data[:cut])
        at = rng.integers(0, len(data), size=int(rng.integers(1, 9)))
        for i in at.tolist():
            data[i] = int(rng.integers(256))
        return f"noise at {sorted(at.tolist())}", bytes(data)


CKPT_CTX = 64
CKPT_TOKENS = 24


def make_payload(engine: E.Engine) -> tuple[bytes, list[int]]:
    n_vocab = engine.info.n_vocab
    toks = [(7 * i + 3) % n_vocab for i in range(CKPT_TOKENS)]
    with engine.new_session(CKPT_CTX) as s:
        s.eval(toks)
        buf = io.BytesIO()
        s.save(buf)
    return buf.getvalue(), toks


def run_checkpoint(s: E.Session, blob: bytes, n_vocab: int) -> str:
    """Loads `blob` into `s`, a session of the seed engine that holds what the previous
    mutant left (as a slot holds its last conversation), and uses what loaded. The
    session is reused across mutants: a forward pass of a large seed under the
    sanitizers costs seconds, and only the ones after the load test what it restored."""
    before = list(s.tokens)
    try:
        s.load(io.BytesIO(blob))
    except EngineError as e:
        one_line(str(e))
        # A refusal found in the payload header leaves the session as it was; one
        # found later leaves it empty.
        if s.tokens not in ([], before):
            raise Inconsistent(f"refused payload left {len(s.tokens)} tokens") from None
        if len(s.tokens) >= CKPT_CTX:
            s.rewind(CKPT_CTX // 2)
        s.eval([7 % n_vocab])  # and it still works
        return "refused"
    toks = s.tokens
    if len(toks) > CKPT_CTX:
        raise Inconsistent(f"loaded {len(toks)} tokens into a {CKPT_CTX}-token session")
    if toks and not 0 <= min(toks) <= max(toks) < n_vocab:
        raise Inconsistent(f"loaded token ids {min(toks)}..{max(toks)}, vocab {n_vocab}")
    if len(toks) < CKPT_CTX:
        s.eval([9 % n_vocab])
    if len(toks) > 1:  # rewinding into the restored rows and replaying works too
        s.rewind(len(toks) // 2)
        s.eval([11 % n_vocab])
    return "loaded"


# ---- driver ---------------------------------------------------------------------------------


@dataclass
class Report:
    outcomes: Counter
    findings: list[str]
    seconds: float

    @property
    def total(self) -> int:
        return sum(self.outcomes.values())


class SeedTally:
    """One seed's outcomes, a progress line every 250 mutants, and its slowest mutants."""

    def __init__(self, name: str, started: float, log: Callable[[str], None]) -> None:
        self.name, self.started, self.log = name, started, log
        self.outcomes: Counter = Counter()
        self.slow: list[tuple[float, str]] = []

    def count(self, outcome: str, what: str, t: float) -> None:
        self.outcomes[outcome] += 1
        self.slow = sorted([*self.slow, (time.monotonic() - t, f"{outcome}: {what}")])[-3:]
        n = sum(self.outcomes.values())
        if n % 250 == 0:
            self.log(f"  {self.name}: {n} mutants, {time.monotonic() - self.started:.0f} s")

    def summary(self) -> None:
        counts = ", ".join(f"{k}: {v}" for k, v in sorted(self.outcomes.items()))
        self.log(f"{self.name}: {sum(self.outcomes.values())} mutants in "
                 f"{time.monotonic() - self.started:.0f} s ({counts})")  # fmt: skip
        for dt, what in reversed(self.slow):
            self.log(f"  slowest: {dt:.2f} s {what[:120]}")


def plan(budget: int, names: list[str], weight: dict[str, int]) -> dict[str, int]:
    weights = {n: weight.get(n, DEFAULT_WEIGHT) for n in names}
    total = sum(weights.values())
    counts = {n: max(1, budget * w // total) for n, w in weights.items()}
    counts[names[0]] += budget - sum(counts.values())
    return counts


def fuzz(budget: int, seeds: list[str] | None = None, seconds: float | None = None,
         crash_dir: Path | None = None, rng_seed: int = 0, checkpoints: float = 0.5,
         log: Callable[[str], None] = print, verbose: bool = False) -> Report:  # fmt: skip
    """Runs `budget` mutants (a share `checkpoints` of them checkpoint payloads) over the
    seeds; with `seconds`, each seed stops at its share of the time. Findings are written
    to crash_dir."""
    makers = seed_makers()
    names = seeds or list(makers)
    unknown = [n for n in names if n not in makers]
    if unknown:
        raise SystemExit(f"unknown seeds {unknown}; known: {', '.join(makers)}")
    n_ckpt = int(budget * checkpoints)
    gguf_counts = plan(budget - n_ckpt, names, GGUF_WEIGHT)
    ckpt_counts = plan(n_ckpt, names, {}) if n_ckpt else dict.fromkeys(names, 0)
    rng = np.random.default_rng(rng_seed)
    outcomes: Counter = Counter()
    findings: list[str] = []
    t0 = time.monotonic()
    end = t0 + seconds if seconds else None

    def finding(kind: str, name: str, what: str, data: bytes, exc: BaseException) -> None:
        text = f"{kind} {name}: {what}: {type(exc).__name__}: {exc}"
        findings.append(text)
        log("FINDING " + text)
        log("".join(traceback.format_exception(exc)).rstrip())
        if crash_dir is not None:
            crash_dir.mkdir(parents=True, exist_ok=True)
            stem = f"{kind}-{name}-{len(findings)}"
            (crash_dir / f"{stem}.bin").write_bytes(data)
            (crash_dir / f"{stem}.txt").write_text(text + "\n")

    with tempfile.TemporaryDirectory(prefix="ds4d-fuzz-") as tmp:
        work = Path(tmp)
        for k, name in enumerate(names):
            seed = makers[name](work)
            full = name in FULL_OPEN
            engine = open_native(seed, full)
            seed_table = tensor_table(engine.gguf)
            payload, _ = make_payload(engine)
            n_vocab = engine.info.n_vocab
            mutator = GGUFMutator(seed, engine.gguf)
            copy = WorkingCopy(seed, work)
            started = time.monotonic()
            # With a time limit each seed gets an equal share of what is left once it is
            # set up (at least 30 s), so every family is reached however slow the others.
            deadline = started + max(30.0, (end - started) / (len(names) - k)) if end else None
            done = SeedTally(name, started, log)
            # GGUF mutants (with a time limit, 70% of the seed's share: checkpoints are cheap).
            gguf_deadline = started + 0.7 * (deadline - started) if deadline else None
            for _ in range(gguf_counts[name]):
                if gguf_deadline and time.monotonic() > gguf_deadline:
                    break
                m = mutator.one(rng)
                t = time.monotonic()
                copy.apply(m)
                if crash_dir is not None:  # names the mutant a sanitizer abort hit
                    crash_dir.mkdir(parents=True, exist_ok=True)
                    (crash_dir / "current.txt").write_text(f"gguf {name}: {m.what}\n")
                try:
                    outcome = run_gguf(copy.path, full, seed_table, m.field)
                except Exception as e:  # noqa: BLE001 - every other outcome is a finding
                    outcome = "FINDING"
                    finding("gguf", name, m.what, copy.bytes_of(m), e)
                finally:
                    copy.undo(m)
                outcomes[f"gguf {outcome}"] += 1
                if verbose and outcome.startswith("opened"):
                    log(f"  {name}: {outcome}: {m.what}")
                done.count(f"gguf {outcome}", m.what, t)
            # Checkpoint mutants, loaded into the seed engine.
            pm = PayloadMutator(payload, CKPT_TOKENS, n_vocab, True)
            session = engine.new_session(CKPT_CTX)
            session.eval([5 % n_vocab])  # a session holding something, as a slot would
            for _ in range(ckpt_counts[name]):
                if deadline and time.monotonic() > deadline:
                    break
                what, blob = pm.one(rng)
                t = time.monotonic()
                try:
                    outcome = run_checkpoint(session, blob, n_vocab)
                except Exception as e:  # noqa: BLE001
                    outcome = "FINDING"
                    finding("checkpoint", name, what, blob, e)
                    session.close()  # in an unknown state: the next mutant gets a fresh one
                    session = engine.new_session(CKPT_CTX)
                    session.eval([5 % n_vocab])
                outcomes[f"checkpoint {outcome}"] += 1
                done.count(f"checkpoint {outcome}", what, t)
            session.close()
            engine.close()
            copy.path.unlink()
            done.summary()
    return Report(outcomes, findings, time.monotonic() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="structure-aware GGUF and checkpoint fuzzer")
    ap.add_argument("--budget", type=int, default=10000, help="mutants in all")
    ap.add_argument("--seconds", type=float, default=None, help="stop after this long")
    ap.add_argument("--seeds", default="", help="comma-separated seed names (default all)")
    ap.add_argument("--checkpoints", type=float, default=0.5,
                    help="share of the budget spent on checkpoint payloads")  # fmt: skip
    ap.add_argument("--rng-seed", type=int, default=0)
    ap.add_argument("--verbose", action="store_true", help="name every GGUF mutant that opened")
    ap.add_argument("--crash-dir", type=Path, default=Path("fuzz/crashes"))
    args = ap.parse_args(argv)
    seeds = [s for s in args.seeds.split(",") if s] or None
    report = fuzz(args.budget, seeds, args.seconds, args.crash_dir, args.rng_seed,
                  args.checkpoints, verbose=args.verbose)  # fmt: skip
    print(f"fuzz-native: {report.total} mutants in {report.seconds:.0f} s, "
          f"{len(report.findings)} findings")  # fmt: skip
    for k, v in sorted(report.outcomes.items()):
        print(f"  {k}: {v}")
    return 1 if report.findings else 0


if __name__ == "__main__":
    sys.exit(main())
