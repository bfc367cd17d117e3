"""Checkpoints off the critical path: the background writer, delta checkpoints and the
daily write budget, with the real engine and real files. A "slow disk" is a writer kept
busy by a job that waits on an event, so ordering is asserted without wall-clock ratios."""

from __future__ import annotations

import io
import os
import sys
import threading

import numpy as np
import pytest

from ds4d.state import kvfile
from ds4d.state.diskcache import DiskCache
from ds4d.state.kvfile import Reason
from ds4d.state.kvstate import KVState
from ds4d.state.savepolicy import SavePolicy
from ds4d.state.writer import WRITER_NICE, CheckpointWriter

CTX = 1024
TEXT = (
    "<|im_start|>system\nYou are a helpful assistant who answers questions about rivers, "
    "their deltas, their floods and the towns along their banks.<|im_end|>\n<|im_start|>user\n"
    + "Tell me about the Po river, its delta and the plain it crosses, in detail. "
    * 35
)


def make(engine, tmp_path, *, writer=True, max_chain=8, **disk_kw) -> KVState:
    pol = SavePolicy.for_context(CTX, cold_max_tokens=0, continued_interval_tokens=0)
    disk = DiskCache(tmp_path / "kv", budget_bytes=0, fingerprint=engine.info.fingerprint,
                     ctx=CTX, min_tokens=pol.min_tokens,
                     writer=CheckpointWriter() if writer else None, **disk_kw)  # fmt: skip
    return KVState(engine.tokenizer, CTX, disk=disk, policy=pol, max_chain=max_chain)


class Gate:
    """Keeps the writer busy (a slow disk) until opened."""

    def __init__(self, writer: CheckpointWriter) -> None:
        self.started, self.release = threading.Event(), threading.Event()
        writer.submit(self._run, value=(True, True, 1 << 40))
        assert self.started.wait(30)

    def _run(self) -> None:
        self.started.set()
        self.release.wait(60)

    def open(self) -> None:
        self.release.set()


def cold_logits(engine, tokens):
    with engine.new_session(CTX) as s:
        s.eval(tokens)
        return np.array(s.compute_logits())


@pytest.fixture(scope="module")
def tokens(engine) -> list[int]:
    toks = engine.tokenizer.encode(TEXT, special=True)
    assert len(toks) > 600
    return toks


# -- the writer on its own -----------------------------------------------------------------


def test_writer_drops_the_lowest_value_when_full_and_survives_failures() -> None:
    w = CheckpointWriter(max_pending=2)
    gate = Gate(w)
    ran: list[str] = []
    dropped: list[str] = []
    for name, value in (("a", (1,)), ("b", (3,)), ("c", (2,)), ("d", (0,))):
        w.submit(lambda n=name: ran.append(n), (value,), on_drop=lambda n=name: dropped.append(n))
    # one running (the gate) does not count against the queue of 2: b and c stay
    assert dropped == ["a", "d"] and w.dropped == 2 and w.pending == 3
    w.submit(lambda: 1 / 0, ((5,),))  # c is the lowest now
    assert dropped == ["a", "d", "c"]
    w.submit(lambda: ran.append("e"), ((4,),))  # then b
    assert dropped == ["a", "d", "c", "b"]
    gate.open()
    assert w.drain(30)
    assert ran == ["e"] and w.failed == 1 and w.pending == 0
    assert w.close(30)
    assert not w.submit(lambda: ran.append("late")) and w.dropped == 5


def test_pending_bytes_counts_the_memory_queued_jobs_hold_until_written() -> None:
    w = CheckpointWriter(max_pending=2)
    gate = Gate(w)  # the running job holds nothing
    assert w.pending_bytes == 0
    w.submit(lambda: None, ((1,),), nbytes=1000)
    w.submit(lambda: None, ((2,),), nbytes=300)
    assert w.pending_bytes == 1300
    w.submit(lambda: None, ((3,),), nbytes=50)  # the queue is full: the 1000-byte job goes
    assert w.pending_bytes == 350 and w.dropped == 1
    gate.open()
    assert w.drain(30) and w.pending_bytes == 0
    assert w.close(30)


def test_the_writer_runs_below_the_engines_priority() -> None:
    """Its thread's nice value is WRITER_NICE above the threads that submit (Linux: a
    thread's own; elsewhere nothing changes rather than the whole process)."""
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen: list[int] = []
    w = CheckpointWriter()
    w.submit(lambda: seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
    assert w.close(30)
    raised = min(19, mine + WRITER_NICE) if sys.platform.startswith("linux") else mine
    assert seen == [raised]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine


# -- background saves ----------------------------------------------------------------------


def test_slot_is_free_while_its_checkpoint_is_still_being_written(engine, tmp_path, tokens):
    kv = make(engine, tmp_path)
    disk = kv.disk
    gate = Gate(disk.writer)  # the disk is slow: nothing is written until the gate opens
    with engine.new_session(CTX) as s:
        s.eval(tokens[:400])
        held = s.tokens
        assert disk.stats.snapshot_seconds == 0
        assert kv.save_evict(s)  # returns with the write queued
        name = kvfile.file_name(kv.key_text(held))
        assert disk.stats.files_written == 0 and disk.stats_dict()["pending_writes"] == 2
        assert disk.stats_dict()["pending_bytes"] >= 400 * (s.kv_bytes // CTX)  # the snapshot
        assert disk.stats.snapshot_seconds > 0  # the copy, counted: the critical path's part
        assert not (disk.dir / name).exists()
        # the slot goes on with another prompt at once; its logits are those of a cold run
        s.rewind(0)
        s.eval(tokens[100:300])
        np.testing.assert_array_equal(s.compute_logits(), cold_logits(engine, tokens[100:300]))
        assert not (disk.dir / name).exists()
        # a lookup already finds the pending checkpoint; its load waits for the write
        match = disk.lookup(kv.key_text(held) + "more")
        assert match is not None and match.entry.pending is not None
        loaded: list = []
        prompt = kv.key_text(held) + "more"
        reader = threading.Thread(target=lambda: loaded.append(disk.load(match, prompt)))
        reader.start()
        gate.open()
        reader.join(60)
    assert loaded and loaded[0] is not None and loaded[0].entry.tokens == len(held)
    assert disk.writer.drain(30) and (disk.dir / name).exists()
    assert disk.stats_dict()["pending_bytes"] == 0
    with engine.new_session(CTX) as s2:
        for p in loaded[0].payloads:
            s2.load(io.BytesIO(p))
        assert s2.tokens == held
        np.testing.assert_array_equal(s2.compute_logits(), cold_logits(engine, held))


def test_a_dropped_pending_write_is_a_miss_not_a_wait(engine, tmp_path, tokens):
    kv = make(engine, tmp_path)
    disk = kv.disk
    disk.writer.max_pending = 1
    gate = Gate(disk.writer)
    with engine.new_session(CTX) as s:
        s.eval(tokens[:200])
        assert kv.save_evict(s)
        text = kv.key_text(s.tokens)
        match = disk.lookup(text)
        s.eval(tokens[200:400])
        kv.begin(s, "none")
        assert kv.save_evict(s)  # the longer one is worth more: the first is dropped
    assert disk.writer.dropped == 1
    assert disk.load(match, text) is None  # answered at once: it will never be written
    gate.open()
    assert disk.writer.drain(30)
    assert [e.tokens for e in disk.entries()] == [400]


# -- delta checkpoints -----------------------------------------------------------------------


def test_continued_checkpoints_write_only_new_rows_and_load_as_a_chain(engine, tmp_path, tokens):
    kv = make(engine, tmp_path, max_chain=3)
    disk = kv.disk
    row = engine.model.kv_token_bytes(engine.info.kv_type)
    written = []
    with engine.new_session(CTX) as s:
        for n in (200, 300, 400, 500, 600):
            s.eval(tokens[len(s.tokens) : n])
            before = disk.stats.bytes_written
            assert kv.save_session(s, Reason.CONTINUED)
            assert kv.drain(60)
            written.append(disk.stats.bytes_written - before)
        held = s.tokens
    by_tokens = {e.tokens: e for e in disk.entries()}
    assert sorted(by_tokens) == [200, 300, 400, 500, 600]
    depths = [by_tokens[n].header.depth for n in (200, 300, 400, 500, 600)]
    assert depths == [0, 1, 2, 3, 0]  # a full file again after max_chain links
    assert by_tokens[300].base == by_tokens[200].name
    for size in written[1:4]:
        assert 100 * row <= size < 100 * row + 300_000  # new rows, text, logits, header
    assert written[4] > 600 * row and written[0] > 200 * row
    assert disk.stats.deltas_written == 3
    # a restart loads the deepest delta through its chain: the exact state of a cold run
    kv2 = make(engine, tmp_path)
    text = kv.key_text(tokens[:500]) + " and more"
    with engine.new_session(CTX) as s:
        match = kv2.disk.lookup(text)
        assert match.tokens == 500
        got = kv2.load_disk(s, match, text)
        assert got is not None and s.tokens == tokens[:500]
        np.testing.assert_array_equal(s.compute_logits(), cold_logits(engine, tokens[:500]))
        # and the next checkpoint of that session is a delta of the file it loaded
        s.eval(tokens[500:560])
        assert kv2.save_session(s, Reason.CONTINUED) and kv2.drain(60)
    top = next(e for e in kv2.disk.entries() if e.tokens == 560)
    assert top.base == by_tokens[500].name and top.header.depth == 4
    # every link of a used chain counts as used
    assert all(kvfile.read_header(by_tokens[n].path).hits == 1 for n in (200, 300, 400, 500))
    assert kv.key_text(held) is not None


def test_evicting_a_base_takes_its_deltas_and_the_budget_counts_what_is_left(
    engine, tmp_path, tokens
):
    kv = make(engine, tmp_path)
    disk = kv.disk
    with engine.new_session(CTX) as s:
        for n in (200, 300, 400):
            s.eval(tokens[len(s.tokens) : n])
            assert kv.save_session(s, Reason.CONTINUED)
        assert kv.drain(60)
    base = next(e for e in disk.entries() if e.tokens == 200)
    removed = disk.evict(base.name[:12])
    assert len(removed) == 3 and disk.entries() == []
    assert list(disk.dir.glob("*.kv")) == []
    # a budget that holds one chain: the oldest chain goes whole, the directory fits
    with engine.new_session(CTX) as s:
        s.eval(tokens[:300])
        assert kv.save_session(s, Reason.EVICT) and kv.drain(60)
        s.eval(tokens[300:400])
        assert kv.save_session(s, Reason.EVICT) and kv.drain(60)
    chain_bytes = disk.bytes_used()
    disk.budget = int(chain_bytes * 1.5)
    kv.begin(s, "none")
    with engine.new_session(CTX) as s:
        s.eval(tokens[100:420])
        assert kv.save_session(s, Reason.EVICT) and kv.drain(60)
    on_disk = sum(p.stat().st_size for p in disk.dir.glob("*.kv"))
    assert on_disk == disk.bytes_used() <= disk.budget
    assert all(e.base is None or disk.has(e.base) for e in disk.entries())


def test_a_damaged_base_quarantines_its_chain_and_the_load_goes_cold(engine, tmp_path, tokens):
    kv = make(engine, tmp_path)
    with engine.new_session(CTX) as s:
        s.eval(tokens[:300])
        kv.save_session(s, Reason.CONTINUED)
        s.eval(tokens[300:400])
        kv.save_session(s, Reason.CONTINUED)
        assert kv.drain(60)
    base = next(e for e in kv.disk.entries() if e.tokens == 300)
    raw = bytearray(base.path.read_bytes())
    raw[-200] ^= 0xFF  # inside the base's KV rows
    base.path.write_bytes(bytes(raw))
    text = kv.key_text(tokens[:400])
    match = kv.disk.lookup(text)
    assert match is not None and match.tokens == 400
    assert kv.disk.load(match, text) is None
    assert kv.disk.entries() == [] and (kv.disk.quarantine_dir / base.name).exists()
    assert list(kv.disk.dir.glob("*.kv")) == []


def test_startup_scan_removes_deltas_whose_base_is_gone(engine, tmp_path, tokens):
    kv = make(engine, tmp_path)
    with engine.new_session(CTX) as s:
        s.eval(tokens[:300])
        kv.save_session(s, Reason.CONTINUED)
        s.eval(tokens[300:400])
        kv.save_session(s, Reason.CONTINUED)
        assert kv.drain(60)
    next(e for e in kv.disk.entries() if e.tokens == 300).path.unlink()
    again = make(engine, tmp_path)
    assert again.disk.entries() == [] and list(again.disk.dir.glob("*.kv")) == []


# -- the write budget ------------------------------------------------------------------------


def test_past_the_write_budget_only_likely_reused_saves_are_written(engine, tmp_path, tokens):
    kv = make(engine, tmp_path, daily_write_bytes=1)
    disk = kv.disk
    with engine.new_session(CTX) as s:
        s.eval(tokens[:300])
        kv.begin(s, "none")  # a fresh prompt: nobody asked for it again yet
        assert not kv.save_session(s, Reason.EVICT)
        assert disk.stats.skipped_daily_budget == 1 and disk.entries() == []
        assert kv.save_session(s, Reason.CONTINUED)  # a continued session: written anyway
        assert kv.drain(60)
        kv.begin(s, "memory-token")  # the next turn reused it: an evict save is worth it
        s.eval(tokens[300:360])
        assert kv.save_session(s, Reason.EVICT) and kv.drain(60)
    assert sorted(e.tokens for e in disk.entries()) == [300, 360]
    stats = disk.stats_dict()
    assert stats["bytes_written_today"] == stats["bytes_written"] > 0
    assert stats["skipped_daily_budget"] == 1 and stats["pending_writes"] == 0
