"""The native open path's fuzzer (fuzz/native_open.py) on a short budget, and what it
found: a checkpoint payload whose token ids lie outside the vocabulary must be refused by
the engine itself, not loaded. `make fuzz-native` runs the long budget under ASan+UBSan."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest

from ds4d.engine.engine import _HEADER
from ds4d.engine.errors import EngineError
from fuzz.native_open import GGUFMutator, WorkingCopy, fuzz
from tests.helpers.gguf_structure import write_tiny_model

TOKENS_AT = _HEADER.size  # token ids follow the payload header


def payload(engine, tokens: list[int]) -> bytes:
    with engine.new_session(64) as s:
        s.eval(tokens)
        buf = io.BytesIO()
        s.save(buf)
        return buf.getvalue()


@pytest.mark.parametrize("bad", [-1, "n_vocab", 2**31 - 1])
def test_a_payload_with_a_token_outside_the_vocabulary_is_refused(engine, bad) -> None:
    n_vocab = engine.info.n_vocab
    value = n_vocab if bad == "n_vocab" else bad
    data = bytearray(payload(engine, [1, 2, 3, 4, 5, 6]))
    struct.pack_into("<i", data, TOKENS_AT + 4 * 3, value)
    with engine.new_session(64) as s:
        s.eval([7])
        with pytest.raises(EngineError, match=f"token id {value} at position 3, outside"):
            s.load(io.BytesIO(bytes(data)))
        assert s.tokens == []
        s.eval([8])  # the session is still usable
        assert s.tokens == [8]


def test_an_in_vocabulary_payload_still_loads(engine) -> None:
    data = payload(engine, [1, 2, 3, engine.info.n_vocab - 1])
    with engine.new_session(64) as s:
        s.load(io.BytesIO(data))
        assert s.tokens == [1, 2, 3, engine.info.n_vocab - 1]


def test_working_copy_undoes_every_mutant_exactly(tmp_path: Path) -> None:
    seed = write_tiny_model(tmp_path / "seed.gguf")
    mutator = GGUFMutator(seed)
    copy = WorkingCopy(seed, tmp_path)
    rng = np.random.default_rng(7)
    kinds = set()
    for _ in range(200):
        m = mutator.one(rng)
        kinds.add("cut" if m.cut is not None else m.field.rsplit(" ", 1)[-1])
        copy.apply(m)
        assert copy.path.read_bytes() == copy.bytes_of(m)
        copy.undo(m)
        assert copy.path.read_bytes() == copy.original
    assert {"cut", "offset", "type", "count", "noise"} <= kinds, kinds


def test_short_budget_finds_nothing_and_reaches_both_outcomes(tmp_path: Path) -> None:
    lines: list[str] = []
    report = fuzz(160, ["tiny-llama", "deepseek4"], crash_dir=tmp_path / "crashes",
                  rng_seed=3, checkpoints=0.25, log=lines.append)  # fmt: skip
    assert report.findings == [], "\n".join(lines)
    assert report.total == 160
    kinds = {" ".join(k.split(" ")[:2]) for k in report.outcomes}
    # Both refusals and clean loads occur: the mutants get past the first checks, and the
    # checks do not refuse harmless changes.
    assert {"gguf refused", "gguf opened", "checkpoint refused", "checkpoint loaded"} <= kinds
