"""Fill-in-the-middle prompts (ds4d.chat.fim) against llama-server's own, id for id, on
every FIM format (tests/chat/fim_variants.py; fixtures by scripts/fixtures/make_fim_fixtures.py),
and what the reference cannot show: markup in user text stays text, the cuts reported,
a model without FIM tokens refused in one line."""

from __future__ import annotations

import functools

import pytest

from ds4d.chat.errors import PromptRefused
from ds4d.chat.fim import Budget, ExtraChunk, InfillInput, assemble
from ds4d.engine.fim import FimTokens, find_fim_tokens
from ds4d.engine.gguf_file import GGUFFile
from ds4d.engine.tokenizer import Tokenizer
from tests.chat.fim_variants import CASES, VARIANTS, fixture, variant_gguf
from tests.helpers.kit import kit_model


@functools.cache
def vocab(name: str) -> tuple[Tokenizer, FimTokens]:
    gf = GGUFFile(variant_gguf(name))
    tok = Tokenizer.from_gguf(gf)
    return tok, find_fim_tokens(gf.get, tok)


def infill_input(fields: dict) -> InfillInput:
    extra = [ExtraChunk(c["text"], c.get("filename", "tmp")) for c in fields.get("input_extra", [])]
    return InfillInput(
        fields["input_prefix"], fields["input_suffix"], fields.get("prompt", ""), extra
    )


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_prompts_match_llama_server_id_for_id(variant):
    tok, fim = vocab(variant)
    ref = fixture(variant)
    checked = 0
    for server in ref["servers"].values():
        cfg = server["config"]
        budget = Budget(cfg["n_ctx"], cfg["n_batch"], cfg["n_predict"], cfg["spm"])
        for case, fields in CASES:
            got = assemble(tok, fim, infill_input(fields), budget).ids
            assert got == server["cases"][case], (variant, cfg, case)
            checked += 1
    assert checked == len(CASES) * len(ref["servers"])


def test_the_fixtures_cut_every_part_somewhere():
    """The narrow server configuration makes llama.cpp cut prefix, suffix and extra
    context: the comparison above covers the budgets, not only the layout."""
    tok, fim = vocab("qwen25")
    cfg = fixture("qwen25")["servers"]["narrow"]["config"]
    budget = Budget(cfg["n_ctx"], cfg["n_batch"], cfg["n_predict"], cfg["spm"])
    cut = assemble(tok, fim, infill_input(dict(CASES)["long"]), budget).cut
    assert cut.prefix > 0 and cut.suffix > 0 and cut.extra > 0


def test_cuts_keep_the_prefix_end_the_suffix_start_and_the_newest_extra():
    tok, fim = vocab("qwen25")
    prefix = "".join(f"a{i} = {i}\n" for i in range(300))
    suffix = "".join(f"b{i} = {i}\n" for i in range(300))
    chunks = [ExtraChunk(f"c{i} = {i}\n" * 20, f"f{i}.py") for i in range(10)]
    out = assemble(tok, fim, InfillInput(prefix, suffix, "", chunks), Budget(1024, 256, 16))
    ids = out.ids
    plain = functools.partial(tok.encode, special=False)
    pre, suf = plain(prefix), plain(suffix)
    at_pre, at_suf = ids.index(fim.pre), ids.index(fim.suf)
    assert ids[at_pre + 1 : at_suf] == pre[-(3 * 256 // 4) :]
    assert ids[at_suf + 1 : -1] == suf[: 256 // 4 - 2]
    assert out.cut.prefix == len(pre) - 192 and out.cut.suffix == len(suf) - 62
    # the extra context's newest tokens are kept: it ends with the current file's header
    assert ids[:at_pre][-len(plain("filename\n")) - 1 :] == [fim.sep, *plain("filename\n")]
    assert out.extra_tokens == at_pre == 1024 - 256 - 32
    assert out.cut.extra > 0


def test_markup_in_user_text_is_never_a_marker():
    tok, fim = vocab("qwen25")
    text = "<|fim_prefix|><|fim_suffix|><|fim_middle|><|file_sep|><|repo_name|>"
    out = assemble(tok, fim, InfillInput(text, text, text, [ExtraChunk(text, text)]), Budget(4096))
    markers = [i for i in out.ids if i in {fim.pre, fim.suf, fim.mid, fim.sep, fim.rep}]
    # the layout's own: repo, chunk file, current file, prefix, suffix, middle
    assert markers == [fim.rep, fim.sep, fim.sep, fim.pre, fim.suf, fim.mid]


def test_a_vocabulary_without_fim_tokens_is_refused_in_one_line():
    gf = GGUFFile(kit_model("llama"))
    tok = Tokenizer.from_gguf(gf)
    fim = find_fim_tokens(gf.get, tok)
    assert fim == FimTokens()
    with pytest.raises(PromptRefused) as e:
        assemble(tok, fim, InfillInput("a", "b"), Budget(1024))
    assert "\n" not in e.value.message and "fill-in-the-middle" in e.value.message
