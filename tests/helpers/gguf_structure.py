"""Where each structural field of a GGUF lies (counts, lengths, types, offsets), found
with the gguf package's reader, and a writer of a tiny llama with a small SentencePiece
vocabulary: the material of the GGUF validation and mutation tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from tests.reference.tiny_llama import N_VOCAB, write_tiny_llama


@dataclass(frozen=True)
class Field:
    """An integer field of the file: what it is, where, how wide, its value."""

    what: str
    offset: int
    size: int  # 4 or 8 bytes
    value: int


def structure(path: Path) -> list[Field]:
    """Every count, length, type and offset field of the file, in file order."""
    r = gguf.GGUFReader(path)
    base = r.data.ctypes.data

    def at(part: np.ndarray) -> int:
        return part.ctypes.data - base

    fields: list[Field] = []

    def add(what: str, part: np.ndarray, index: int = 0) -> None:
        size = part.dtype.itemsize
        fields.append(Field(what, at(part) + index * size, size, int(part[index])))

    for key, f in r.fields.items():
        if key.startswith("GGUF."):
            add(key, f.parts[0])
            continue
        add(f"{key} key length", f.parts[0])
        add(f"{key} type", f.parts[2])
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            add(f"{key} item type", f.parts[3])
            add(f"{key} count", f.parts[4])
            if f.types[1] == gguf.GGUFValueType.STRING:
                for j in range(0, len(f.data), max(1, len(f.data) // 8)):
                    add(f"{key}[{j}] length", f.parts[f.data[j] - 1])
        elif f.types[0] == gguf.GGUFValueType.STRING:
            add(f"{key} length", f.parts[3])
        elif f.types[0] in (gguf.GGUFValueType.UINT32, gguf.GGUFValueType.UINT64):
            add(f"{key} value", f.parts[3])
    for t in r.tensors:
        name_len, _name, n_dims, dims, ttype, offset = t.field.parts
        add(f"{t.name} name length", name_len)
        add(f"{t.name} n_dims", n_dims)
        for i in range(len(dims)):
            add(f"{t.name} dim {i}", dims, i)
        add(f"{t.name} type", ttype)
        add(f"{t.name} offset", offset)
    return fields


def write_tiny_model(path: Path, **options) -> Path:
    """write_tiny_llama plus a SentencePiece vocabulary of N_VOCAB tokens."""
    pieces = ["▁", *"abcdefghijklmnopqrstuvwxyz", *"ABCDEFGHIJKLMNOPQRSTUVWXYZ"]
    pieces += [*"0123456789.,!?'", "▁t", "▁a", "th", "he", "in", "er", "an", "▁th", "the"]
    pieces += ["▁the", "on", "re", "at", "en", "nd", "ou", "▁w", "▁s", "ed", "▁o"]
    tokens = ["<unk>", "<s>", "</s>", *pieces]
    tokens += [f"<extra_{i}>" for i in range(N_VOCAB - len(tokens))]
    types = [2, 3, 3] + [1] * len(pieces) + [4] * (N_VOCAB - 3 - len(pieces))
    scores = [0.0, 0.0, 0.0] + [-float(i) for i in range(N_VOCAB - 3)]

    def vocab(w: gguf.GGUFWriter) -> None:
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_scores(scores)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)

    return write_tiny_llama(path, extra=vocab, **options)


def write_tiny_bpe_vocab(path: Path) -> Path:
    """A vocab-only GGUF with a byte-level BPE vocabulary: the 256 byte symbols, some
    merges, and chat markers."""
    from ds4d.engine.tokenizer import _BYTE_OF_CHAR

    symbols = sorted(_BYTE_OF_CHAR, key=_BYTE_OF_CHAR.__getitem__)
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("a", "t")]
    tokens = [*symbols, *(a + b for a, b in merges), "<|im_start|>", "<|im_end|>"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(tokens) - 2) + [3, 3])
    w.add_token_merges([f"{a} {b}" for a, b in merges])
    w.add_eos_token_id(len(tokens) - 1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return path
