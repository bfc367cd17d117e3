"""Disk KV cache: lookup, load checks, quarantine, budget, eviction score, crash safety."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from ds4d.state import kvfile
from ds4d.state.diskcache import DiskCache
from ds4d.state.kvfile import Reason

FP = "llama:smollm2-135m:test-fingerprint"
HOUR = 3600.0


class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def cache(tmp_path, budget=0, clock=None, **kw) -> DiskCache:
    return DiskCache(
        tmp_path / "kv",
        budget_bytes=budget,
        fingerprint=FP,
        ctx=8192,
        min_tokens=kw.pop("min_tokens", 16),
        clock=clock or Clock(),
        **kw,
    )


def payload(n: int) -> bytes:
    return os.urandom(n)


def test_longest_prefix_lookup_and_load(tmp_path):
    c = cache(tmp_path)
    base = "system: be terse\n" * 20
    c.save(Reason.COLD, base, 100, payload(1000))
    c.save(Reason.CONTINUED, base + "user: hi\n", 120, payload(1200))
    c.save(Reason.EVICT, base + "user: bye\n", 130, payload(1300))

    prompt = base + "user: hi\nassistant: hello\n"
    m = c.lookup(prompt)
    assert m is not None and m.tokens == 120 and m.text_bytes == len(base + "user: hi\n")
    loaded = c.load(m, prompt)
    assert loaded.text == base + "user: hi\n" and len(loaded.payload) == 1200
    assert prompt[len(loaded.text) :] == "assistant: hello\n"

    # the hit was written into the file's header, in place
    h = kvfile.read_header(m.path)
    assert h.hits == 1 and h.last_used_ms == int(c.clock() * 1000)
    assert c.stats.hits == 1

    assert c.lookup("system: be terse\n" * 2) is None  # shorter than every entry
    assert c.lookup(base.replace("terse", "TERSE")) is None  # one differing byte
    assert c.stats.misses == 2


def test_lookup_filters_min_tokens_and_context(tmp_path):
    c = cache(tmp_path, min_tokens=100)
    assert c.save(Reason.COLD, "a" * 50, 99, payload(100)) is None  # below min: not saved
    c.save(Reason.COLD, "a" * 60, 150, payload(100))
    small_ctx = DiskCache(tmp_path / "kv", budget_bytes=0, fingerprint=FP, ctx=150, min_tokens=100)
    assert small_ctx.lookup("a" * 100) is None  # 150 tokens do not fit a ctx of 150
    assert c.lookup("a" * 100).tokens == 150


def test_bad_files_are_quarantined_never_crash(tmp_path):
    c = cache(tmp_path)
    good = c.save(Reason.COLD, "good " * 40, 100, payload(3000))
    trunc = c.save(Reason.COLD, "truncated " * 40, 100, payload(3000))
    flipped_hdr = c.save(Reason.COLD, "header flip " * 40, 100, payload(3000))
    flipped_body = c.save(Reason.COLD, "body flip " * 40, 100, payload(3000))
    foreign = kvfile.write_file(
        c.dir,
        "foreign " * 40,
        payload(3000),
        reason=Reason.COLD,
        tokens=100,
        ctx=8192,
        fingerprint=kvfile.fingerprint_digest("other-model"),
    )[0]
    (c.dir / "not-a-cache-file.txt").write_text("left alone")
    with open(trunc.path, "r+b") as f:
        f.truncate(trunc.size - 100)
    for entry, offset in ((flipped_hdr, 50), (flipped_body, -5)):
        raw = bytearray(entry.path.read_bytes())
        raw[offset] ^= 1
        entry.path.write_bytes(bytes(raw))

    fresh = cache(tmp_path)
    names = {e.name for e in fresh.entries()}
    assert names == {good.name, flipped_body.name}  # body damage shows only on load
    quarantined = {p.name for p in fresh.quarantine_dir.iterdir()}
    assert quarantined == {trunc.name, flipped_hdr.name, foreign.name}
    assert (c.dir / "not-a-cache-file.txt").exists()

    prompt = "body flip " * 40 + "more"
    m = fresh.lookup(prompt)
    assert m is not None and fresh.load(m, prompt) is None  # rejected: checksum
    assert fresh.stats.load_failures == 1
    assert (fresh.quarantine_dir / flipped_body.name).exists()
    assert fresh.lookup(prompt) is None
    assert fresh.load(fresh.lookup("good " * 40), "good " * 40) is not None


def test_budget_never_exceeded(tmp_path):
    budget = 60_000
    c = cache(tmp_path, budget=budget, daily_write_bytes=10**9)
    rng = __import__("random").Random(7)
    for i in range(40):
        c.clock.t += 60
        n = rng.randrange(2000, 20000)
        c.save(Reason.CONTINUED, f"conversation {i} " * 10, 16 + n // 100, payload(n))
        on_disk = sum(p.stat().st_size for p in c.dir.rglob("*") if p.is_file())
        assert on_disk <= budget
        assert on_disk == c.bytes_used()
    assert c.stats.evictions > 0
    # a file that alone exceeds the budget is never written
    assert c.save(Reason.COLD, "huge", 100, payload(budget)) is None
    assert c.stats.skipped_budget == 1


def _entry(c, name, reason, tokens, size, hits=0, used_h_ago=0.0):
    e = c.save(reason, f"entry {name} " * 5, tokens, payload(size))
    kvfile.touch(e.path, hits, int((c.clock() - used_h_ago * HOUR) * 1000))
    return e


def test_eviction_follows_score(tmp_path):
    clock = Clock()
    c = cache(tmp_path, clock=clock)
    dense = _entry(c, "dense", Reason.CONTINUED, 400, 10_000)  # 0.04 tokens/byte
    sparse = _entry(c, "sparse", Reason.CONTINUED, 100, 10_000)  # 0.01
    anchor = _entry(c, "anchor", Reason.COLD, 100, 10_000)  # 0.01, doubled
    popular = _entry(c, "popular", Reason.CONTINUED, 100, 10_000, hits=7, used_h_ago=0)
    stale = _entry(c, "stale", Reason.CONTINUED, 100, 10_000, hits=1000, used_h_ago=84)

    fresh = DiskCache(c.dir, budget_bytes=0, fingerprint=FP, ctx=8192, min_tokens=16, clock=clock)
    scores = {e["name"]: e["score"] for e in fresh.ls()}
    # stale: 1000 hits decayed over 14 half-lives = 0.06 -> about (1.06) * 0.01
    assert scores[sparse.name] < scores[stale.name] < scores[anchor.name]
    assert scores[anchor.name] == pytest.approx(2 * scores[sparse.name])
    assert scores[popular.name] == pytest.approx(8 * scores[sparse.name], rel=1e-3)

    # squeeze the budget one file at a time: lowest score goes first
    order = []
    for keep in range(4, 0, -1):
        fresh.budget = keep * (dense.size + 10)
        order += fresh.enforce_budget()
    assert order == [sparse.name, stale.name, anchor.name, dense.name]
    assert [e.name for e in fresh.entries()] == [popular.name]


def test_ties_evict_older_and_new_file_is_protected(tmp_path):
    clock = Clock()
    c = cache(tmp_path, clock=clock)
    old = _entry(c, "older", Reason.CONTINUED, 100, 10_000, used_h_ago=2)
    young = _entry(c, "newer", Reason.CONTINUED, 100, 10_000, used_h_ago=1)
    c.scan()
    c.budget = 2 * old.size + 100
    # the new file has the worst score yet survives: it was just written
    new = c.save(Reason.CONTINUED, "new entry " * 5, 20, payload(10_000))
    assert new is not None
    assert {e.name for e in c.entries()} == {young.name, new.name}
    assert not old.path.exists()


def test_daily_write_budget(tmp_path):
    clock = Clock()
    c = cache(tmp_path, clock=clock, budget=10_000_000, daily_write_bytes=25_000)
    assert c.save(Reason.COLD, "one " * 10, 100, payload(10_000))
    assert c.save(Reason.COLD, "two " * 10, 100, payload(10_000))
    assert c.save(Reason.COLD, "three " * 10, 100, payload(10_000)) is None
    assert c.stats.skipped_daily_budget == 1
    clock.t += 86_401
    assert c.save(Reason.COLD, "three " * 10, 100, payload(10_000))


def test_existing_text_not_rewritten_unless_tool_ids_are_new(tmp_path):
    c = cache(tmp_path)
    text = "same text " * 10
    first = c.save(Reason.COLD, text, 100, payload(5000), tool_map={"call_a": "A"})
    inode = first.path.stat().st_ino
    again = c.save(Reason.CONTINUED, text, 100, payload(5000), tool_map={"call_a": "A"})
    assert again.path.stat().st_ino == inode and c.stats.files_written == 1
    more = c.save(Reason.EVICT, text, 100, payload(5000), tool_map={"call_b": "B"})
    assert more.path.stat().st_ino != inode
    assert kvfile.read_tool_map(more.path, more.header) == {"call_a": "A", "call_b": "B"}
    assert c.tool_maps({"call_b", "call_x"}) == {"call_b": "B"}


def test_admin_ls_evict_stats(tmp_path):
    clock = Clock()
    c = cache(tmp_path, clock=clock)
    a = c.save(Reason.COLD, "alpha " * 10, 100, payload(1000))
    clock.t += 10 * HOUR
    b = c.save(Reason.SHUTDOWN, "beta " * 10, 200, payload(1000))
    listing = c.ls()
    assert [e["name"] for e in listing] == [b.name, a.name]
    assert listing[0]["reason"] == "shutdown" and listing[0]["tokens"] == 200
    assert c.evict(older_than_s=5 * HOUR) == [a.name]
    assert c.evict(prefix=b.name[:6].upper()) == [b.name]
    c.save(Reason.COLD, "gamma " * 10, 100, payload(1000))
    assert len(c.evict(everything=True)) == 1
    with pytest.raises(ValueError):
        c.evict()
    s = c.stats_dict()
    assert s["entries"] == 0 and s["files_written"] == 3 and s["evictions"] == 3
    assert list(c.dir.glob("*.kv")) == []


CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from ds4d.state import kvfile
    def stalled(fp):
        for i in range(21):
            fp.write(b"k" * 65536)
        print("writing", flush=True)
        sys.stdin.readline()  # a disk that stalls mid-write: the parent kills us here
        fp.write(b"k" * 65536)
    kvfile.write_file(Path(sys.argv[1]), "killed mid write " * 50, stalled,
                      reason=kvfile.Reason.COLD, tokens=900, ctx=8192,
                      fingerprint=kvfile.fingerprint_digest(sys.argv[2]))
    print("done", flush=True)
""")


def test_kill_9_mid_write_never_leaves_an_accepted_file(tmp_path):
    c = cache(tmp_path)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(c.dir), FP],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout.readline().strip() == "writing"  # mid-write: 21 chunks, stalled
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stdin.close()
    child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    leftovers = [p.name for p in c.dir.iterdir()]
    assert leftovers and all(kvfile.tmp_owner_pid(n) == child.pid for n in leftovers)

    fresh = cache(tmp_path)
    assert fresh.entries() == []
    assert fresh.lookup("killed mid write " * 60) is None
    assert [p for p in fresh.dir.iterdir() if p.is_file()] == []  # the partial file is gone


def test_a_chain_is_evicted_whole_scored_as_a_family_and_recency_breaks_near_ties(tmp_path):
    clock = Clock()
    c = cache(tmp_path, clock=clock)
    a_text = "conversation a, the first one " * 10
    b_text = "conversation b, the second one " * 10
    a = c.save(Reason.COLD, a_text, 896, payload(20_000))
    clock.t += 60
    b = c.save(Reason.COLD, b_text, 880, payload(20_100))  # 0.6% more tokens per byte
    clock.t += 60
    # a's slot is reused: its evict save is a delta of a, written last
    a2 = c.save(Reason.EVICT, a_text + "reply", 975, payload(2_000), base=a.name, depth=1)
    assert a2 is not None and a2.base == a.name and a2.header.depth == 1
    assert c.save(Reason.EVICT, b_text + "x", 990, payload(10), base="0" * 40 + ".kv",
                  depth=1) is None  # fmt: skip
    assert c.stats.delta_base_missing == 1
    # room for one family more than what is there: the least recently used family goes
    # (b: its score is within the tie of a's family, a was used last)
    c.budget = a.size + a2.size + b.size
    clock.t += 60
    removed = c.enforce_budget(incoming=5_000)
    assert removed == [b.name]
    # evicting a takes its delta with it, and the accounting counts both
    before = c.bytes_used()
    assert sorted(c.evict(prefix=a.name[:8])) == sorted([a.name, a2.name])
    assert c.bytes_used() == before - a.size - a2.size == 0


def test_a_looked_up_file_is_not_evicted_before_it_is_loaded(tmp_path):
    clock = Clock()
    c = cache(tmp_path, clock=clock)
    text = "the conversation asked again " * 10
    old = c.save(Reason.COLD, text, 900, payload(20_000))
    clock.t += 60
    match = c.lookup(text + "and more")
    assert match is not None and match.entry.name == old.name
    # the slot it replaces is saved meanwhile and needs room: the match stays
    c.budget = 22_000  # room for the new file only
    assert c.save(Reason.EVICT, "the slot's own session " * 10, 950, payload(21_000))
    assert old.path.exists()
    loaded = c.load(match, text + "and more")
    assert loaded is not None and loaded.entry.name == old.name
    # once loaded it is an ordinary file again
    c.budget = 1
    c.enforce_budget()
    assert not old.path.exists()
