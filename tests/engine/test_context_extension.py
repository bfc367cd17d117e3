"""`--rope-scaling`: a model run past its trained context with its RoPE positions
stretched to the serving context. The stretched engine computes exactly what the same
weights compute from a file that declares that scaling itself; a file with its own scaling,
a context within the trained one or no request leave the model as the file says; KV state
of the unstretched model is refused by the stretched one."""

from __future__ import annotations

import io
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

from ds4d.daemon.config import ConfigError, load_config
from ds4d.engine import Engine, EngineError, ModelLoadError
from ds4d.engine.gguf_file import GGUFFile
from tests.helpers.gguf_structure import write_tiny_model

TRAINED = 256  # the tiny llama's context_length
TOKENS = list(np.random.default_rng(7).integers(3, 90, 300))  # past the trained context


def with_metadata(src: Path, dst: Path, values: dict[str, MetadataDetails]) -> Path:
    reader = gguf.GGUFReader(str(src), "r")
    writer = gguf.GGUFWriter(str(dst), arch="llama", endianess=reader.endianess)
    copy_with_new_metadata(reader, writer, values, [])
    return dst


def logits(engine: Engine) -> np.ndarray:
    session = engine.new_session(1024)
    try:
        return session.eval_all_logits(TOKENS)
    finally:
        session.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("rope") / "plain.gguf")


@pytest.mark.parametrize("kind", ["yarn", "linear"])
def test_a_stretched_model_computes_what_a_file_declaring_the_scaling_does(
    tiny: Path, tmp_path: Path, kind: str
) -> None:
    T = gguf.GGUFValueType
    declared = with_metadata(tiny, tmp_path / f"{kind}.gguf", {
        "llama.rope.scaling.type": MetadataDetails(T.STRING, kind),
        "llama.rope.scaling.factor": MetadataDetails(T.FLOAT32, 4.0),
        "llama.rope.scaling.original_context_length": MetadataDetails(T.UINT32, TRAINED),
    })  # fmt: skip
    with Engine.open(tiny, threads=1, kv_type="f32", rope_scaling=kind, n_ctx=4 * TRAINED) as e:
        assert e.info.rope_stretch == f"{kind} x4 from the trained 256 tokens to 1024"
        stretched = logits(e)
    with Engine.open(declared, threads=1, kv_type="f32") as e:
        assert e.info.rope_stretch == ""
        want = logits(e)
    with Engine.open(tiny, threads=1, kv_type="f32") as e:
        plain = logits(e)
    assert np.array_equal(stretched, want)
    # It is a different model past (and, for YaRN's magnitude factor, before) the
    # trained context, not the file's own.
    assert not np.allclose(stretched[TRAINED:], plain[TRAINED:], atol=1e-3)


def test_the_file_as_it_is_unless_stretching_is_asked_for_and_needed(
    tiny: Path, tmp_path: Path
) -> None:
    plain = GGUFFile(tiny).fingerprint
    for kw in ({}, {"rope_scaling": "yarn", "n_ctx": TRAINED}, {"rope_scaling": "", "n_ctx": 4096}):
        with Engine.open(tiny, threads=1, **kw) as e:
            assert (e.info.rope_stretch, e.info.fingerprint) == ("", plain), kw
    # A file with its own scaling keeps it, whatever the context.
    T = gguf.GGUFValueType
    own = with_metadata(tiny, tmp_path / "own.gguf", {
        "llama.rope.scaling.type": MetadataDetails(T.STRING, "linear"),
        "llama.rope.scaling.factor": MetadataDetails(T.FLOAT32, 2.0),
    })  # fmt: skip
    with Engine.open(own, threads=1, rope_scaling="yarn", n_ctx=4096) as e:
        assert e.info.rope_stretch == ""
        assert e.gguf.get("llama.rope.scaling.type") == "linear"
    with pytest.raises(ModelLoadError, match="rope scaling 'ntk' is not one of linear, yarn"):
        Engine.open(tiny, threads=1, rope_scaling="ntk", n_ctx=4096)


def test_kv_state_of_the_unstretched_model_is_refused(tiny: Path) -> None:
    buf = io.BytesIO()
    with Engine.open(tiny, threads=1) as e:
        s = e.new_session(512)
        s.eval(TOKENS[:20])
        s.save(buf)
        s.close()
    with Engine.open(tiny, threads=1, rope_scaling="yarn", n_ctx=512) as e:
        assert e.info.fingerprint != GGUFFile(tiny).fingerprint
        s = e.new_session(512)
        buf.seek(0)
        with pytest.raises(EngineError, match="made by a different model"):
            s.load(buf)
        s.close()


def test_the_config_key() -> None:
    assert load_config(environ={"DS4D_ROPE_SCALING": "yarn"}).rope_scaling == "yarn"
    assert load_config(environ={}).rope_scaling == ""
    with pytest.raises(ConfigError, match="must be one of"):
        load_config(environ={"DS4D_ROPE_SCALING": "dynamic"})
