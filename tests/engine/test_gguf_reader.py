"""ds4d's GGUF reader against the gguf package's reader (same keys, values, tensors and
offsets on real files), and its refusal of malformed files: one line naming the key or
tensor, raised before anything is allocated from a count in the file."""

from __future__ import annotations

import lzma
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from ds4d.engine import Engine, ModelLoadError
from ds4d.engine.gguf_file import GGUFFile
from ds4d.engine.gguf_reader import GGML_TYPES
from tests.helpers.gguf_structure import Field, structure, write_tiny_model
from tests.reference.tiny_llama import write_tiny_llama

VOCAB = Path(__file__).resolve().parents[1] / "data" / "vocab"


def assert_same_as_gguf_reader(path: Path) -> None:
    ours = GGUFFile(path)
    theirs = gguf.GGUFReader(path)
    keys = [k for k in theirs.fields if not k.startswith("GGUF.")]
    assert ours.keys() == keys
    for key in keys:
        field = theirs.fields[key]
        assert ours.get(key) == field.contents(), key
        arr = ours.get_array(key)
        if arr is not None and field.types[1] != gguf.GGUFValueType.STRING:
            assert np.array_equal(arr.numpy(), np.array(field.contents())), key
    assert ours.tensor_names() == [t.name for t in theirs.tensors]
    base = ours._map.ctypes.data
    for t in theirs.tensors:
        mine = ours.tensor(t.name)
        assert (mine.type, mine.type_name) == (int(t.tensor_type), t.tensor_type.name)
        assert mine.shape == tuple(int(d) for d in t.shape)
        assert mine.address - base == t.data_offset
        assert mine.n_bytes == t.n_bytes
        assert (mine.data.dtype, mine.data.shape) == (t.data.dtype, t.data.shape)
        assert np.array_equal(
            mine.data.reshape(-1).view(np.uint8), t.data.reshape(-1).view(np.uint8)
        )
        assert not mine.data.flags.writeable


def test_type_table_matches_gguf() -> None:
    for qtype, (block, size) in gguf.GGML_QUANT_SIZES.items():
        assert GGML_TYPES[int(qtype)].name == qtype.name
        assert (GGML_TYPES[int(qtype)].block_size, GGML_TYPES[int(qtype)].type_size) == (
            block,
            size,
        )
    assert len(GGML_TYPES) == len(gguf.GGML_QUANT_SIZES)


def test_embedded_model_reads_as_gguf_reads_it(model_path: Path) -> None:
    assert_same_as_gguf_reader(model_path)


@pytest.mark.parametrize(
    "name", ["ggml-vocab-llama-spm.gguf.xz", "ggml-vocab-gpt-2.gguf.xz"],
)  # fmt: skip
def test_vocab_files_read_as_gguf_reads_them(name: str, tmp_path: Path) -> None:
    path = tmp_path / name.removesuffix(".xz")
    with lzma.open(VOCAB / name) as src, path.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    assert_same_as_gguf_reader(path)


@pytest.mark.parametrize(
    "options",
    [{}, {"matrix_type": Q.Q4_0, "embd_type": Q.Q8_0}, {"matrix_type": Q.F16, "biases": True},
     {"matrix_type": Q.Q5_0, "untied_output": True, "rope_freqs": True},
     {"matrix_type": Q.BF16}, {"matrix_type": Q.F32}],
)  # fmt: skip
def test_tiny_models_read_as_gguf_reads_them(options: dict, tmp_path: Path) -> None:
    assert_same_as_gguf_reader(write_tiny_model(tmp_path / "m.gguf", **options))


def test_every_value_type_reads_as_written(tmp_path: Path) -> None:
    path = tmp_path / "values.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    V = gguf.GGUFValueType
    scalars = {
        "u8": (200, V.UINT8), "i8": (-100, V.INT8), "u16": (60000, V.UINT16),
        "i16": (-30000, V.INT16), "u32": (4_000_000_000, V.UINT32), "i32": (-2_000_000, V.INT32),
        "f32": (0.5, V.FLOAT32), "b": (True, V.BOOL), "s": ("héllo ✓", V.STRING),
        "u64": (2**63 + 5, V.UINT64), "i64": (-(2**62), V.INT64), "f64": (1e-300, V.FLOAT64),
    }  # fmt: skip
    for key, (value, vtype) in scalars.items():
        w.add_key_value(f"t.{key}", value, vtype)
    w.add_array("t.strings", ["", "a", "ü", "日本", "x\0y"])
    w.add_key_value("t.floats", [1.5, -2.0], V.ARRAY, sub_type=V.FLOAT32)
    w.add_key_value("t.bools", [True, False, True], V.ARRAY, sub_type=V.BOOL)
    w.add_array("t.nested", [[1, 2], [3]])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    gf = GGUFFile(path)
    for key, (value, _) in scalars.items():
        assert gf.get(f"t.{key}") == value and type(gf.get(f"t.{key}")) is type(value), key
    assert gf.get("t.strings") == ["", "a", "ü", "日本", "x\0y"]  # the one-by-one path
    assert gf.get("t.floats") == [1.5, -2.0]
    assert gf.get_array("t.floats").numpy().dtype == np.float32
    assert gf.get("t.bools") == [True, False, True]
    assert gf.get("t.nested") == [[1, 2], [3]]
    assert gf.get("t.missing", 7) == 7 and gf.get_array("t.s") is None
    assert gf.tensor_names() == []


# -- refusals ---------------------------------------------------------------------------


def refused(path: Path) -> str:
    with pytest.raises(ModelLoadError) as exc:
        Engine.open(path, threads=1)
    message = str(exc.value)
    assert message and "\n" not in message and "Traceback" not in message, repr(message)
    return message


def patched(src: Path, dst: Path, field: Field, value: int) -> Path:
    data = bytearray(src.read_bytes())
    data[field.offset : field.offset + field.size] = value.to_bytes(field.size, "little")
    dst.write_bytes(bytes(data))
    return dst


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Field]]:
    path = write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf")
    return path, {f.what: f for f in structure(path)}


def test_tiny_model_opens(tiny: tuple[Path, dict[str, Field]]) -> None:
    path, _ = tiny
    with Engine.open(path, threads=1) as engine:
        assert engine.tokenizer.encode("the cat") == engine.tokenizer.encode("the cat")
        assert engine.info.n_layer == 2


# (field, value written, words the one-line refusal must contain)
REFUSALS = [
    ("GGUF.version", 1, ["version 1"]),
    ("GGUF.version", 0x03000000, ["big-endian"]),
    ("GGUF.kv_count", 2**63, ["metadata count"]),
    ("GGUF.tensor_count", 2**31 - 1, ["tensor count"]),
    ("llama.block_count value", 2**31 - 1, ["llama.block_count", "2147483647"]),
    ("tokenizer.ggml.tokens count", 2**31 - 1, ["tokenizer.ggml.tokens", "2147483647"]),
    ("tokenizer.ggml.tokens[36] length", 2**40, ["tokenizer.ggml.tokens[36]"]),
    ("tokenizer.ggml.scores count", 2**62, ["tokenizer.ggml.scores"]),
    ("tokenizer.ggml.model type", 13, ["tokenizer.ggml.model", "unknown value type 13"]),
    ("tokenizer.ggml.scores item type", 99, ["tokenizer.ggml.scores", "item type 99"]),
    ("tokenizer.ggml.bos_token_id value", 96, ["tokenizer.ggml.bos_token_id", "96"]),
    ("general.architecture length", 2**64 - 1, ["general.architecture"]),
    ("blk.0.attn_q.weight type", 4, ["blk.0.attn_q.weight", "unknown ggml type 4"]),
    ("blk.0.attn_q.weight type", 1000, ["blk.0.attn_q.weight", "1000"]),
    ("blk.0.attn_q.weight n_dims", 5, ["blk.0.attn_q.weight", "5 dimensions"]),
    ("blk.0.attn_q.weight dim 0", 0, ["blk.0.attn_q.weight", "positive"]),
    ("blk.0.attn_q.weight dim 0", 48, ["blk.0.attn_q.weight", "block size"]),
    ("blk.0.attn_q.weight dim 1", 2**40, ["blk.0.attn_q.weight", "past the file end"]),
    ("blk.1.ffn_down.weight offset", 2**50, ["blk.1.ffn_down.weight", "past the file end"]),
]


@pytest.mark.parametrize(("what", "value", "words"), REFUSALS)
def test_malformed_field_is_refused_with_one_line(
    tiny: tuple[Path, dict[str, Field]], tmp_path: Path, what: str, value: int, words: list[str]
) -> None:
    path, fields = tiny
    message = refused(patched(path, tmp_path / "bad.gguf", fields[what], value))
    for word in words:
        assert word in message, (word, message)


def test_misaligned_and_overlapping_tensors_are_refused(
    tiny: tuple[Path, dict[str, Field]], tmp_path: Path
) -> None:
    path, fields = tiny
    offset = fields["blk.0.attn_k.weight offset"]
    message = refused(patched(path, tmp_path / "a.gguf", offset, offset.value + 1))
    assert "blk.0.attn_k.weight" in message and "alignment" in message
    message = refused(patched(path, tmp_path / "b.gguf", offset, offset.value + 32))
    assert "overlaps" in message and "blk.0.attn_k.weight" in message
    other = fields["blk.0.attn_q.weight offset"]
    message = refused(patched(path, tmp_path / "c.gguf", offset, other.value))
    assert "overlaps" in message


def test_a_changed_tensor_type_is_refused(
    tiny: tuple[Path, dict[str, Field]], tmp_path: Path
) -> None:
    """Q8_0 -> Q4_0 keeps every range inside the file but leaves the index inconsistent
    only if sizes change; the family then refuses the type or the shape."""
    path, fields = tiny
    message = refused(patched(path, tmp_path / "t.gguf", fields["blk.0.ffn_up.weight type"],
                              int(Q.F32)))  # fmt: skip
    assert "blk.0.ffn_up.weight" in message or "overlaps" in message


def test_duplicate_key_and_tensor_are_refused(tmp_path: Path) -> None:
    def keys(w: gguf.GGUFWriter) -> None:
        w.add_uint32("test.key.aa", 1)
        w.add_uint32("test.key.bb", 2)

    data = bytearray(write_tiny_llama(tmp_path / "m.gguf", extra=keys).read_bytes())
    at = data.index(b"test.key.bb")
    data[at : at + 11] = b"test.key.aa"
    (tmp_path / "k.gguf").write_bytes(bytes(data))
    assert "metadata key test.key.aa appears twice" in refused(tmp_path / "k.gguf")
    data = bytearray((tmp_path / "m.gguf").read_bytes())
    q = data.index(b"blk.0.attn_q.weight")
    k = data.index(b"blk.0.attn_k.weight")
    data[k : k + 19] = data[q : q + 19]
    (tmp_path / "t.gguf").write_bytes(bytes(data))
    assert "blk.0.attn_q.weight appears twice" in refused(tmp_path / "t.gguf")


def test_tokenizer_arrays_must_match_the_vocabulary(tmp_path: Path) -> None:
    def vocab(w: gguf.GGUFWriter) -> None:
        w.add_tokenizer_model("llama")
        w.add_token_list(["<unk>", "a", "b"])
        w.add_token_scores([0.0, -1.0])

    assert "tokenizer.ggml.scores has 2 entries" in refused(
        write_tiny_llama(tmp_path / "m.gguf", extra=vocab)
    )


@pytest.mark.parametrize("alignment", [48, 4, 0])
def test_bad_alignment_is_refused(tmp_path: Path, alignment: int) -> None:
    def aligned(w: gguf.GGUFWriter) -> None:
        w.add_uint32("general.alignment", alignment)

    path = write_tiny_llama(tmp_path / "m.gguf", extra=aligned)
    assert "general.alignment" in refused(path)


def test_a_larger_alignment_reads_as_gguf_reads_it(tmp_path: Path) -> None:
    def aligned(w: gguf.GGUFWriter) -> None:
        w.add_custom_alignment(64)

    path = write_tiny_llama(tmp_path / "m.gguf", extra=aligned)
    assert_same_as_gguf_reader(path)
    assert GGUFFile(path).index.alignment == 64


def test_truncated_header(tmp_path: Path, tiny: tuple[Path, dict[str, Field]]) -> None:
    path, fields = tiny
    raw = path.read_bytes()
    for cut in (5, 12, 23, fields["tokenizer.ggml.tokens count"].offset + 3):
        (tmp_path / "t.gguf").write_bytes(raw[:cut])
        assert "truncated" in refused(tmp_path / "t.gguf")
