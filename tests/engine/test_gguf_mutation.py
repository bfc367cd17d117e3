"""Structure-aware mutation of GGUF files: counts, lengths, value and tensor types,
dimensions and offsets set to edge values, tensors moved onto each other, truncations and
byte noise in the index. Every mutant must be refused with one line (ModelLoadError) or
open consistently (tensors inside the file and apart, a working tokenizer, one decode
step); never a crash or any other exception.

DS4D_GGUF_MUTANTS sets the number of mutants per file (default 150; a long run: 5000).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from ds4d.engine import Engine, ModelLoadError
from ds4d.engine.gguf_file import GGUFFile
from ds4d.engine.tokenizer import Tokenizer
from tests.helpers.gguf_structure import Field, structure, write_tiny_bpe_vocab, write_tiny_model

N_MUTANTS = int(os.environ.get("DS4D_GGUF_MUTANTS", "150"))


def edge_values(field: Field, rng: np.random.Generator) -> int:
    top = (1 << (8 * field.size)) - 1
    v = field.value
    choices = [0, 1, 2, 3, 5, 9, 13, 31, 32, 33, 64, 255, 256, 4096, 2**31 - 1, 2**31, 2**32 - 1,
               2**63 - 1, 2**63, top, v + 1, v - 1, v * 2, v + 32, v - 32, v // 2,
               int(rng.integers(0, 1 << 16))]  # fmt: skip
    return int(choices[int(rng.integers(len(choices)))]) & top


def mutants(path: Path, rng: np.random.Generator, n: int) -> Iterator[tuple[str, bytes]]:
    raw = path.read_bytes()
    fields = structure(path)
    offsets = [f for f in fields if f.what.endswith(" offset")]
    index_end = max(f.offset + f.size for f in fields)
    for _ in range(n):
        data = bytearray(raw)
        kind = int(rng.integers(10))
        if kind < 6:
            f = fields[int(rng.integers(len(fields)))]
            value = edge_values(f, rng)
            data[f.offset : f.offset + f.size] = value.to_bytes(f.size, "little")
            what = f"{f.what} = {value}"
        elif kind == 6 and len(offsets) > 1:
            a, b = (offsets[int(i)] for i in rng.choice(len(offsets), 2, replace=False))
            data[a.offset : a.offset + 8] = b.value.to_bytes(8, "little")
            what = f"{a.what} = {b.what}"
        elif kind == 7:
            cut = int(rng.integers(0, len(raw)))
            del data[cut:]
            what = f"truncated to {cut} bytes"
        else:
            at = rng.integers(0, index_end, size=int(rng.integers(1, 9)))
            for i in at.tolist():
                data[i] = int(rng.integers(256))
            what = f"noise at {sorted(at.tolist())}"
        yield what, bytes(data)


def assert_consistent(gf: GGUFFile) -> None:
    spans = sorted((gf.file_offset(t), t.n_bytes) for t in map(gf.tensor, gf.tensor_names()))
    for (start, size), (after, _) in zip(spans, spans[1:] + [(gf.file_bytes, 0)], strict=True):
        assert 0 <= start and start + size <= after


def check_model(path: Path) -> bool:
    """True if the file opened, False if it was refused (in one line)."""
    try:
        with Engine.open(path, threads=1) as engine:
            assert_consistent(engine.gguf)
            tok = engine.tokenizer
            ids = tok.encode("the cat <s>")
            tok.decode(ids)
            with engine.new_session(8) as session:
                session.eval([min(ids[0], engine.info.n_vocab - 1)])
        return True
    except ModelLoadError as e:
        assert str(e) and "\n" not in str(e), repr(str(e))
        return False


def check_vocab(path: Path) -> bool:
    try:
        gf = GGUFFile(path)
        tok = Tokenizer.from_gguf(gf)
        assert tok.decode(tok.encode("the cat <|im_end|> 日本")).endswith("日本")
        return True
    except ModelLoadError as e:
        assert str(e) and "\n" not in str(e), repr(str(e))
        return False


@pytest.mark.parametrize(
    ("writer", "check"),
    [(write_tiny_model, check_model), (write_tiny_bpe_vocab, check_vocab)],
    ids=["tiny-model", "bpe-vocab"],
)
def test_every_mutant_is_refused_in_one_line_or_opens(tmp_path: Path, writer, check) -> None:
    original = writer(tmp_path / "original.gguf")
    assert check(original)
    rng = np.random.default_rng(1234)
    mutant = tmp_path / "mutant.gguf"
    opened = 0
    for what, data in mutants(original, rng, N_MUTANTS):
        mutant.write_bytes(data)
        try:
            opened += check(mutant)
        except AssertionError as e:
            raise AssertionError(f"mutant {what}: {e}") from None
        except Exception as e:
            raise AssertionError(f"mutant {what}: {type(e).__name__}: {e}") from None
    # Both outcomes occur: the mutator reaches past the first check, and the checks
    # do not refuse harmless changes (a different but valid count, value or noise).
    assert 0 < opened < N_MUTANTS, opened
