"""Disk KV file format: round trip, validation, atomic writes, in-place header updates."""

from __future__ import annotations

import os
import stat
import zlib

import pytest

from ds4d.state import kvfile
from ds4d.state.kvfile import Reason

FP = kvfile.fingerprint_digest("model-a")
TEXT = "<|im_start|>system\nYou are terse. ünïcode ✓<|im_end|>\n"


def write(tmp_path, payload=None, **kw):
    args = dict(reason=Reason.COLD, tokens=700, ctx=8192, fingerprint=FP)
    args.update(kw)
    return kvfile.write_file(
        tmp_path, TEXT, payload if payload is not None else os.urandom(5000), **args
    )


def test_round_trip_with_tool_map(tmp_path):
    payload = os.urandom(70_001)
    tools = {
        "call_1": '<tool_call>\n{"name": "ls", "arguments": {"a": 1}}\n</tool_call>',
        "call_2": "ünï",
    }
    path, header = write(tmp_path, payload, tool_map=tools, now=1234)
    assert path.name == kvfile.file_name(TEXT) and kvfile.is_kv_name(path.name)
    assert path.stat().st_size == header.file_size
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left over

    read = kvfile.read_header(path)
    assert read == header
    assert (read.reason, read.tokens, read.ctx, read.created_ms, read.last_used_ms, read.hits) == (
        Reason.COLD,
        700,
        8192,
        1234,
        1234,
        0,
    )
    assert read.flags & kvfile.FLAG_TOOL_MAP
    body = kvfile.read_body(path, read, expect_text=TEXT.encode())
    assert (body.text, body.payload, body.tool_map) == (TEXT, payload, tools)
    assert kvfile.read_tool_map(path, read) == tools


def test_payload_writer_streams_into_file(tmp_path):
    chunks = [os.urandom(1000) for _ in range(5)]

    def save(fp):  # what Session.save(fp) does: several writes
        for c in chunks:
            fp.write(c)

    path, header = write(tmp_path, save)
    assert header.payload_bytes == 5000 and not header.flags
    assert kvfile.read_body(path, header).payload == b"".join(chunks)


def test_truncated_file_rejected(tmp_path):
    path, header = write(tmp_path)
    with open(path, "r+b") as f:
        f.truncate(header.file_size - 1)
    with pytest.raises(kvfile.Truncated):
        kvfile.read_header(path)


@pytest.mark.parametrize("offset", [0, 20, 60, kvfile.HEADER_SIZE + 3, -10])
def test_bit_flip_rejected(tmp_path, offset):
    path, header = write(tmp_path)
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(kvfile.KVFileError):
        h = kvfile.read_header(path)
        kvfile.read_body(path, h)


def test_hit_fields_update_in_place_and_are_not_checksummed(tmp_path):
    path, header = write(tmp_path, now=1000)
    inode = path.stat().st_ino
    kvfile.touch(path, 7, 99_000)
    read = kvfile.read_header(path)
    assert (read.hits, read.last_used_ms, read.created_ms) == (7, 99_000, 1000)
    assert path.stat().st_ino == inode
    kvfile.read_body(path, read)  # still verifies


def test_compatibility_checks(tmp_path):
    _, header = write(tmp_path, ctx=4096, tokens=1000)
    kvfile.check_compatible(header, FP, 4096)
    kvfile.check_compatible(header, FP, 8192)
    with pytest.raises(kvfile.ForeignModel):
        kvfile.check_compatible(header, kvfile.fingerprint_digest("model-b"), 8192)
    with pytest.raises(kvfile.ContextTooSmall):
        kvfile.check_compatible(header, FP, 2048)


def test_text_mismatch_and_bad_magic(tmp_path):
    path, header = write(tmp_path)
    with pytest.raises(kvfile.TextMismatch):
        kvfile.read_body(path, header, expect_text=b"something else")
    raw = bytearray(path.read_bytes())
    raw[:4] = b"NOPE"
    path.write_bytes(bytes(raw))
    with pytest.raises(kvfile.BadHeader, match="magic"):
        kvfile.read_header(path)


def test_failed_payload_writer_leaves_nothing(tmp_path):
    def broken(fp):
        fp.write(b"x" * 100)
        raise OSError("disk on fire")

    with pytest.raises(OSError):
        write(tmp_path, broken)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(OverflowError):
        write(tmp_path, b"y" * 10_000, max_bytes=5000)
    assert list(tmp_path.iterdir()) == []


def test_header_layout_is_little_endian_and_documented(tmp_path):
    path, header = write(tmp_path, tokens=0x01020304, now=5)
    raw = path.read_bytes()
    assert raw[:4] == b"DS4K" and raw[4:6] == b"\x01\x00"
    assert raw[48:52] == b"\x04\x03\x02\x01"
    assert int.from_bytes(raw[92:96], "little") == zlib.crc32(raw[:92])
    assert raw[kvfile.HEADER_SIZE : kvfile.HEADER_SIZE + header.text_bytes] == TEXT.encode()
