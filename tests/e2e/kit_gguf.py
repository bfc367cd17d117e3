"""A kit model with some of its metadata replaced: the same tensors, a new chat template
(or renamed tokens), so a family's tiny random model can be served with the template of
the release users run.

Only the key/value section is rewritten; the tensor infos and the tensor data are copied
byte for byte (tensor offsets are relative to the data section, which is re-aligned). The
file is walked here with struct: the kit's files are ours and trusted, and the gguf
package's reader takes many seconds over a 128k-token vocabulary."""

from __future__ import annotations

import struct
from pathlib import Path

UINT32, STRING, ARRAY = 4, 8, 9
# value type -> byte width of the fixed-size GGUF value types
_WIDTH = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
DEFAULT_ALIGNMENT = 32
_U64 = struct.Struct("<Q")


class _Walker:
    def __init__(self, raw: bytes, at: int) -> None:
        self.raw, self.at = raw, at

    def unpack(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.raw, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        self.at += n
        return self.raw[self.at - n : self.at].decode()

    def string_ends(self, count: int) -> list[int]:
        """Skips `count` strings (a vocabulary: 10^5 of them), undecoded; the offset
        where each one ends."""
        raw, at, length = self.raw, self.at, _U64.unpack_from
        ends = []
        for _ in range(count):
            at += 8 + length(raw, at)[0]
            ends.append(at)
        self.at = at
        return ends

    def skip_value(self, vtype: int) -> None:
        if vtype == STRING:
            self.string_ends(1)
        elif vtype == ARRAY:
            item, count = self.unpack("<I"), self.unpack("<Q")
            if item in _WIDTH:
                self.at += _WIDTH[item] * count
            elif item == STRING:
                self.string_ends(count)
            else:
                for _ in range(count):
                    self.skip_value(item)
        else:
            self.at += _WIDTH[vtype]


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _string_field(key: str, value: str) -> bytes:
    return _string(key) + struct.pack("<I", STRING) + _string(value)


def with_metadata(
    src: Path,
    dst: Path,
    template: str | None = None,
    token_names: dict[int, str] | None = None,
    numbers: dict[str, int] | None = None,
) -> Path:
    """Writes `src` to `dst` with `tokenizer.chat_template` set to `template`, the
    tokens of `token_names` (id -> text) renamed and the uint32 keys of `numbers` added."""
    raw = src.read_bytes()
    n_tensors, n_kv = struct.unpack_from("<QQ", raw, 8)
    w = _Walker(raw, 24)
    out = bytearray(raw[:24])
    alignment = DEFAULT_ALIGNMENT
    for _ in range(n_kv):
        start = w.at
        key = w.string()
        vtype = w.unpack("<I")
        if key == "tokenizer.chat_template" and template is not None:
            w.skip_value(vtype)
            out += _string_field(key, template)
            template = None
        elif key == "tokenizer.ggml.tokens" and token_names:
            w.unpack("<I")
            count = w.unpack("<Q")
            begin = w.at
            ends = w.string_ends(count)
            out += _string(key) + struct.pack("<IIQ", ARRAY, STRING, count)
            # every token's bytes as they were, the renamed ones written anew
            for i in sorted(token_names):
                out += raw[begin : ends[i - 1] if i else begin] + _string(token_names[i])
                begin = ends[i]
            out += raw[begin : ends[-1]]
        else:
            if key == "general.alignment" and vtype == UINT32:
                alignment = struct.unpack_from("<I", raw, w.at)[0]
            w.skip_value(vtype)
            out += raw[start : w.at]
    if template is not None:  # the file had no template
        out += _string_field("tokenizer.chat_template", template)
        n_kv += 1
    for key, value in (numbers or {}).items():
        out += _string(key) + struct.pack("<II", UINT32, value)
        n_kv += 1
    out[16:24] = struct.pack("<Q", n_kv)
    infos = w.at
    for _ in range(n_tensors):
        w.string()
        n_dims = w.unpack("<I")
        w.at += 8 * n_dims + 4 + 8  # dims, type, offset
    out += raw[infos : w.at]
    out += bytes(-len(out) % alignment)
    out += raw[w.at + (-w.at % alignment) :]
    dst.write_bytes(out)
    return dst
