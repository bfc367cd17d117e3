"""Tool memory: bounded LRU of tool-call id -> sampled text, round trip via a KV file."""

from __future__ import annotations

from ds4d.state import kvfile
from ds4d.state.toolmemory import ToolMemory


def test_lru_bound_and_touch():
    m = ToolMemory(max_ids=3)
    for i in range(3):
        m.remember(f"call_{i}", f"text {i}")
    assert m.get("call_0") == "text 0"  # touched: now most recent
    m.remember("call_3", "text 3")
    assert len(m) == 3 and "call_1" not in m and "call_0" in m
    m.remember("call_2", "new text 2")  # re-put replaces and touches
    m.remember("call_4", "text 4")
    assert "call_0" not in m and m.get("call_2") == "new text 2"
    assert m.get("call_1") is None and (m.hits, m.misses) == (2, 1)


def test_zero_disables():
    m = ToolMemory(max_ids=0)
    m.remember("call_a", "x")
    assert len(m) == 0 and m.get("call_a") is None


def test_round_trip_through_kv_file(tmp_path):
    m = ToolMemory()
    sampled = '<tool_call>\n{"name": "get_weather", "arguments": {"unit": "c", "city": "Rome"}}\n</tool_call>'
    m.remember("call_0123456789abcdef0123456789abcdef", sampled)
    m.remember("call_other", "not in this conversation")
    section = m.select(["call_0123456789abcdef0123456789abcdef", "call_unknown"])
    path, header = kvfile.write_file(
        tmp_path,
        "prompt " + sampled,
        b"payload",
        reason=kvfile.Reason.EVICT,
        tokens=10,
        ctx=100,
        fingerprint=kvfile.fingerprint_digest("m"),
        tool_map=section,
    )

    restarted = ToolMemory()
    restarted.update(kvfile.read_body(path, header).tool_map)
    assert restarted.snapshot() == {"call_0123456789abcdef0123456789abcdef": sampled}
    restarted.update({"call_0123456789abcdef0123456789abcdef": "stale"})  # existing wins
    assert restarted.get("call_0123456789abcdef0123456789abcdef") == sampled
