"""Phi-3's special tokens drop the whitespace after them (llama.cpp sets RSTRIP on them
when general.name holds "phi-3"/"phi3"; transformers reads rstrip from tokenizer.json),
and the state layer's keys still match the rendered prompt."""

from __future__ import annotations

import pytest

from ds4d.engine.tokenizer import Tokenizer, _strips_after_special
from ds4d.state.kvstate import KVState
from tests.helpers.kit import kit_model

# Ids from llama.cpp (llama-cpp-python 0.3.36, Llama(kit phi3 GGUF, vocab_only=True)
# .tokenize(text.encode(), add_bos=False, special=True)), recorded once.
LLAMA_CPP_IDS = {
    "<|user|>\nhi<|end|>\n<|assistant|>\n": [32010, 7251, 32007, 32001],
    "<|user|> \t\n hi there<|end|>\n<|assistant|>": [32010, 7251, 727, 32007, 32001],
    "<s><|system|>\nA<|end|>\n<|user|>\nB<|end|>\n<|assistant|>\n": [
        1, 32006, 319, 32007, 32010, 350, 32007, 32001,
    ],
    # </s> strips; <unk>, <s>, <|endoftext|> keep the space (the space prefix then stays).
    "</s> x<unk> y<s> z<|endoftext|> w": [2, 921, 0, 29871, 343, 1, 29871, 503, 32000, 29871, 281],
    # Only C-locale whitespace is stripped: a no-break space stays.
    "<|user|>\u00a0hi<|user|>\n\n": [32010, 20246, 2918, 32010],
}  # fmt: skip


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_gguf(kit_model("phi3"))


def test_kit_phi3_is_recognized_by_name() -> None:
    assert _strips_after_special("Phi3")  # the kit's general.name
    assert _strips_after_special("Phi-3-mini-4k-instruct")
    assert not _strips_after_special("Phi 2") and not _strips_after_special("Llama-3")


@pytest.mark.parametrize("text", list(LLAMA_CPP_IDS))
def test_ids_match_llama_cpp(tok: Tokenizer, text: str) -> None:
    assert tok.encode(text) == LLAMA_CPP_IDS[text]


@pytest.mark.parametrize("text", list(LLAMA_CPP_IDS))
def test_canonical_text_tokenizes_the_same_and_is_what_the_ids_spell(
    tok: Tokenizer, text: str
) -> None:
    ids = LLAMA_CPP_IDS[text]
    canonical = tok.canonical_text(text)
    assert tok.encode(canonical) == ids
    assert tok.canonical_text(canonical) == canonical
    assert tok.source_text(ids) == canonical


def test_canonical_text_removes_only_the_stripped_whitespace(tok: Tokenizer) -> None:
    text = "<|user|>\n  a \n<|end|>\n\n<|assistant|> b\n"
    assert tok.canonical_text(text) == "<|user|>a \n<|end|><|assistant|>b\n"
    assert tok.canonical_text("plain text\n") == "plain text\n"


def test_continuation_strips_after_a_special_token_inside(tok: Tokenizer) -> None:
    text = " more<|end|>\n<|assistant|>\n"
    head = tok.encode_continuation(" more")
    assert tok.encode_continuation(text) == head + [32007, 32001]


def test_other_vocabularies_keep_their_whitespace(model_path) -> None:
    other = Tokenizer.from_gguf(model_path)
    text = "<|im_start|>user\n hi<|im_end|>\n"
    assert other.canonical_text(text) == text
    assert other.source_text(other.encode(text)) == text


def test_state_key_of_the_prompt_tokens_is_the_prompt_full_text(tok: Tokenizer) -> None:
    state = KVState(tok, 512)
    prompt = "<|user|>\nhi\n<|end|>\n<|assistant|>\n"
    full = state.full_text(prompt)
    ids = [tok.bos_id, *tok.encode(prompt)] if tok.add_bos else tok.encode(prompt)
    assert state.key_text(ids) == full
    # the next turn's prompt extends the first's key
    longer = prompt + "ok<|end|>\n<|user|>\nmore<|end|>\n<|assistant|>\n"
    assert state.full_text(longer).startswith(full)
