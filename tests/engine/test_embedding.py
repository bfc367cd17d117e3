"""The embedding path (ds4d.engine.embedding, ds4n_dec_model_embed) against the kit's
sentence-transformers float32 references, and its batching."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from ds4d.engine import Engine, native
from ds4d.engine.embedding import plan_calls
from ds4d.engine.errors import EngineError, ModelLoadError
from tests.helpers.kit import KIT_DIR, embed_kit_families, kit_manifest, kit_model
from tests.native.test_kernels import LEVELS

# The acceptance bar: pooled vectors within this cosine distance of the float32 reference.
MAX_COSINE_DISTANCE = 5e-7


def cosine_distance(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return abs(1.0 - float(a64 @ b64 / np.linalg.norm(a64) / np.linalg.norm(b64)))


def references(family: str) -> dict[str, tuple[str, np.ndarray, np.ndarray]]:
    """input name -> (text, reference token ids, reference vector)."""
    m = kit_manifest(family)
    with np.load(KIT_DIR / m["reference"]) as z:
        return {
            name: (m["texts"][name], z[f"{name}.tokens"], z[f"{name}.vector"])
            for name in m["embedding"]["inputs"]
        }


@pytest.fixture(scope="module", params=embed_kit_families())
def kit(request: pytest.FixtureRequest) -> Iterator[tuple[str, Engine]]:
    with Engine.open(kit_model(request.param), threads=2) as engine:
        yield request.param, engine


def test_the_kit_has_the_embedding_families() -> None:
    assert embed_kit_families() == [
        "embed-bert", "embed-bert-cls", "embed-gemma", "embed-nomic", "embed-qwen3"
    ]  # fmt: skip


def test_kit_tokens_are_the_reference_tokenizers(kit: tuple[str, Engine]) -> None:
    family, engine = kit
    for name, (text, ids, _vec) in references(family).items():
        assert engine.embedding_tokens(text) == ids.tolist(), name


def test_kit_vectors_match_the_float32_reference(kit: tuple[str, Engine]) -> None:
    family, engine = kit
    refs = references(family)
    vectors = engine.embed([ids.tolist() for _t, ids, _v in refs.values()])
    for (name, (_t, _ids, ref)), vec in zip(refs.items(), vectors, strict=True):
        assert abs(float(np.linalg.norm(vec.astype(np.float64))) - 1.0) < 1e-6
        d = cosine_distance(vec, ref)
        assert d < MAX_COSINE_DISTANCE, f"{family} {name}: cosine distance {d:.2e}"


@pytest.fixture(params=LEVELS, ids=[native.SIMD_NAMES[x] for x in LEVELS])
def level(request: pytest.FixtureRequest) -> Iterator[int]:
    """Each kernel set this CPU runs (the scalar attention beside the SIMD tiles)."""
    native.set_simd(request.param)
    yield request.param
    native.set_simd(native.SIMD_AUTO)


def test_every_kernel_set_matches_the_reference(kit: tuple[str, Engine], level: int) -> None:
    family, engine = kit
    refs = references(family)
    vectors = engine.embed([ids.tolist() for _t, ids, _v in refs.values()])
    for (name, (_t, _ids, ref)), vec in zip(refs.items(), vectors, strict=True):
        d = cosine_distance(vec, ref)
        assert d < MAX_COSINE_DISTANCE, f"{family} {name} at level {level}: {d:.2e}"


def test_vectors_do_not_depend_on_the_batching(kit: tuple[str, Engine]) -> None:
    """All inputs in one call, one call each, and calls of two inputs or few rows give
    bitwise the same vectors; repeats of one input in a call too."""
    family, engine = kit
    lists = [ids.tolist() for _t, ids, _v in references(family).values()]
    lists += [lists[2], lists[3][:1], lists[0][:9]]
    together = engine.embed(lists)
    alone = np.stack([engine.embed([t])[0] for t in lists])
    pairs = engine.embed(lists, max_batch=2)
    few_rows = engine.embed(lists, max_rows=20)
    assert np.array_equal(together, alone)
    assert np.array_equal(together, pairs)
    assert np.array_equal(together, few_rows)
    assert np.array_equal(together[2], together[4])


def test_plan_calls_groups_in_order_within_the_limits() -> None:
    assert plan_calls([5, 5, 5, 30, 2, 2], max_batch=2, max_rows=12) == [[0, 1], [2], [3], [4, 5]]
    assert plan_calls([], max_batch=4, max_rows=10) == []


def test_a_generation_model_needs_a_pooling() -> None:
    with Engine.open(kit_model("qwen3"), threads=1) as engine:
        assert engine.embedding.pooling is None and not engine.is_embedding_model
        with pytest.raises(EngineError, match="--pooling"):
            engine.embed([[1, 2, 3]])
    with Engine.open(kit_model("qwen3"), threads=1, pooling="mean") as engine:
        assert engine.embedding.pooling == "mean" and not engine.is_embedding_model
        v = engine.embed([[1, 2, 3], [4]])
        assert v.shape == (2, engine.info.n_embd)


def test_bad_embedding_inputs_are_refused(kit: tuple[str, Engine]) -> None:
    _family, engine = kit
    with pytest.raises(EngineError, match="no tokens"):
        engine.embed([[]])
    with pytest.raises(EngineError, match="outside the vocabulary"):
        engine.embed([[engine.info.n_vocab]])
    with pytest.raises(EngineError, match="unknown pooling"):
        Engine.open(kit_model("qwen3"), threads=1, pooling="max")


def renamed_tensor_copy(family: str, tmp: Path, old: bytes, new: bytes) -> Path:
    """The kit GGUF with one tensor name of its index replaced by another of the same
    length (the tensor is then absent under its own name)."""
    assert len(old) == len(new)
    raw = kit_model(family).read_bytes()
    assert raw.count(old) == 1, old
    out = tmp / f"{family}-renamed.gguf"
    out.write_bytes(raw.replace(old, new))
    return out


def test_embedding_gemma_applies_both_dense_layers_or_none(tmp_path: Path) -> None:
    refs = references("embed-gemma")
    lists = [ids.tolist() for _t, ids, _v in refs.values()]
    one = renamed_tensor_copy("embed-gemma", tmp_path, b"dense_3.weight", b"dense_9.weight")
    with pytest.raises(ModelLoadError, match="without the other dense layer"):
        Engine.open(one, threads=1)
    none = renamed_tensor_copy("embed-gemma", tmp_path, b"dense_2.weight", b"dense_9.weight")
    none.write_bytes(none.read_bytes().replace(b"dense_3.weight", b"dense_8.weight"))
    with Engine.open(none, threads=1) as engine:  # the model without its projections
        vectors = engine.embed(lists)
    for (name, (_t, _ids, ref)), vec in zip(refs.items(), vectors, strict=True):
        assert cosine_distance(vec, ref) > 1e-3, name


def test_nomic_bert_layer_without_its_qkv_is_refused(tmp_path: Path) -> None:
    bad = renamed_tensor_copy("embed-nomic", tmp_path, b"blk.1.attn_qkv.weight",
                              b"blk.1.attn_xyz.weight")  # fmt: skip
    with pytest.raises(ModelLoadError, match="layer 1 needs attn_qkv or attn_q/k/v"):
        Engine.open(bad, threads=1)
