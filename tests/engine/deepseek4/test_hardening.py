"""deepseek4 trusts nothing from its file: a hash-routing table (ffn_gate_tid2eid) naming a
missing expert is refused at open with one line, and the C forward checks the same thing
itself (the table is bound behind Python's back here) along with every buffer length,
index and count its entry points take, each failure a return code mapped to a message."""

from __future__ import annotations

import ctypes
import io
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from ds4d.engine import deepseek4 as D
from ds4d.engine.engine import Engine
from ds4d.engine.errors import EngineError, ModelLoadError
from ds4d.engine.gguf_file import GGUFFile
from ds4d.engine.native import lib
from ds4d.tools.synth import SYNTH_PARAMS, write_deepseek4

P = SYNTH_PARAMS
TID2EID_SLOT = D.LAYER_SLOTS.index("ffn_gate_tid2eid.weight")
I32 = 26  # GGML_TYPE_I32


@pytest.fixture(scope="module")
def synth_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("ds4hard") / "synth.gguf"
    write_deepseek4(path, seed=4)
    return path


@pytest.fixture
def engine(synth_path):
    with Engine.open(synth_path, threads=1) as e:
        yield e


def _with_route(src, dst, layer: int, token: int, slot: int, expert: int) -> None:
    """Copies the GGUF with one entry of a layer's routing table replaced."""
    gf = GGUFFile(src)
    name = f"blk.{layer}.ffn_gate_tid2eid.weight"
    info = next(t for t in gf.index.tensors if t.name == name)
    data = bytearray(src.read_bytes())
    at = info.offset + 4 * (token * P.n_expert_used + slot)
    data[at : at + 4] = int(expert).to_bytes(4, "little", signed=True)
    dst.write_bytes(bytes(data))


@pytest.mark.parametrize("expert", [P.n_expert, -1, 2**31 - 1])
def test_out_of_range_expert_id_refused_at_open(synth_path, tmp_path, expert):
    bad = tmp_path / "bad_route.gguf"
    _with_route(synth_path, bad, layer=1, token=77, slot=1, expert=expert)
    with pytest.raises(ModelLoadError) as e:
        Engine.open(bad, threads=1)
    text = str(e.value)
    assert "\n" not in text
    assert (
        f"tensor blk.1.ffn_gate_tid2eid.weight: expert id {expert} for token 77 (slot 1),"
        f" expected 0 to {P.n_expert - 1} (1 bad entries)"
    ) in text
    assert str(bad) in text


def test_in_range_expert_ids_still_open(synth_path, tmp_path):
    ok = tmp_path / "ok_route.gguf"
    _with_route(synth_path, ok, layer=0, token=3, slot=0, expert=P.n_expert - 1)
    with Engine.open(ok, threads=1) as e:
        st = e.model.new_state(16)
        st.eval(np.array([3, 4], np.int32), None)
        assert st.n_past == 2
        st.close()


def _table(expert_of_token: dict[int, int]) -> np.ndarray:
    table = np.zeros((P.n_vocab, P.n_expert_used), np.int32)
    table[:] = np.arange(P.n_expert_used, dtype=np.int32)
    for tok, expert in expert_of_token.items():
        table[tok, -1] = expert
    return table


def _bind(engine, il: int, slot: int, a: np.ndarray, ggml_type: int, n_bytes: int | None = None):
    nbytes = a.nbytes if n_bytes is None else n_bytes
    return lib.ds4n_dsv4_set_tensor(engine.model.handle, il, slot, a.ctypes.data, ggml_type, nbytes)


def test_c_refuses_an_out_of_range_expert_id(engine):
    """The routing table is replaced in C directly, bypassing the load-time check: the
    forward returns DSV4_ERR_EXPERT (-4) before reading anything through the bad id and leaves
    the state as it was."""
    table = _table({9: P.n_expert, 10: -3})
    assert _bind(engine, 0, TID2EID_SLOT, table, I32) == 0
    st = engine.model.new_state(32)
    try:
        st.eval(np.array([1, 2], np.int32), None)
        logits = np.zeros(P.n_vocab, np.float32)
        for bad in (9, 10):
            with pytest.raises(EngineError) as e:
                st.eval(np.array([5, bad], np.int32), logits)
            assert str(e.value) == "deepseek4 eval failed: expert id out of range"
            assert st.n_past == 2
        st.eval(np.array([5, 6], np.int32), logits)  # the good rows still route
        assert st.n_past == 4 and np.isfinite(logits).all()
    finally:
        st.close()


def test_c_refuses_tensors_that_do_not_fit_their_slot(engine):
    table = _table({})
    assert _bind(engine, 0, TID2EID_SLOT, table, I32, table.nbytes - 4) == -6  # short
    assert _bind(engine, 0, TID2EID_SLOT, table, I32, table.nbytes + 4) == -6  # long
    assert _bind(engine, 0, TID2EID_SLOT, table, 0) == -6  # F32 is not an id table
    norm = np.ones(P.n_embd, np.float32)
    attn_norm = D.LAYER_SLOTS.index("attn_norm.weight")
    assert _bind(engine, 1, attn_norm, norm, 1) == -6  # vectors are read as F32 in place
    assert _bind(engine, 1, attn_norm, norm, 0) == 0
    assert _bind(engine, 1, attn_norm, norm[:-1], 0) == -6
    q_a = D.LAYER_SLOTS.index("attn_q_a.weight")
    assert _bind(engine, 1, q_a, norm, 99) == -6  # an unknown quant type
    # no such layer, no such slot, and a slot layer 0 (window only) does not have
    assert _bind(engine, P.n_layer, attn_norm, norm, 0) == -7
    assert _bind(engine, -2, 0, norm, 0) == -7
    assert _bind(engine, 0, len(D.LAYER_SLOTS), norm, 0) == -7
    assert _bind(engine, -1, len(D.GLOBAL_SLOTS), norm, 0) == -7
    assert _bind(engine, 0, D.LAYER_SLOTS.index("attn_compressor_norm.weight"), norm, 0) == -7
    # the routing table exists only in hash layers
    assert _bind(engine, P.n_hash_layer, TID2EID_SLOT, table, I32) == -7
    assert lib.ds4n_dsv4_set_tensor(engine.model.handle, 1, attn_norm, None, 0, 4) == -7


def _eval(model, state, tokens: np.ndarray, logits: np.ndarray | None, n_logits: int) -> int:
    return lib.ds4n_dsv4_eval(
        model.handle, state.handle, None, tokens.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
        len(tokens), None if logits is None else logits.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
        n_logits, 0 if logits is None or len(logits) == P.n_vocab else 1,
    )  # fmt: skip


def test_c_checks_eval_arguments(engine, synth_path):
    st = engine.model.new_state(8)
    tokens = np.array([1, 2, 3], np.int32)
    try:
        short = np.zeros(P.n_vocab, np.float32)
        assert _eval(engine.model, st, tokens[:1], short, P.n_vocab - 1) == -7
        many = np.zeros(3 * P.n_vocab, np.float32)
        assert _eval(engine.model, st, tokens, many, 3 * P.n_vocab - 1) == -7  # all_logits
        assert _eval(engine.model, st, np.array([P.n_vocab], np.int32), None, 0) == -2
        assert _eval(engine.model, st, np.array([-1], np.int32), None, 0) == -2
        assert _eval(engine.model, st, np.arange(9, dtype=np.int32), None, 0) == -1
        assert st.n_past == 0
        assert _eval(engine.model, st, tokens, many, many.size) == 0
        assert st.n_past == 3 and np.isfinite(many).all()
        with Engine.open(synth_path, threads=1) as other:  # a state belongs to its model
            assert _eval(other.model, st, tokens[:1], None, 0) == -7
    finally:
        st.close()


def test_c_checks_state_calls(engine):
    st = engine.model.new_state(64)
    try:
        counts = np.zeros(P.n_layer, np.int64)
        p64 = ctypes.POINTER(ctypes.c_int64)
        ptr = counts.ctypes.data_as(p64)
        restore = lib.ds4n_dsv4_state_restore
        assert restore(st.handle, 0, ptr, ptr, P.n_layer - 1) == -7  # too few counts
        assert restore(st.handle, 65, ptr, ptr, P.n_layer) == -7  # past n_ctx
        big = np.full(P.n_layer, 1000, np.int64)
        assert restore(st.handle, 0, big.ctypes.data_as(p64), ptr, P.n_layer) == -7
        assert restore(st.handle, 0, ptr, ptr, P.n_layer) == 0
        ls = D.LayerState()
        assert lib.ds4n_dsv4_state_layer(st.handle, P.n_layer, ctypes.byref(ls)) == -7
        assert lib.ds4n_dsv4_state_layer(st.handle, -1, ctypes.byref(ls)) == -7
    finally:
        st.close()


def test_c_refuses_bad_parameters():
    p = D.Params(**{f: getattr(P, f) for f in D._INT_FIELDS + D._FLOAT_FIELDS})
    ratios = (ctypes.c_int32 * P.n_layer)(*P.compress_ratios)
    ok = lib.ds4n_dsv4_model_new(ctypes.byref(p), ratios, P.n_layer)
    assert ok
    lib.ds4n_dsv4_model_free(ok)
    assert not lib.ds4n_dsv4_model_new(ctypes.byref(p), ratios, P.n_layer - 1)
    for field, value in (("n_expert_used", P.n_expert + 1), ("n_hc", 17), ("n_rot", 130),
                         ("n_layer", -1), ("n_vocab", 0), ("n_hash_layer", P.n_layer + 1)):  # fmt: skip
        bad = D.Params(**{f: getattr(p, f) for f, _ in D.Params._fields_})
        setattr(bad, field, value)
        n = bad.n_layer
        assert not lib.ds4n_dsv4_model_new(ctypes.byref(bad), ratios, n), field


def test_every_error_code_has_a_message():
    header = Path(D.__file__).parents[2] / "native" / "deepseek4.h"
    codes = {int(v) for v in re.findall(r"DSV4_ERR_\w+ = (-\d+)", header.read_text())}
    assert codes == set(D.ERRORS)


def test_state_payload_with_an_out_of_range_token_is_refused(engine):
    st = engine.model.new_state(64)
    st.eval(np.array([1, 2, 3, 4], np.int32), None)
    buf = io.BytesIO()
    st.write_kv(buf, 4)
    st.close()
    data = bytearray(buf.getvalue())
    at = D._PAYLOAD_HEADER.size + 4 * 2  # the third token id
    data[at : at + 4] = P.n_vocab.to_bytes(4, "little")
    fresh = engine.model.new_state(64)
    try:
        with pytest.raises(EngineError) as e:
            fresh.read_kv(io.BytesIO(bytes(data)), 4)
        assert str(e.value) == (
            f"deepseek4 state payload holds token id {P.n_vocab} at position 2, outside the"
            f" vocabulary of {P.n_vocab}"
        )
        assert fresh.n_past == 0
        fresh.read_kv(io.BytesIO(buf.getvalue()), 4)  # the untouched payload loads
        assert fresh.n_past == 4
    finally:
        fresh.close()


def test_eval_refuses_a_chunk_past_the_c_limit(engine):
    st = engine.model.new_state(70000)
    try:
        tokens = np.ones(65537, np.int32)
        assert _eval(engine.model, st, tokens, None, 0) == -7
        assert st.n_past == 0
    finally:
        st.close()


@pytest.mark.parametrize(
    ("replacement", "why"),
    [
        (lambda m: m.replace(" ", "x", 1), "expected two tokens separated by a space"),
        # U+0283 is no byte-level symbol; the first merge ("\u0120 t") starts with one
        (lambda m: "\u0283" + m[1:], "out of vocabulary"),
    ],
)
def test_corrupt_merge_refused_at_open_with_one_line(synth_path, tmp_path, replacement, why):
    """A damaged merge (found by mutating the file) used to escape as tokenizers' bare
    Exception, or as a many-line TypeError."""
    gf = GGUFFile(synth_path)
    merge = gf.get_array("tokenizer.ggml.merges").strings()[0]
    new = replacement(merge)
    old_entry = struct.pack("<Q", len(merge.encode())) + merge.encode()
    new_entry = struct.pack("<Q", len(new.encode())) + new.encode()
    data = synth_path.read_bytes()
    assert data.count(old_entry) == 1 and len(new_entry) == len(old_entry)
    bad = tmp_path / "bad_merge.gguf"
    bad.write_bytes(data.replace(old_entry, new_entry))
    with pytest.raises(ModelLoadError) as e:
        Engine.open(bad, threads=1)
    assert "\n" not in str(e.value) and why in str(e.value) and str(bad) in str(e.value)


def test_damaged_copies_run_or_are_refused_with_one_line(synth_path, tmp_path):
    """Seeded damage to the header, the metadata and tensor index, the routing tables and
    the length: every copy either opens and runs two tokens or is refused with a
    ModelLoadError whose first line says why; nothing else escapes (a longer run of this,
    1000 copies under ASan + UBSan, found the tokenizer's bare Exception)."""
    import random

    base = synth_path.read_bytes()
    gf = GGUFFile(synth_path)
    index_end = gf.index.data_offset
    tables = [t for t in gf.index.tensors if t.name.endswith("tid2eid.weight")]
    rng = random.Random(2026)
    outcomes = {"ran": 0, "refused": 0}
    damaged = tmp_path / "damaged.gguf"
    for _ in range(60):
        data = bytearray(base)
        must_refuse = False
        kind = rng.choice(["byte", "u32", "route", "cut"])
        if kind == "byte":
            data[rng.randrange(index_end)] = rng.randrange(256)
        elif kind == "u32":
            at = rng.randrange(index_end - 4)
            value = rng.choice([0, 1, 2**31 - 1, 2**32 - 1, rng.randrange(2**32)])
            data[at : at + 4] = value.to_bytes(4, "little")
        elif kind == "route":
            t = rng.choice(tables)
            at = t.offset + 4 * rng.randrange(t.n_bytes // 4)
            value = rng.choice([-1, P.n_expert, 2**31 - 1, rng.randrange(P.n_expert)])
            data[at : at + 4] = value.to_bytes(4, "little", signed=True)
            must_refuse = not 0 <= value < P.n_expert
        else:
            del data[rng.randrange(len(data)) :]
        damaged.write_bytes(bytes(data))
        try:
            engine = Engine.open(damaged, threads=1)
        except ModelLoadError as e:
            assert str(e).strip() and "Traceback" not in str(e)
            outcomes["refused"] += 1
            continue
        assert not must_refuse, "a routing table naming a missing expert was loaded"
        with engine:
            st = engine.model.new_state(8)
            st.eval(np.array([1, rng.randrange(P.n_vocab)], np.int32), None)
            st.close()
        outcomes["ran"] += 1
    assert outcomes["refused"] > 30 and outcomes["ran"] > 0
