"""Where the weights live (ds4d.engine.weight_memory): the resident huge-page copy holds the
file's bytes, on a 2 MB boundary, in memory the kernel may back with huge pages; a model run
from it decodes bitwise as from the file's mapping; `auto` copies only a small model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ds4d.engine import Engine, EngineError, weight_memory
from ds4d.engine.errors import ModelLoadError
from ds4d.engine.gguf_file import GGUFFile


def _vma_flags(address: int) -> dict[str, str]:
    """The /proc/self/smaps fields of the mapping holding address."""
    fields: dict[str, str] = {}
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0] if line.split() else ""
        if "-" in head and ":" not in head:
            lo, hi = (int(v, 16) for v in head.split("-"))
            inside = lo <= address < hi
        elif inside and ":" in head:
            fields[head.rstrip(":")] = line.split(":", 1)[1].strip()
    return fields


def test_resident_copy_holds_the_file_on_a_huge_page_boundary(tmp_path: Path) -> None:
    raw = np.random.default_rng(0).integers(0, 256, 3 * (1 << 20) + 123, dtype=np.uint8)
    path = tmp_path / "blob"
    path.write_bytes(raw.tobytes())
    data = weight_memory.read_resident(path, 100, raw.size - 100)
    assert data.ctypes.data % weight_memory.HUGE_PAGE == 0
    np.testing.assert_array_equal(data, raw[100:])
    if weight_memory.huge_pages_available():
        vma = _vma_flags(data.ctypes.data)
        assert " hg" in " " + vma["VmFlags"]  # advised for huge pages
        assert vma["THPeligible"] == "1"
    with pytest.raises(OSError, match="early"):
        weight_memory.read_resident(path, 100, raw.size)  # one byte past the end


def test_auto_copies_only_a_model_small_next_to_the_ram(monkeypatch) -> None:
    with pytest.raises(ValueError, match="unknown weight memory"):
        weight_memory.resolve("bogus", 1)
    assert weight_memory.resolve("mmap", 1) == "mmap"
    assert weight_memory.resolve("huge", 1 << 50) == "huge"  # as told
    gib = 1 << 30
    monkeypatch.setattr(weight_memory, "huge_pages_available", lambda: True)
    monkeypatch.setattr(weight_memory, "_meminfo",
                        lambda: {"MemTotal": 24 * gib, "MemAvailable": 20 * gib})  # fmt: skip
    assert weight_memory.resolve("auto", 100 << 20) == "huge"  # SmolLM2 on the dev machine
    assert weight_memory.resolve("auto", 7 * gib) == "mmap"  # above a quarter of the RAM
    assert weight_memory.resolve("auto", 86 * gib) == "mmap"  # DeepSeek V4 Flash
    monkeypatch.setattr(weight_memory, "_meminfo",
                        lambda: {"MemTotal": 24 * gib, "MemAvailable": 1 * gib})  # fmt: skip
    assert weight_memory.resolve("auto", 1 * gib) == "mmap"  # more than half of what is free
    monkeypatch.setattr(weight_memory, "huge_pages_available", lambda: False)
    monkeypatch.setattr(weight_memory, "_meminfo",
                        lambda: {"MemTotal": 24 * gib, "MemAvailable": 20 * gib})  # fmt: skip
    assert weight_memory.resolve("auto", 100 << 20) == "mmap"  # no THP: nothing to gain


def test_meminfo_reads_this_machine() -> None:
    info = weight_memory._meminfo()
    assert info["MemTotal"] >= info["MemAvailable"] > 0


def test_huge_weights_decode_bitwise_as_mapped(model_path: Path) -> None:
    prompt = [1, 504, 3458, 282, 2114, 30, 314, 2683, 28, 2165]
    logits = {}
    for mode in ("mmap", "huge"):
        with Engine.open(model_path, threads=2, weights=mode) as e:
            assert e.info.weight_memory == mode
            s = e.new_session(64)
            s.eval(prompt)
            first = s.compute_logits().copy()
            s.eval([int(np.argmax(first))])
            logits[mode] = (first, s.compute_logits().copy())
            if mode == "huge":
                t = e.gguf.tensor("token_embd.weight")
                assert _vma_flags(t.address).get("VmFlags", "").split()[:2] == ["rd", "wr"]
            s.close()
    for a, b in zip(logits["mmap"], logits["huge"], strict=True):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def test_unknown_weight_memory_is_refused(model_path: Path) -> None:
    with pytest.raises(EngineError, match="unknown weight memory 'disk'"):
        Engine.open(model_path, threads=1, weights="disk")
    with pytest.raises(ModelLoadError, match="unknown weight memory"):
        GGUFFile(model_path, weights="disk")


def test_config_names_the_engine_modes() -> None:
    from ds4d.daemon.config import WEIGHT_MODES, Config

    assert WEIGHT_MODES == weight_memory.WEIGHT_MODES
    assert Config().weights == "auto"
