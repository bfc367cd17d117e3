"""Trace: JSON lines, file mode 0600, switchable at runtime."""

from __future__ import annotations

import json
import os
import stat

from ds4d.state.trace import TraceRecord, TraceWriter


def record(**kw):
    base = dict(
        api="chat",
        slot=1,
        prompt_tokens=6000,
        cache_source="disk-text",
        cached_tokens=5888,
        prefill_s=0.25,
        decode_s=1.5,
        generated_tokens=12,
        finish_reason="stop",
        disk_file="ab12.kv",
        time=1_700_000_000.5,
    )
    base.update(kw)
    return TraceRecord(**base)


def test_record_shape_and_mode(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text("")
    os.chmod(path, 0o644)  # an existing wider file is narrowed
    t = TraceWriter(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    t.write(record(extra={"shortfall": 0}), prompt="secret prompt", output="secret output")
    t.close()
    (line,) = path.read_text().splitlines()
    rec = json.loads(line)
    assert rec == {
        "api": "chat",
        "slot": 1,
        "prompt_tokens": 6000,
        "cache_source": "disk-text",
        "cached_tokens": 5888,
        "prefill_s": 0.25,
        "decode_s": 1.5,
        "generated_tokens": 12,
        "finish_reason": "stop",
        "disk_file": "ab12.kv",
        "time": "2023-11-14T22:13:20.500Z",
        "shortfall": 0,
    }


def test_runtime_switching_and_opt_in_text(tmp_path):
    t = TraceWriter()
    t.write(record())  # off: nothing happens
    assert not t.enabled
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    t.open(first)
    t.write(record(slot=0))
    t.open(second, include_text=True)
    t.write(record(slot=1), prompt="P", output="O")
    t.close()
    t.write(record(slot=2))
    assert [json.loads(x)["slot"] for x in first.read_text().splitlines()] == [0]
    (rec,) = [json.loads(x) for x in second.read_text().splitlines()]
    assert (rec["slot"], rec["prompt"], rec["output"]) == (1, "P", "O")
    assert stat.S_IMODE(second.stat().st_mode) == 0o600
