"""Directional steering in every family's C forward pass (native/steer.h) against the numpy
references (tests/reference: the steering direction added after each attention and FFN
output), scale 0 bit-identical to none, batched decode with mixed steering, residual
capture, llama.cpp's control-vector files, and the prefix rule (a session's KV is dropped
when its steering changes)."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter

from ds4d.engine import Engine, native
from ds4d.engine.engine import FAMILIES
from ds4d.engine.gguf_file import GGUFFile
from ds4d.engine.steering import (
    NativeSteer,
    Steering,
    SteeringError,
    load_control_vectors,
    read_control_vector,
    write_control_vector,
)
from tests.reference.dense_ref import DenseReference
from tests.reference.moe_model_ref import MoEModelReference
from tests.reference.tiny_dense import write_tiny
from tests.reference.tiny_moe import write_tiny_moe

LOGPROB_TOL = 1e-4
ATTN, FFN = 0.7, -1.3


def tiny(tmp_path: Path, arch: str, **options: int) -> GGUFFile:
    if arch in ("qwen3moe", "gpt-oss"):
        return GGUFFile(write_tiny_moe(tmp_path / f"{arch}.gguf", arch))
    return GGUFFile(write_tiny(tmp_path / f"{arch}.gguf", arch, matrix_type=Q.F32, **options))


ARCHS = ["llama", "qwen2", "qwen3", "gemma3", "phi3", "qwen3moe", "gpt-oss"]


def reference(gf: GGUFFile):
    return (
        MoEModelReference(gf) if gf.architecture in ("qwen3moe", "gpt-oss") else DenseReference(gf)
    )


def engine_of(gf: GGUFFile) -> Engine:
    module = importlib.import_module(FAMILIES[gf.architecture])
    pool = native.Pool(2)
    return Engine(gf, module, module.load(gf, pool), pool, None)  # type: ignore[arg-type]


def directions(n_layer: int, n_embd: int, seed: int = 7) -> np.ndarray:
    d = np.random.default_rng(seed).standard_normal((n_layer, n_embd)).astype(np.float32)
    d[0] = 0.0  # as a llama.cpp file: never a direction for layer 0
    return d


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64) - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def toks(n: int, n_vocab: int, seed: int = 3) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, n_vocab, n)]


@pytest.mark.parametrize("arch", ARCHS)
def test_steered_forward_matches_reference(tmp_path: Path, arch: str) -> None:
    gf = tiny(tmp_path, arch)
    ref = reference(gf)
    with engine_of(gf) as eng:
        info = eng.info
        steer = Steering(directions(info.n_layer, info.n_embd), ATTN, FFN)
        ref.steer = (steer.dirs, ATTN, FFN)
        prompt = toks(24, info.n_vocab)
        s = eng.new_session(48)
        s.set_steering(steer)
        got = s.eval_all_logits(prompt)
        want = ref.forward(prompt)
        assert np.abs(log_softmax(got) - log_softmax(want)).max() <= LOGPROB_TOL
        for t in toks(6, info.n_vocab, seed=9):  # decode steps too
            s.eval([t])
            want_last = ref.forward([t])[-1]
            assert (
                np.abs(log_softmax(s.compute_logits()) - log_softmax(want_last)).max()
                <= LOGPROB_TOL
            )
        # and it changed the output: the same prompt unsteered is far away
        plain = eng.new_session(48)
        assert np.abs(log_softmax(plain.eval_all_logits(prompt)) - log_softmax(got)).max() > 0.1


def test_deepseek4_steered_forward_matches_reference(tmp_path: Path) -> None:
    from ds4d.tools.synth import SYNTH_PARAMS, write_deepseek4
    from tests.reference.deepseek4_ref import DS4Reference

    path = tmp_path / "ds4.gguf"
    write_deepseek4(path, seed=11)
    with Engine.open(path, threads=1) as eng:
        steer = Steering(directions(eng.info.n_layer, eng.info.n_embd) * 0.05, ATTN, FFN)
        ref = DS4Reference(eng.model.layout)  # type: ignore[attr-defined]
        ref.steer = (steer.dirs, ATTN, FFN)
        st = ref.new_state()
        prompt = toks(20, SYNTH_PARAMS.n_vocab)
        s = eng.new_session(64)
        s.set_steering(steer)
        got, want = [], []
        for t in prompt:
            s.eval([t])
            got.append(np.array(s.compute_logits()))
            want.append(ref.step(st, t))
        assert np.abs(log_softmax(np.array(got)) - log_softmax(np.array(want))).max() <= LOGPROB_TOL
        plain = eng.new_session(64)
        plain.eval(prompt)
        assert np.abs(plain.compute_logits() - got[-1]).max() > 1e-3


@pytest.mark.parametrize("arch", ["llama", "gemma3", "qwen3moe"])
def test_scale_zero_is_bit_identical_and_batches_keep_each_sessions_steering(
    tmp_path: Path, arch: str
) -> None:
    gf = tiny(tmp_path, arch)
    with engine_of(gf) as eng:
        info = eng.info
        dirs = directions(info.n_layer, info.n_embd)
        prompt = toks(20, info.n_vocab)
        plain, zero, steered = (eng.new_session(40) for _ in range(3))
        # a native object with both scales 0, attached (Steering would not even attach it)
        zero._state.set_steer(NativeSteer(dirs, 0.0, 0.0))
        steer = Steering(dirs, ATTN, FFN)
        steered.set_steering(steer)
        for s in (plain, zero, steered):
            s.eval(prompt)
        assert plain.compute_logits().tobytes() == zero.compute_logits().tobytes()
        # one batched decode step over an unsteered and a steered session: bitwise each one's
        # own step
        alone_plain, alone_steered = eng.new_session(40), eng.new_session(40)
        alone_steered.set_steering(steer)
        for s in (alone_plain, alone_steered):
            s.eval(prompt)
            s.eval([5])
        eng.eval_batch([(plain, [5]), (steered, [5])])
        assert plain.compute_logits().tobytes() == alone_plain.compute_logits().tobytes()
        assert steered.compute_logits().tobytes() == alone_steered.compute_logits().tobytes()
        assert plain.compute_logits().tobytes() != steered.compute_logits().tobytes()


def test_capture_records_each_layers_last_residual(tmp_path: Path) -> None:
    gf = tiny(tmp_path, "llama")
    ref = DenseReference(gf)
    recorded: dict[int, np.ndarray] = {}
    steered = ref.steered

    def record(x: np.ndarray, il: int, after_ffn: bool) -> np.ndarray:
        if after_ffn:
            recorded[il] = x[-1].copy()
        return steered(x, il, after_ffn)

    ref.steered = record  # type: ignore[method-assign]
    with engine_of(gf) as eng:
        prompt = toks(12, eng.info.n_vocab)
        s = eng.new_session(16)
        got = s.eval_capturing(prompt)
        ref.forward(prompt)
        # the session is left as eval leaves it, its own steering (none) back in place
        assert s.tokens == prompt and s.steering is None
        for il in range(eng.info.n_layer):
            np.testing.assert_allclose(
                got[il], recorded[il], atol=1e-4 * np.abs(recorded[il]).max()
            )
        # a steered session captures under its steering and keeps it afterwards
        steer = Steering(directions(eng.info.n_layer, eng.info.n_embd), ATTN, FFN)
        a, b = eng.new_session(16), eng.new_session(16)
        a.set_steering(steer)
        b.set_steering(steer)
        a.eval_capturing(prompt[:6])
        b.eval(prompt[:6])
        a.eval(prompt[6:])
        b.eval(prompt[6:])
        assert a.compute_logits().tobytes() == b.compute_logits().tobytes()


def write_llamacpp_style(path: Path, layers: dict[int, np.ndarray]) -> None:
    """A control vector as llama.cpp's cvector-generator lays it out, written with the gguf
    package directly (not through ds4d's writer)."""
    w = GGUFWriter(str(path), "controlvector")
    w.add_string("controlvector.model_hint", "llama")
    w.add_int32("controlvector.layer_count", len(layers))
    for il, vec in layers.items():
        w.add_tensor(f"direction.{il}", vec.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_llamacpp_control_vector_files(tmp_path: Path) -> None:
    gf = tiny(tmp_path, "llama", n_layer=4)
    ref = DenseReference(gf)
    with engine_of(gf) as eng:
        n_layer, n_embd = eng.info.n_layer, eng.info.n_embd
        dirs = directions(n_layer, n_embd)
        a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
        write_llamacpp_style(a, {il: dirs[il] for il in range(1, n_layer)})
        write_control_vector(b, {1: dirs[2]}, "llama")  # ours
        assert set(read_control_vector(b)) == {1}
        # --control-vector-scaled a 0.5 --control-vector-scaled b -2
        # --control-vector-layer-range 1 (n_layer - 2)
        steer = load_control_vectors([(a, 0.5), (b, -2.0)], n_layer, n_embd, (1, n_layer - 2))
        want_dirs = 0.5 * dirs
        want_dirs[1] += -2.0 * dirs[2]
        want_dirs[n_layer - 1] = 0.0
        np.testing.assert_allclose(steer.dirs, want_dirs, rtol=1e-6)
        assert (steer.attn_scale, steer.ffn_scale) == (0.0, 1.0)  # llama.cpp: the layer output
        ref.steer = (steer.dirs, 0.0, 1.0)
        prompt = toks(16, eng.info.n_vocab)
        s = eng.new_session(20)
        s.set_steering(steer)
        got = s.eval_all_logits(prompt)
        assert np.abs(log_softmax(got) - log_softmax(ref.forward(prompt))).max() <= LOGPROB_TOL
        # files llama.cpp refuses are refused
        bad = tmp_path / "bad.gguf"
        write_llamacpp_style(bad, {0: dirs[1]})
        with pytest.raises(SteeringError, match="layer 0"):
            read_control_vector(bad)
        write_llamacpp_style(bad, {1: dirs[1][:-1]})
        with pytest.raises(SteeringError, match="width"):
            load_control_vectors([(bad, 1.0)], n_layer, n_embd)
        with pytest.raises(SteeringError):
            Steering(np.full((n_layer, n_embd), np.nan, np.float32))


def test_changing_steering_drops_the_held_prefix(tmp_path: Path) -> None:
    gf = tiny(tmp_path, "llama")
    with engine_of(gf) as eng:
        dirs = directions(eng.info.n_layer, eng.info.n_embd)
        steer = Steering(dirs, ATTN, FFN)
        s = eng.new_session(32)
        s.eval(toks(10, eng.info.n_vocab))
        assert s.steering_key == ""
        s.set_steering(steer)  # other steering: the KV held was computed without it
        assert s.n_tokens == 0 and s.steering_key == steer.key != ""
        s.eval(toks(10, eng.info.n_vocab))
        s.set_steering(Steering(dirs, ATTN, FFN))  # the same effect: kept
        assert s.n_tokens == 10
        s.set_steering(steer.with_scales(ffn_scale=0.0, attn_scale=0.0))  # inactive = none
        assert s.n_tokens == 0 and s.steering_key == "" and s.steering is None
        assert steer.with_scales(ffn_scale=2.0).key != steer.key
        # the engine's steering goes to every new session, checked against the model
        eng.set_steering(steer)
        assert eng.new_session(8).steering_key == steer.key == eng.steering_key
        with pytest.raises(SteeringError):
            eng.set_steering(Steering(dirs[:, :-1]))
