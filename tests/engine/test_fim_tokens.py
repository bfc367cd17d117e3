"""FIM token discovery (ds4d.engine.fim) on real vocabularies: the kit's, and the kit's
with other families' spellings (tests/chat/fim_variants.py)."""

from __future__ import annotations

import functools

import pytest

from ds4d.engine.fim import FimTokens, find_fim_tokens
from ds4d.engine.gguf_file import GGUFFile
from ds4d.engine.tokenizer import Tokenizer
from tests.chat.fim_variants import variant_gguf
from tests.helpers.kit import kit_model

QWEN = FimTokens(pre=151659, suf=151661, mid=151660, pad=151662, rep=151663, sep=151664)


@functools.cache
def opened(path: str) -> tuple[GGUFFile, Tokenizer]:
    gf = GGUFFile(path)
    return gf, Tokenizer.from_gguf(gf)


def tokens_of(path: object, metadata: dict | None = None) -> FimTokens:
    gf, tok = opened(str(path))
    get = gf.get if metadata is None else metadata.get
    return find_fim_tokens(get, tok)


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "qwen3moe"])
def test_qwen_vocabularies_are_found_by_text(family):
    assert tokens_of(kit_model(family)) == QWEN


@pytest.mark.parametrize("family", ["llama", "gemma3", "phi3", "gpt-oss"])
def test_vocabularies_without_fim_tokens_have_none(family):
    fim = tokens_of(kit_model(family))
    assert fim == FimTokens() and fim.missing == ["prefix", "suffix", "middle"]
    assert not fim.supported


def test_metadata_keys_are_taken_and_the_deprecated_ones_win():
    assert tokens_of(variant_gguf("llama-keys")) == FimTokens(128002, 128003, 128004)
    assert tokens_of(variant_gguf("llama-old-keys")) == FimTokens(128005, 128008, 128010)


def test_a_key_outside_the_vocabulary_is_ignored_not_trusted():
    path = kit_model("qwen2")
    meta = {
        "tokenizer.ggml.fim_pre_token_id": 1 << 31,  # past the vocabulary: the text's id
        "tokenizer.ggml.fim_suf_token_id": 7,  # a key in range wins over the text
        "tokenizer.ggml.fim_mid_token_id": True,  # not a number
        "tokenizer.ggml.fim_sep_token_id": -1,
    }
    assert tokens_of(path, meta) == FimTokens(151659, 7, 151660, 151662, 151663, 151664)


def test_other_spellings_are_found_by_text():
    starcoder = tokens_of(variant_gguf("starcoder2"), {})  # no keys: StarCoder2's texts
    assert starcoder == QWEN
    deepseek = tokens_of(variant_gguf("deepseek"))
    assert deepseek == FimTokens(pre=151659, suf=151661, mid=151660)
    codellama = tokens_of(variant_gguf("codellama"))
    assert codellama == FimTokens(pre=32002, suf=32003, mid=32004)
