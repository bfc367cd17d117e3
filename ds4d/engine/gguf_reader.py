"""Parses a GGUF's header, metadata and tensor index from its bytes, trusting nothing.

Every count and length read from the file is checked against the bytes that are left
before anything is allocated; value types and tensor types must be known ones; every
tensor's byte range must be aligned, inside the file and clear of the other tensors. A
problem raises GGUFFormatError with one line naming the key or tensor (GGUFFile adds the
path and turns it into a ModelLoadError).

Large metadata arrays (a vocabulary, its merges and scores) are not decoded here: the
parser only steps over them and remembers where they lie. GGUFArray decodes them on use,
numbers as one numpy view and strings in one vectorised pass, so that opening a file with
a 260k-token vocabulary costs milliseconds rather than the seconds that per-element Python
objects cost.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MIN_ALIGNMENT = 8  # the widest tensor element (F64, I64)
MAX_DIMS = 4  # ggml tensors have at most four dimensions
MAX_NAME_BYTES = 64  # ggml's tensor name limit, terminating NUL included
MAX_ARRAY_NESTING = 2  # an array of arrays of scalars is the deepest any writer emits

# GGUF metadata value types.
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY = range(10)
UINT64, INT64, FLOAT64 = 10, 11, 12

_SCALAR_FORMATS = {
    UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i",
    FLOAT32: "<f", BOOL: "<?", UINT64: "<Q", INT64: "<q", FLOAT64: "<d",
}  # fmt: skip
_SCALARS = {t: struct.Struct(f) for t, f in _SCALAR_FORMATS.items()}
_NUMPY_DTYPES: dict[int, np.dtype[Any]] = {
    UINT8: np.dtype("<u1"), INT8: np.dtype("<i1"), UINT16: np.dtype("<u2"),
    INT16: np.dtype("<i2"), UINT32: np.dtype("<u4"), INT32: np.dtype("<i4"),
    FLOAT32: np.dtype("<f4"), BOOL: np.dtype("?"), UINT64: np.dtype("<u8"),
    INT64: np.dtype("<i8"), FLOAT64: np.dtype("<f8"),
}  # fmt: skip
VALUE_TYPE_NAMES = {
    UINT8: "UINT8", INT8: "INT8", UINT16: "UINT16", INT16: "INT16", UINT32: "UINT32",
    INT32: "INT32", FLOAT32: "FLOAT32", BOOL: "BOOL", STRING: "STRING", ARRAY: "ARRAY",
    UINT64: "UINT64", INT64: "INT64", FLOAT64: "FLOAT64",
}  # fmt: skip
# What the parser reads from: the file's mmap (bytes in tests).
Buffer: TypeAlias = mmap.mmap | bytes | bytearray | memoryview

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class GGMLType:
    """A ggml tensor type: `block_size` elements are stored in `type_size` bytes."""

    id: int
    name: str
    block_size: int
    type_size: int


# ggml's tensor types as GGUF files number them (ids 4, 5 and 31-33 were retired).
# fmt: off
GGML_TYPES: dict[int, GGMLType] = {t.id: t for t in (
    GGMLType(0, "F32", 1, 4), GGMLType(1, "F16", 1, 2), GGMLType(2, "Q4_0", 32, 18),
    GGMLType(3, "Q4_1", 32, 20), GGMLType(6, "Q5_0", 32, 22), GGMLType(7, "Q5_1", 32, 24),
    GGMLType(8, "Q8_0", 32, 34), GGMLType(9, "Q8_1", 32, 40), GGMLType(10, "Q2_K", 256, 84),
    GGMLType(11, "Q3_K", 256, 110), GGMLType(12, "Q4_K", 256, 144),
    GGMLType(13, "Q5_K", 256, 176), GGMLType(14, "Q6_K", 256, 210),
    GGMLType(15, "Q8_K", 256, 292), GGMLType(16, "IQ2_XXS", 256, 66),
    GGMLType(17, "IQ2_XS", 256, 74), GGMLType(18, "IQ3_XXS", 256, 98),
    GGMLType(19, "IQ1_S", 256, 50), GGMLType(20, "IQ4_NL", 32, 18),
    GGMLType(21, "IQ3_S", 256, 110), GGMLType(22, "IQ2_S", 256, 82),
    GGMLType(23, "IQ4_XS", 256, 136), GGMLType(24, "I8", 1, 1), GGMLType(25, "I16", 1, 2),
    GGMLType(26, "I32", 1, 4), GGMLType(27, "I64", 1, 8), GGMLType(28, "F64", 1, 8),
    GGMLType(29, "IQ1_M", 256, 56), GGMLType(30, "BF16", 1, 2),
    GGMLType(34, "TQ1_0", 256, 54), GGMLType(35, "TQ2_0", 256, 66),
    GGMLType(39, "MXFP4", 32, 17), GGMLType(40, "NVFP4", 64, 36),
    GGMLType(41, "Q1_0", 128, 18),
)}
# fmt: on

# Element dtype of the tensor types numpy can view directly; others are viewed as bytes.
TENSOR_DTYPES: dict[int, np.dtype[Any]] = {
    0: np.dtype(np.float32), 1: np.dtype(np.float16), 28: np.dtype(np.float64),
    24: np.dtype(np.int8), 25: np.dtype(np.int16), 26: np.dtype(np.int32),
    27: np.dtype(np.int64),
}  # fmt: skip


class GGUFFormatError(ValueError):
    """The bytes are not a well-formed GGUF; the message is one line naming the culprit."""


class GGUFArray:
    """A metadata array, decoded from the file on request (see the module docstring)."""

    def __init__(
        self,
        buf: Buffer,
        item_type: int,
        count: int,
        offset: int,
        end: int,
        key: str,
        lengths: list[int] | None = None,
    ) -> None:
        self._buf = buf
        self.item_type = item_type
        self.count = count
        self._offset = offset
        self._end = end
        self._key = key
        self._lengths = lengths  # string arrays: the byte length of each string

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"GGUFArray({VALUE_TYPE_NAMES[self.item_type]} x {self.count})"

    def numpy(self) -> np.ndarray:
        """The numbers as a read-only array (a view of the file's bytes)."""
        dtype = _NUMPY_DTYPES.get(self.item_type)
        if dtype is None:
            raise TypeError(f"metadata {self._key} is an array of strings, not numbers")
        arr: np.ndarray
        if self.item_type == BOOL:  # any nonzero byte is true, as in a C reader
            arr = np.frombuffer(memoryview(self._buf), np.uint8, self.count, self._offset) != 0
        else:
            arr = np.frombuffer(
                memoryview(self._buf), dtype=dtype, count=self.count, offset=self._offset
            )
        arr.flags.writeable = False
        return arr

    def strings(self) -> list[str]:
        """The strings; GGUFFormatError names the first one that is not valid UTF-8."""
        if self._lengths is None:
            raise TypeError(f"metadata {self._key} is an array of numbers, not strings")
        if self.count == 0:
            return []
        # Each string is stored as a u64 length then its bytes. Dropping the first seven
        # bytes of every length leaves its top byte, always 0 (lengths are far below
        # 2^56), as a separator before each string: one decode and one split do it all.
        lengths = np.asarray(self._lengths, dtype=np.int64)
        ends = np.cumsum(lengths + 8)
        starts = ends - lengths - 8
        region = np.frombuffer(self._buf, np.uint8, self._end - self._offset, self._offset)
        edges = np.zeros(len(region) + 1, np.int8)
        edges[starts + 7] = 1
        edges[ends] -= 1
        keep = np.cumsum(edges[:-1], dtype=np.int8).view(np.bool_)
        try:
            out = region[keep].tobytes().decode("utf-8").split("\0")[1:]
        except UnicodeDecodeError:
            out = []
        if len(out) == self.count:
            return out
        return self._strings_one_by_one(starts + self._offset + 8, lengths)

    def _strings_one_by_one(self, starts: np.ndarray, lengths: np.ndarray) -> list[str]:
        """The slow path, for strings that hold a NUL or bad UTF-8."""
        out = []
        raw = memoryview(self._buf)
        for i, (start, n) in enumerate(zip(starts.tolist(), lengths.tolist(), strict=True)):
            try:
                out.append(str(raw[start : start + n], "utf-8"))
            except UnicodeDecodeError:
                raise GGUFFormatError(f"metadata {self._key}[{i}] is not valid UTF-8") from None
        return out

    def tolist(self) -> list[Any]:
        """Python values, as gguf.GGUFReader's field.contents() gives them."""
        if self._lengths is not None:
            return self.strings()
        values: list[Any] = self.numpy().tolist()
        return values


@dataclass(frozen=True)
class TensorInfo:
    """A tensor of the index: `shape` in GGUF order (ne0 first), `offset` from the start
    of the file, `n_bytes` the size its type and shape imply."""

    name: str
    type: GGMLType
    shape: tuple[int, ...]
    offset: int
    n_bytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class GGUFIndex:
    version: int
    alignment: int
    data_offset: int
    metadata: dict[str, Any]  # scalars, str, GGUFArray, or lists of GGUFArray (nested)
    value_types: dict[str, int]
    tensors: list[TensorInfo]


class _Cursor:
    """Reads little-endian values at a position, never past the end of the buffer."""

    def __init__(self, buf: Buffer, size: int) -> None:
        self.buf = buf
        self.size = size
        self.pos = 0

    def left(self) -> int:
        return self.size - self.pos

    def take(self, n: int, what: str) -> int:
        if n > self.size - self.pos:
            raise GGUFFormatError(
                f"{what} needs {n} bytes at offset {self.pos}, the file has {self.left()} left"
            )
        start = self.pos
        self.pos += n
        return start

    def u32(self, what: str) -> int:
        return int(_U32.unpack_from(self.buf, self.take(4, what))[0])

    def u64(self, what: str) -> int:
        return int(_U64.unpack_from(self.buf, self.take(8, what))[0])

    def string(self, what: str) -> str:
        n = self.u64(what)
        start = self.take(n, what)
        try:
            return str(memoryview(self.buf)[start : start + n], "utf-8")
        except UnicodeDecodeError:
            raise GGUFFormatError(f"{what} is not valid UTF-8") from None


def parse(buf: Buffer, size: int) -> GGUFIndex:
    """The index of the GGUF in `buf` (`size` bytes); GGUFFormatError if malformed."""
    cur = _Cursor(buf, size)
    if size < 4 or bytes(memoryview(buf)[:4]) != GGUF_MAGIC:
        head = bytes(memoryview(buf)[: min(size, 4)])
        raise GGUFFormatError(f"not a GGUF file (bad magic {head!r})")
    cur.take(4, "magic")
    version = cur.u32("the version")
    if version not in SUPPORTED_VERSIONS:
        if version & 0xFFFF == 0 and int.from_bytes(version.to_bytes(4, "little"), "big") in (
            SUPPORTED_VERSIONS
        ):
            raise GGUFFormatError("big-endian GGUF files are not supported")
        raise GGUFFormatError(f"GGUF version {version} is not supported (expected 2 or 3)")
    n_tensors = cur.u64("the tensor count")
    n_kv = cur.u64("the metadata count")
    # The smallest metadata entry: an empty key, its type and one byte of value.
    if n_kv > cur.left() // 13:
        raise GGUFFormatError(f"metadata count {n_kv} cannot fit in the {size}-byte file")
    metadata: dict[str, Any] = {}
    value_types: dict[str, int] = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key #{i}")
        if key in metadata:
            raise GGUFFormatError(f"metadata key {key} appears twice")
        vtype = cur.u32(f"metadata {key} type")
        metadata[key] = _value(cur, vtype, key, 0)
        value_types[key] = vtype

    alignment = DEFAULT_ALIGNMENT
    if "general.alignment" in metadata:
        alignment = metadata["general.alignment"]
        # At least 8, so that every tensor's elements are aligned for the C code.
        if (
            value_types["general.alignment"] != UINT32
            or alignment < MIN_ALIGNMENT
            or (alignment & (alignment - 1))
        ):
            raise GGUFFormatError(
                f"metadata general.alignment is {alignment!r}, expected a power of two of at"
                f" least {MIN_ALIGNMENT} (UINT32)"
            )

    # The smallest tensor entry: an empty name, one dimension, type and offset.
    if n_tensors > cur.left() // 32:
        raise GGUFFormatError(f"tensor count {n_tensors} cannot fit in the {size}-byte file")
    raw = [_tensor_entry(cur, i) for i in range(n_tensors)]
    data_offset = -(-cur.pos // alignment) * alignment
    if raw and data_offset > size:
        raise GGUFFormatError(f"tensor data would start at {data_offset}, past the file end")
    tensors = [_tensor(entry, data_offset, alignment, size) for entry in raw]
    _check_no_overlaps(tensors)
    return GGUFIndex(version, alignment, data_offset, metadata, value_types, tensors)


def _value(cur: _Cursor, vtype: int, key: str, depth: int) -> Any:
    scalar = _SCALARS.get(vtype)
    if scalar is not None:
        return scalar.unpack_from(cur.buf, cur.take(scalar.size, f"metadata {key}"))[0]
    if vtype == STRING:
        return cur.string(f"metadata {key}")
    if vtype != ARRAY:
        raise GGUFFormatError(f"metadata {key} has unknown value type {vtype}")
    item = cur.u32(f"metadata {key} item type")
    count = cur.u64(f"metadata {key} length")
    scalar = _SCALARS.get(item)
    if scalar is not None:
        if count > cur.left() // scalar.size:
            raise GGUFFormatError(
                f"metadata {key}: {count} items of {VALUE_TYPE_NAMES[item]}"
                f" cannot fit in the {cur.left()} bytes left"
            )
        start = cur.take(count * scalar.size, f"metadata {key}")
        return GGUFArray(cur.buf, item, count, start, cur.pos, key)
    if item == STRING:
        if count > cur.left() // 8:
            raise GGUFFormatError(
                f"metadata {key}: {count} strings cannot fit in the {cur.left()} bytes left"
            )
        start = cur.pos
        lengths = _string_lengths(cur, count, key)
        return GGUFArray(cur.buf, item, count, start, cur.pos, key, lengths)
    if item == ARRAY:
        if depth + 1 >= MAX_ARRAY_NESTING:
            raise GGUFFormatError(f"metadata {key} nests arrays too deep")
        if count > cur.left() // 12:
            raise GGUFFormatError(
                f"metadata {key}: {count} arrays cannot fit in the {cur.left()} bytes left"
            )
        return [_value(cur, ARRAY, key, depth + 1) for _ in range(count)]
    raise GGUFFormatError(f"metadata {key} has unknown array item type {item}")


def _string_lengths(cur: _Cursor, count: int, key: str) -> list[int]:
    """Steps over `count` length-prefixed strings; the hot loop of opening a big vocab."""
    buf, pos, size = cur.buf, cur.pos, cur.size
    unpack = _U64.unpack_from
    lengths: list[int] = []
    add = lengths.append
    try:
        for _ in range(count):
            n = unpack(buf, pos)[0]
            add(n)
            pos += 8 + n
            if pos > size:
                break
    except struct.error:  # a length field that runs past the end
        pos = size + 1
    if pos > size:
        raise GGUFFormatError(f"metadata {key}[{len(lengths) - 1}] runs past the end of the file")
    cur.pos = pos
    return lengths


@dataclass(frozen=True)
class _RawTensor:
    index: int
    name: str
    dims: tuple[int, ...]
    type_id: int
    offset: int


def _tensor_entry(cur: _Cursor, i: int) -> _RawTensor:
    name = cur.string(f"tensor #{i} name")
    what = f"tensor {name}"
    n_dims = cur.u32(f"{what} dimension count")
    if not 1 <= n_dims <= MAX_DIMS:
        raise GGUFFormatError(f"{what} has {n_dims} dimensions, expected 1 to {MAX_DIMS}")
    start = cur.take(8 * n_dims, f"{what} dimensions")
    dims = struct.unpack_from(f"<{n_dims}Q", cur.buf, start)
    type_id = cur.u32(f"{what} type")
    offset = cur.u64(f"{what} offset")
    return _RawTensor(i, name, dims, type_id, offset)


def _tensor(raw: _RawTensor, data_offset: int, alignment: int, size: int) -> TensorInfo:
    what = f"tensor {raw.name}"
    if not raw.name:
        raise GGUFFormatError(f"tensor #{raw.index} has an empty name")
    if len(raw.name.encode()) >= MAX_NAME_BYTES:
        raise GGUFFormatError(f"{what}: name longer than {MAX_NAME_BYTES - 1} bytes")
    gtype = GGML_TYPES.get(raw.type_id)
    if gtype is None:
        raise GGUFFormatError(f"{what} has unknown ggml type {raw.type_id}")
    if min(raw.dims) < 1:
        raise GGUFFormatError(f"{what} has shape {list(raw.dims)}, expected positive dims")
    if raw.dims[0] % gtype.block_size:
        raise GGUFFormatError(
            f"{what}: row length {raw.dims[0]} is not a multiple of the {gtype.name}"
            f" block size {gtype.block_size}"
        )
    n_elements = 1
    for d in raw.dims:
        n_elements *= d
    n_bytes = n_elements // gtype.block_size * gtype.type_size
    if raw.offset % alignment:
        raise GGUFFormatError(
            f"{what}: data offset {raw.offset} is not a multiple of the alignment {alignment}"
        )
    start = data_offset + raw.offset
    if n_bytes > size or start > size - n_bytes:
        raise GGUFFormatError(
            f"{what} needs bytes {start}..{start + n_bytes}, past the file end {size} (truncated?)"
        )
    return TensorInfo(raw.name, gtype, raw.dims, start, n_bytes)


def _check_no_overlaps(tensors: list[TensorInfo]) -> None:
    seen: set[str] = set()
    for t in tensors:
        if t.name in seen:
            raise GGUFFormatError(f"tensor {t.name} appears twice")
        seen.add(t.name)
    by_start = sorted(tensors, key=lambda t: t.offset)
    for before, after in zip(by_start, by_start[1:], strict=False):
        if after.offset < before.offset + before.n_bytes:
            raise GGUFFormatError(
                f"tensor {after.name} (from byte {after.offset}) overlaps tensor"
                f" {before.name} (bytes {before.offset}..{before.offset + before.n_bytes})"
            )
