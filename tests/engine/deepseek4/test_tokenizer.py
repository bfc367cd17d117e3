"""The DeepSeek V4 tokenizer against independent oracles: the Hugging Face pipeline of
the official tokenizer.json, and the token bytes the official API returned."""

from __future__ import annotations

import json

import gguf
import pytest
from tokenizers import Tokenizer

from ds4d.engine.ds4_tokenizer import (
    BYTE_TO_CHAR,
    CHAT_MARKERS,
    PRE_TOKENIZER_PATTERNS,
    DS4Tokenizer,
    default_tokenizer,
    wheel_tokenizer_json,
)
from ds4d.engine.errors import ModelLoadError
from ds4d.engine.gguf_file import GGUFFile

TEXTS = [
    "Hello  world\n\n  x = 12345678;\tfoo.bar('s')",
    "    int main(void) {\n        return 0;\n    }\r\n",
    "Rispondi in italiano: perché è così? Ünïcödé naïve café — “quotes” …",
    "日本語のテキストとカタカナ、漢字123。中文标点！한국어 텍스트",
    "emoji 🙂🚀 and math ∑∫√ ² ³ ½ and arabic ١٢٣ and \u0301combining",
    '<tag attr="v">&amp;</tag> ``` json {"k": [1, 2.5e-3, null]} ```',
    "   leading and trailing spaces   \n\n\n",
]


@pytest.fixture(scope="module")
def tok() -> DS4Tokenizer:
    return default_tokenizer()


@pytest.fixture(scope="module")
def hf() -> Tokenizer:
    return Tokenizer.from_file(str(wheel_tokenizer_json()))


def test_pre_tokenizer_is_the_official_one():
    spec = json.loads(wheel_tokenizer_json().read_text(encoding="utf-8"))["pre_tokenizer"]
    splits = [p["pattern"]["Regex"] for p in spec["pretokenizers"] if p["type"] == "Split"]
    assert tuple(splits) == PRE_TOKENIZER_PATTERNS


@pytest.mark.parametrize("text", TEXTS)
def test_plain_text_matches_the_official_pipeline(tok, hf, text):
    ids = tok.encode(text, special=False)
    assert ids == hf.encode(text, add_special_tokens=False).ids
    assert tok.encode(text) == ids  # no markers in it: the same with special splitting
    assert tok.decode(ids) == text


def test_chat_markers_are_single_tokens_only_with_special(tok):
    text = "".join(CHAT_MARKERS) + "plain"
    ids = tok.encode(text)
    assert ids[: len(CHAT_MARKERS)] == [tok.marker_ids[m] for m in CHAT_MARKERS]
    assert tok.decode(ids) == text
    plain = tok.encode(text, special=False)
    assert not set(plain) & set(tok.marker_ids.values()) and tok.decode(plain) == text
    # Other added tokens of the vocabulary are ordinary text in a rendered chat (as in ds4).
    other = "<｜place▁holder▁no▁5｜>"
    assert tok.token_to_id(other) is not None
    assert tok.encode(other) == tok.encode(other, special=False) and len(tok.encode(other)) > 1
    assert tok.is_special(tok.bos_id) and not tok.is_special(tok.encode("Hello")[0])
    assert tok.decode(ids, special=False) == "plain"


def test_spans_between_markers_are_encoded_apart(tok):
    a, b = "Hello", " world"
    ids = tok.encode(a + "<think>" + b)
    assert ids == tok.encode(a, special=False) + [tok.think_open_id] + tok.encode(b, special=False)


def test_special_ids_and_generation_end(tok):
    assert tok.n_vocab == 129280
    assert tok.token_text(tok.bos_id) == "<｜begin▁of▁sentence｜>"
    assert tok.eog_ids == {tok.eos_id} and tok.is_eog(tok.eos_id)
    assert tok.token_to_id("｜DSML｜") == tok.dsml_id
    for bad in (-1, tok.n_vocab):
        with pytest.raises(ValueError, match="out of range"):
            tok.decode([5, bad])


def test_token_bytes_cover_the_official_api_tokens(data_dir, tok):
    by_bytes = {tok.token_bytes(i): i for i in range(tok.n_vocab)}
    seen = 0
    for path in sorted((data_dir / "vectors/ds4-official/official").glob("*.official.json")):
        for step in json.loads(path.read_text())["steps"]:
            for entry in [step, *step["top_logprobs"]]:
                if "｜" in entry["token"]["text"]:
                    continue  # the API spells special tokens its own way ("<｜｜end…｜｜>")
                assert bytes(entry["token"]["bytes"]) in by_bytes, entry["token"]
                seen += 1
    assert seen > 50


def test_incremental_decoder_never_splits_a_character(tok):
    text = "naïve 日本語 𝄞𓀀 done"
    ids = tok.encode(text)
    dec = tok.incremental_decoder()
    pieces = [dec.feed(i) for i in ids] + [dec.flush()]
    assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces)
    assert "" in pieces[:-1]  # some token ended inside a character and was held


def _write_gguf(path, tokens, merges=None):
    w = gguf.GGUFWriter(str(path), "deepseek4")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("joyai-llm")
    if tokens is not None:
        w.add_token_list(tokens)
    if merges is not None:
        w.add_token_merges(merges)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_vocabulary(tmp_path):
    symbols = [BYTE_TO_CHAR[b] for b in range(256)]
    merges = ["h e", "l l", "he ll", "Ġ w"]
    tokens = [
        "<｜begin▁of▁sentence｜>",
        "<｜end▁of▁sentence｜>",
        *symbols,
        "he",
        "ll",
        "hell",
        "Ġw",
        *CHAT_MARKERS[2:],
    ]
    path = tmp_path / "vocab.gguf"
    _write_gguf(path, tokens, merges)
    t = DS4Tokenizer.from_gguf(gguf.GGUFReader(str(path)))
    assert t.n_vocab == len(tokens) and t.source == str(path)
    fast = DS4Tokenizer.from_gguf(GGUFFile(path))  # the same vocabulary, read by ds4d
    assert fast.n_vocab == t.n_vocab and fast.source == str(path)
    text = "<｜User｜>hello world<｜Assistant｜>"
    assert fast.encode(text) == t.encode(text)
    ids = t.encode("<｜User｜>hello world<｜Assistant｜>")
    assert [t.token_text(i) for i in ids] == [
        "<｜User｜>",
        "hell",
        "o",
        "Ġw",
        "o",
        "r",
        "l",
        "d",
        "<｜Assistant｜>",
    ]
    assert t.decode(ids) == "<｜User｜>hello world<｜Assistant｜>"


def test_gguf_without_vocabulary_uses_the_wheel(tmp_path, tok):
    path = tmp_path / "novocab.gguf"
    _write_gguf(path, None)
    assert DS4Tokenizer.from_gguf(gguf.GGUFReader(str(path))) is tok
    assert DS4Tokenizer.from_gguf(GGUFFile(path)) is tok


def test_vocabulary_without_markers_is_refused(tmp_path):
    symbols = [BYTE_TO_CHAR[b] for b in range(256)]
    with pytest.raises(ModelLoadError, match="｜DSML｜"):
        DS4Tokenizer.from_gguf_vocab(["<｜begin▁of▁sentence｜>", *symbols], [])
    with pytest.raises(ModelLoadError, match="byte values"):
        DS4Tokenizer.from_gguf_vocab([*CHAT_MARKERS, *symbols[:-3]], [])
