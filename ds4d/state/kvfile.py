"""One disk KV checkpoint file: header, rendered text, engine payload, tool map.

The layout is documented in docs/kv-cache-format.md. A delta checkpoint (flag 0x02) holds
only the rows after its base: its payload section starts with the base file's name (the
20-byte SHA1 of the base's text) and its chain depth (u32), covered by the body checksum
like the rest, then the engine's delta payload. A file is written once, atomically
(temporary file in the same directory, fsync, rename, directory fsync); afterwards only
the two mutable header fields (hit count, last-used time) are rewritten in place.

Everything here is synchronous file I/O; callers run it off the event loop.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import io
import itertools
import os
import struct
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ds4d.engine.engine import ByteSink

MAGIC = b"DS4K"
VERSION = 1
HEADER_SIZE = 128
SUFFIX = ".kv"
TMP_MARKER = ".tmp."
FLAG_TOOL_MAP = 0x01
FLAG_DELTA = 0x02
# payload prefix of a delta file: base file name (sha1 digest), chain depth (1 = on a full)
DELTA_PREFIX = struct.Struct("<20sI")
TOOL_MAP_MAGIC = b"DTM1"
MAX_ID_BYTES = 256

# Immutable part, covered by its own CRC (offsets 0..96).
_FIXED = struct.Struct("<4sHHBBHI32sIIQQQQI")
# Mutable part, rewritten in place on a hit (offset 96): hits, reserved, last-used ms.
_MUTABLE = struct.Struct("<IIQ")
_MUTABLE_OFFSET = _FIXED.size + 4
assert _FIXED.size == 92 and _MUTABLE_OFFSET + _MUTABLE.size <= HEADER_SIZE

_tmp_serial = itertools.count()

PayloadWriter = Callable[[ByteSink], object]  # writes an engine payload (SessionSnapshot.write)


class Reason(enum.IntEnum):
    """Why a checkpoint was written."""

    UNKNOWN = 0
    COLD = 1
    CONTINUED = 2
    EVICT = 3
    SHUTDOWN = 4

    @property
    def is_anchor(self) -> bool:
        """Anchors mark where a conversation started or stopped; eviction favours them."""
        return self in (Reason.COLD, Reason.EVICT, Reason.SHUTDOWN)


class KVFileError(Exception):
    """The file cannot be used; the message says why in one line."""


class BadHeader(KVFileError):
    """Wrong magic, unknown version, impossible sizes or a header checksum mismatch."""


class Truncated(KVFileError):
    """The file is shorter (or longer) than its header says."""


class ChecksumMismatch(KVFileError):
    """Text, payload or tool map bytes differ from what was written."""


class ForeignModel(KVFileError):
    """Written for another model (fingerprint differs)."""


class ContextTooSmall(KVFileError):
    """Written for a larger context than the running session has."""


class TextMismatch(KVFileError):
    """The stored rendered text is not the text the caller expected."""


def fingerprint_digest(fingerprint: str | bytes) -> bytes:
    """The 32 bytes stored in the header for an engine fingerprint of any length."""
    if isinstance(fingerprint, str):
        fingerprint = fingerprint.encode()
    return hashlib.sha256(fingerprint).digest()


def file_name(text: str | bytes) -> str:
    """`<sha1 of the rendered text's UTF-8 bytes>.kv`."""
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha1(data).hexdigest() + SUFFIX


def is_kv_name(name: str) -> bool:
    stem, dot, ext = name.partition(".")
    return (
        dot == "."
        and ext == SUFFIX[1:]
        and len(stem) == 40
        and all(c in "0123456789abcdef" for c in stem)
    )


def tmp_owner_pid(name: str) -> int | None:
    """The writer's pid of a temporary file name, None if `name` is not one of ours."""
    if not name.startswith(".") or TMP_MARKER not in name:
        return None
    pid = name.rsplit(TMP_MARKER, 1)[1].split(".", 1)[0]
    return int(pid) if pid.isdigit() else None


def doomed_name(name: str) -> str:
    """A temporary name a file is renamed to before it is deleted: renaming is quick where
    deleting a large file is not, so an index lock covers only the rename; the name reads
    as an unfinished write of this process, which a scan never loads (and a restart
    removes)."""
    return f".{name}{TMP_MARKER}{os.getpid()}.{next(_tmp_serial)}.gone"


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Header:
    reason: Reason
    flags: int
    ctx: int
    fingerprint: bytes
    tokens: int
    created_ms: int
    text_bytes: int
    payload_bytes: int
    tool_map_bytes: int
    body_crc: int
    hits: int
    last_used_ms: int
    base: bytes = b""  # a delta's base file (sha1 digest); read from the payload prefix
    depth: int = 0  # links below this file in its chain

    @property
    def is_delta(self) -> bool:
        return bool(self.flags & FLAG_DELTA)

    @property
    def base_name(self) -> str | None:
        return self.base.hex() + SUFFIX if self.is_delta else None

    @property
    def file_size(self) -> int:
        return HEADER_SIZE + self.text_bytes + self.payload_bytes + self.tool_map_bytes

    def pack(self) -> bytes:
        fixed = _FIXED.pack(
            MAGIC,
            VERSION,
            HEADER_SIZE,
            int(self.reason),
            self.flags,
            0,
            self.ctx,
            self.fingerprint,
            self.tokens,
            0,
            self.created_ms,
            self.text_bytes,
            self.payload_bytes,
            self.tool_map_bytes,
            self.body_crc,
        )
        out = bytearray(HEADER_SIZE)
        out[: _FIXED.size] = fixed
        struct.pack_into("<I", out, _FIXED.size, zlib.crc32(fixed))
        _MUTABLE.pack_into(out, _MUTABLE_OFFSET, self.hits, 0, self.last_used_ms)
        return bytes(out)

    @classmethod
    def unpack(cls, raw: bytes) -> Header:
        if len(raw) < HEADER_SIZE:
            raise Truncated(f"header is {len(raw)} bytes, expected {HEADER_SIZE}")
        (
            magic,
            version,
            hsize,
            reason,
            flags,
            _r0,
            ctx,
            fp,
            tokens,
            _r1,
            created,
            text_b,
            payload_b,
            tool_b,
            body_crc,
        ) = _FIXED.unpack_from(raw)
        if magic != MAGIC:
            raise BadHeader(f"bad magic {magic!r}")
        if version != VERSION or hsize != HEADER_SIZE:
            raise BadHeader(f"unsupported version {version} (header size {hsize})")
        (header_crc,) = struct.unpack_from("<I", raw, _FIXED.size)
        if zlib.crc32(raw[: _FIXED.size]) != header_crc:
            raise BadHeader("header checksum mismatch")
        if tokens == 0 or text_b == 0 or payload_b == 0:
            raise BadHeader("empty checkpoint")
        if bool(flags & FLAG_TOOL_MAP) != (tool_b > 0):
            raise BadHeader("tool-map flag disagrees with its size")
        if flags & FLAG_DELTA and payload_b <= DELTA_PREFIX.size:
            raise BadHeader("delta checkpoint without a payload")
        hits, _r2, last_used = _MUTABLE.unpack_from(raw, _MUTABLE_OFFSET)
        try:
            why = Reason(reason)
        except ValueError:
            why = Reason.UNKNOWN
        return cls(
            why,
            flags,
            ctx,
            fp,
            tokens,
            created,
            text_b,
            payload_b,
            tool_b,
            body_crc,
            hits,
            last_used,
        )


def read_header(path: Path) -> Header:
    """The validated header of `path`; also checks the file size against it."""
    with open(path, "rb") as f:
        header = Header.unpack(f.read(HEADER_SIZE))
        size = os.fstat(f.fileno()).st_size
        if size != header.file_size:
            raise Truncated(f"file is {size} bytes, header says {header.file_size}")
        if header.is_delta:  # the base reference; the body checksum covers it on load
            f.seek(HEADER_SIZE + header.text_bytes)
            base, depth = DELTA_PREFIX.unpack(f.read(DELTA_PREFIX.size))
            if depth < 1:
                raise BadHeader("delta checkpoint with chain depth 0")
            header = dataclasses.replace(header, base=base, depth=depth)
    return header


def check_compatible(header: Header, fingerprint: bytes, ctx: int) -> None:
    """Raise unless a session with `fingerprint` (digest) and context `ctx` can load it."""
    if header.fingerprint != fingerprint:
        raise ForeignModel(f"written for model {header.fingerprint.hex()[:12]}")
    if header.ctx > ctx or header.tokens >= ctx:
        raise ContextTooSmall(
            f"written for ctx {header.ctx} with {header.tokens} tokens, session ctx is {ctx}"
        )


def encode_tool_map(tool_map: Mapping[str, str]) -> bytes:
    """Tool-map section: magic, u32 count, then (u32 id len, u32 text len, id, text)."""
    if not tool_map:
        return b""
    out = io.BytesIO()
    out.write(TOOL_MAP_MAGIC + struct.pack("<I", len(tool_map)))
    for call_id, text in tool_map.items():
        ib, tb = call_id.encode(), text.encode()
        if not 1 <= len(ib) <= MAX_ID_BYTES:
            raise ValueError(f"tool-call id of {len(ib)} bytes")
        out.write(struct.pack("<II", len(ib), len(tb)) + ib + tb)
    return out.getvalue()


def decode_tool_map(data: bytes) -> dict[str, str]:
    if not data:
        return {}
    view = memoryview(data)
    if bytes(view[:4]) != TOOL_MAP_MAGIC or len(view) < 8:
        raise BadHeader("bad tool-map section")
    (count,) = struct.unpack_from("<I", view, 4)
    pos, out = 8, {}
    for _ in range(count):
        if pos + 8 > len(view):
            raise Truncated("tool-map section ends early")
        id_len, text_len = struct.unpack_from("<II", view, pos)
        pos += 8
        if not 1 <= id_len <= MAX_ID_BYTES or pos + id_len + text_len > len(view):
            raise BadHeader("bad tool-map entry")
        call_id = bytes(view[pos : pos + id_len]).decode()
        pos += id_len
        out[call_id] = bytes(view[pos : pos + text_len]).decode()
        pos += text_len
    if pos != len(view):
        raise BadHeader("trailing bytes in tool-map section")
    return out


class _CountingWriter:
    """What a payload writer sees: write() only, with a running CRC and byte count."""

    def __init__(self, f: BinaryIO, crc: int) -> None:
        self._f = f
        self.crc = crc
        self.count = 0

    def write(self, data: bytes | memoryview, /) -> int:
        view = memoryview(data).cast("B")
        self._f.write(view)
        self.crc = zlib.crc32(view, self.crc)
        self.count += len(view)
        return len(view)

    def flush(self) -> None:
        pass


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(
    directory: Path,
    text: str,
    payload: bytes | PayloadWriter,
    *,
    reason: Reason,
    tokens: int,
    ctx: int,
    fingerprint: bytes,
    tool_map: Mapping[str, str] | None = None,
    now: int | None = None,
    max_bytes: int | None = None,
    base: str | None = None,
    depth: int = 0,
) -> tuple[Path, Header]:
    """Write a checkpoint atomically; returns its final path and header.

    `payload` is the engine's bytes or a function writing them to a file object
    (Session.save). With `max_bytes`, a file that turns out larger is discarded and
    OverflowError raised — the caller's budget is re-checked on the real size. With
    `base` (a file name), a delta: `payload` is the engine's delta payload on that base,
    and `depth` the number of links under it."""
    base_digest = b""
    if base is not None:
        if not is_kv_name(base) or depth < 1:
            raise ValueError(f"bad delta base {base!r} (depth {depth})")
        base_digest = bytes.fromhex(base[:40])
    text_b = text.encode()
    tool_b = encode_tool_map(tool_map or {})
    final = directory / file_name(text_b)
    tmp = directory / f".{final.name}{TMP_MARKER}{os.getpid()}.{next(_tmp_serial)}"
    stamp = now_ms() if now is None else now
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(bytes(HEADER_SIZE))
            f.write(text_b)
            writer = _CountingWriter(f, zlib.crc32(text_b))
            if base_digest:
                writer.write(DELTA_PREFIX.pack(base_digest, depth))
            if callable(payload):
                payload(writer)
            else:
                writer.write(payload)
            if writer.count <= (DELTA_PREFIX.size if base_digest else 0):
                raise KVFileError("engine payload is empty")
            f.write(tool_b)
            header = Header(
                reason=reason,
                flags=(FLAG_TOOL_MAP if tool_b else 0) | (FLAG_DELTA if base_digest else 0),
                ctx=ctx,
                fingerprint=fingerprint,
                tokens=tokens,
                created_ms=stamp,
                text_bytes=len(text_b),
                payload_bytes=writer.count,
                tool_map_bytes=len(tool_b),
                body_crc=zlib.crc32(tool_b, writer.crc),
                hits=0,
                last_used_ms=stamp,
                base=base_digest,
                depth=depth,
            )
            if max_bytes is not None and header.file_size > max_bytes:
                raise OverflowError(f"checkpoint of {header.file_size} bytes exceeds {max_bytes}")
            f.seek(0)
            f.write(header.pack())
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(directory)
    return final, header


@dataclass(frozen=True)
class Body:
    text: str
    payload: bytes
    tool_map: dict[str, str]


def read_body(path: Path, header: Header, expect_text: bytes | None = None) -> Body:
    """Read and verify text, payload and tool map of a file whose header is `header`;
    with `expect_text`, the stored text must be exactly those bytes."""
    with open(path, "rb") as f:
        if Header.unpack(f.read(HEADER_SIZE)).body_crc != header.body_crc:
            raise KVFileError("file changed since its header was read")
        text_b = f.read(header.text_bytes)
        if expect_text is not None and text_b != expect_text:
            raise TextMismatch("stored text differs from the expected prefix")
        payload = f.read(header.payload_bytes)
        tool_b = f.read(header.tool_map_bytes)
    if len(text_b) + len(payload) + len(tool_b) != header.file_size - HEADER_SIZE:
        raise Truncated("file ends early")
    crc = zlib.crc32(tool_b, zlib.crc32(payload, zlib.crc32(text_b)))
    if crc != header.body_crc:
        raise ChecksumMismatch("body checksum mismatch")
    try:
        text = text_b.decode()
    except UnicodeDecodeError as e:
        raise BadHeader("stored text is not UTF-8") from e
    if header.is_delta:
        if DELTA_PREFIX.unpack_from(payload) != (header.base, header.depth):
            raise KVFileError("file changed since its header was read")
        payload = payload[DELTA_PREFIX.size :]
    return Body(text, payload, decode_tool_map(tool_b))


def read_text(path: Path, header: Header) -> bytes:
    """Only the rendered text bytes (not checksummed on their own)."""
    with open(path, "rb") as f:
        f.seek(HEADER_SIZE)
        return f.read(header.text_bytes)


def read_tool_map(path: Path, header: Header) -> dict[str, str]:
    """Only the tool-map section (not checksummed on its own)."""
    if not header.tool_map_bytes:
        return {}
    with open(path, "rb") as f:
        f.seek(header.file_size - header.tool_map_bytes)
        return decode_tool_map(f.read(header.tool_map_bytes))


def touch(path: Path, hits: int, last_used_ms: int) -> None:
    """Rewrite the mutable header fields in place and make them durable."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, _MUTABLE.pack(hits, 0, last_used_ms), _MUTABLE_OFFSET)
        os.fsync(fd)
    finally:
        os.close(fd)
