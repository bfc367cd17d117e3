"""The control vectors a request may name (ds4d.serving.steering), and which slot a
steered prompt goes to: real files in llama.cpp's format, the embedded model's sessions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ds4d.chat.errors import PromptRefused
from ds4d.chat.types import SteeringChoice
from ds4d.engine.steering import load_control_vectors, write_control_vector
from ds4d.serving.slots import SlotPool
from ds4d.serving.steering import SteeringVectors
from ds4d.state.slots import Slot

N_LAYER, N_EMBD = 30, 576  # the embedded model's


def vector_file(path: Path, seed: int, layers: range = range(1, N_LAYER), width: int = N_EMBD
                ) -> Path:  # fmt: skip
    rng = np.random.default_rng(seed)
    write_control_vector(path, {i: rng.standard_normal(width).astype(np.float32)
                                for i in layers}, "test")  # fmt: skip
    return path


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    return {
        "a": vector_file(tmp_path / "a.gguf", 0),
        "b": vector_file(tmp_path / "b.gguf", 1, range(3, 9)),
        "narrow": vector_file(tmp_path / "narrow.gguf", 2, width=64),
    }


def test_a_choice_is_llama_cpps_control_vector_of_the_same_flags(files):
    vectors = SteeringVectors.load(
        [("v", files["a"], 0.5), ("v", files["b"], -2.0), ("w", files["b"], 1.0)],
        N_LAYER, N_EMBD,
    )  # fmt: skip
    assert vectors.names == ["v", "w"]
    got = vectors.resolve(SteeringChoice("v", 0.5, attn=0.2, ffn=0.7, layers=(5, 12)))
    # the same as llama.cpp's flags on the files: each scaled, summed, then the range
    want = load_control_vectors([(files["a"], 0.25), (files["b"], -1.0)], N_LAYER, N_EMBD,
                                (5, 12), attn_scale=0.2, ffn_scale=0.7)  # fmt: skip
    assert got is not None
    np.testing.assert_array_equal(got.dirs, want.dirs)
    assert (got.attn_scale, got.ffn_scale, got.key) == (0.2, 0.7, want.key)
    # defaults: ffn 1, attn 0, every layer
    plain = vectors.resolve(SteeringChoice("w"))
    assert plain is not None and plain.key == load_control_vectors([(files["b"], 1.0)],
                                                                   N_LAYER, N_EMBD).key  # fmt: skip
    assert vectors.resolve(SteeringChoice("w")) is plain  # kept for the next request


def test_off_and_no_effect_are_unsteered(files):
    vectors = SteeringVectors.load([("v", files["b"], 1.0)], N_LAYER, N_EMBD)
    assert vectors.resolve(SteeringChoice("off")) is None
    assert vectors.resolve(SteeringChoice("v", scale=0.0)) is None
    assert vectors.resolve(SteeringChoice("v", attn=0.0, ffn=0.0)) is None
    assert vectors.resolve(SteeringChoice("v", layers=(10, 20))) is None  # b has layers 3..8


def test_unknown_and_unusable_names_are_refused_naming_the_field(files, tmp_path):
    vectors = SteeringVectors.load(
        [("v", files["a"], 1.0), ("narrow", files["narrow"], 1.0),
         ("gone", tmp_path / "missing.gguf", 1.0)],
        N_LAYER, N_EMBD,
    )  # fmt: skip
    assert vectors.names == ["v"]
    with pytest.raises(PromptRefused) as e:
        vectors.resolve(SteeringChoice("nope"))
    assert e.value.param == "steering"
    assert e.value.message == "unknown steering vector 'nope' (this model has: v, off)"
    with pytest.raises(PromptRefused, match="'narrow' cannot be used: .*width is 576"):
        vectors.resolve(SteeringChoice("narrow"))
    with pytest.raises(PromptRefused, match="'gone' cannot be used: cannot read"):
        vectors.resolve(SteeringChoice("gone"))


def test_a_slot_of_other_steering_shares_nothing_with_the_prompt(engine, files):
    steering = SteeringVectors.load([("v", files["b"], 1.0)], N_LAYER, N_EMBD).resolve(
        SteeringChoice("v")
    )
    assert steering is not None
    slots = [Slot(i, engine.new_session(64), 64) for i in range(2)]
    slots[0].session.eval([1, 2, 3, 4])
    slots[1].session.set_steering(steering)
    slots[1].session.eval([1, 2, 3, 9])
    slots[0].last_used, slots[1].last_used = 10.0, 5.0
    pool = SlotPool(slots)
    assert pool.best_idle([1, 2, 3, 9]).index == 0  # slot 1's KV is another steering's
    assert pool.best_idle([1, 2, 3, 9], steering_key=steering.key).index == 1
    assert pool.best_idle([1, 2, 3, 4], steering_key=steering.key).index == 1
