"""Bad model files are refused with one clear line (ModelLoadError), good ones open."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from ds4d.engine import Engine, ModelLoadError
from ds4d.engine.gguf_file import GGUFFile
from tests.reference.tiny_llama import write_tiny_llama


def refused(path: Path) -> str:
    with pytest.raises(ModelLoadError) as exc:
        Engine.open(path, threads=1)
    message = str(exc.value)
    assert message and "\n" not in message, repr(message)
    return message


@pytest.fixture(scope="module")
def fingerprint(model_path: Path) -> str:
    return GGUFFile(model_path).fingerprint


def test_embedded_model_opens_with_its_metadata(model_path: Path, fingerprint: str) -> None:
    gf = GGUFFile(model_path)
    assert gf.architecture == "llama"
    assert gf.file_type_name == "Q4_1"
    embd = gf.tensor("token_embd.weight")
    assert embd.shape == (576, 49152) and embd.type_name == "Q8_0"
    # Weights are views of the file's mmap, not copies.
    assert isinstance(embd.data.base, np.memmap) or isinstance(embd.data, np.memmap)
    assert gf.fingerprint == fingerprint  # stable across opens
    gf.release_reader()
    assert gf.get("llama.block_count") == 30  # small metadata survives the release


def test_missing_file(tmp_path: Path) -> None:
    assert "not found" in refused(tmp_path / "nope.gguf")


def test_directory_is_refused(tmp_path: Path) -> None:
    assert "not a regular file" in refused(tmp_path)


def test_random_bytes_are_not_gguf(tmp_path: Path) -> None:
    path = tmp_path / "random.gguf"
    path.write_bytes(np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    assert "not a GGUF" in refused(path)


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    assert "not a GGUF" in refused(path)


@pytest.mark.parametrize("keep", [0.5, 0.999, 1e-4])
def test_truncated_copy_of_the_real_model(model_path: Path, tmp_path: Path, keep: float) -> None:
    path = tmp_path / "truncated.gguf"
    size = model_path.stat().st_size
    with model_path.open("rb") as src, path.open("wb") as dst:
        dst.write(src.read(max(8, int(size * keep))))
    assert "truncated" in refused(path)


def test_unsupported_architecture(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "m.gguf", arch="mamba")
    message = refused(path)
    assert "'mamba'" in message and "supported:" in message and "llama" in message


def test_unsupported_quant_type_names_tensor_and_type(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "m.gguf",
                            override_type={"blk.1.ffn_up.weight": Q.Q8_1})  # fmt: skip
    message = refused(path)
    assert "blk.1.ffn_up.weight" in message and "Q8_1" in message


def test_wrong_shape_names_expected_and_got(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "m.gguf",
                            override_shape={"blk.0.attn_k.weight": (48, 64)})  # fmt: skip
    message = refused(path)
    assert "blk.0.attn_k.weight" in message and "[64, 48]" in message and "[64, 32]" in message


def test_missing_tensor(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "m.gguf", drop=("blk.1.ffn_down.weight",))
    assert "missing tensor blk.1.ffn_down.weight" in refused(path)


def test_copy_has_a_different_fingerprint_only_if_the_shape_differs(
    model_path: Path, tmp_path: Path, fingerprint: str
) -> None:
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(model_path, copy)
    assert GGUFFile(copy).fingerprint == fingerprint
    a = GGUFFile(write_tiny_llama(tmp_path / "a.gguf")).fingerprint
    b = GGUFFile(write_tiny_llama(tmp_path / "b.gguf", matrix_type=Q.Q4_0)).fingerprint
    assert a != b


def test_tensors_of_blocks_past_block_count_are_refused(tmp_path: Path) -> None:
    # Found by the native fuzzer: block_count lowered to 1 left blk.1.* in the file
    # unused, and the model opened as a one-layer model of a two-layer file.
    from tests.helpers.gguf_structure import structure

    path = write_tiny_llama(tmp_path / "m.gguf")
    field = next(f for f in structure(path) if f.what == "llama.block_count value")
    data = bytearray(path.read_bytes())
    data[field.offset : field.offset + field.size] = (1).to_bytes(field.size, "little")
    path.write_bytes(bytes(data))
    message = refused(path)
    assert "blk.1." in message and "llama.block_count is 1" in message, message
