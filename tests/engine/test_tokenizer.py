"""The GGUF tokenizer against llama.cpp's ids for SmolLM2, and SentencePiece against a
straight port of llama.cpp's SPM algorithm on a vocabulary trained here."""

from __future__ import annotations

import heapq
import json
import logging
import re
import time
from pathlib import Path

import gguf
import pytest

from ds4d.engine.errors import ModelLoadError
from ds4d.engine.tokenizer import BYTE, CONTROL, NORMAL, UNKNOWN, USER_DEFINED, Tokenizer


@pytest.fixture(scope="module")
def reader(model_path: Path) -> gguf.GGUFReader:
    return gguf.GGUFReader(model_path)


@pytest.fixture(scope="module")
def tok(reader: gguf.GGUFReader) -> Tokenizer:
    return Tokenizer.from_gguf(reader)


@pytest.fixture(scope="module")
def vectors(data_dir: Path) -> Path:
    return data_dir / "vectors" / "smollm2"


def test_reproduces_llama_cpp_ids(tok: Tokenizer, vectors: Path) -> None:
    golden = json.loads((vectors / "tokenizer.json").read_text())
    assert golden["parse_special"] and not golden["add_bos"]
    for case in golden["cases"]:
        assert tok.encode(case["text"]) == case["ids"], case["text"]


def test_reproduces_prompt_tokens(tok: Tokenizer, vectors: Path) -> None:
    cases = [
        p
        for p in sorted(vectors.glob("*.json"))
        if not p.name.endswith(".exact.json") and p.name != "tokenizer.json"
    ]
    assert len(cases) >= 6
    for path in cases:
        case = json.loads(path.read_text())
        assert tok.encode(case["prompt"], special=True) == case["prompt_tokens"], path.name


def test_decode_round_trips(tok: Tokenizer, vectors: Path) -> None:
    golden = json.loads((vectors / "tokenizer.json").read_text())
    for case in golden["cases"]:
        assert tok.decode(case["ids"]) == case["text"]
        assert b"".join(tok.token_bytes(i) for i in case["ids"]) == case["text"].encode()


def test_metadata_and_special_tokens(tok: Tokenizer) -> None:
    assert tok.n_vocab == 49152
    assert (tok.bos_id, tok.eos_id, tok.add_bos) == (1, 2, False)
    im_end, endoftext = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    assert (im_end, endoftext) == (2, 0)
    assert {im_end, endoftext} <= tok.eog_ids
    assert tok.token_to_id("<|im_start|>") not in tok.eog_ids
    assert tok.token_to_id("no such token") is None
    assert tok.is_special(1) and not tok.is_special(tok.encode("Hello")[0])
    assert tok.token_bytes(1) == b"<|im_start|>"
    assert tok.token_bytes(tok.encode(" the")[0]) == b" the"
    for bad in (-1, tok.n_vocab):
        with pytest.raises(ValueError, match="out of range"):
            tok.token_bytes(bad)
        with pytest.raises(ValueError, match="out of range"):
            tok.decode([5, bad])


def test_special_false_tokenizes_control_text_as_plain_text(tok: Tokenizer) -> None:
    text = "<|im_start|>user"
    assert tok.encode(text) == [1, tok.encode("user")[0]]
    plain = tok.encode(text, special=False)
    assert 1 not in plain and len(plain) > 2
    assert tok.decode(plain) == text
    assert tok.decode([1, 2], special=False) == ""


def test_incremental_decoder_holds_partial_utf8(tok: Tokenizer) -> None:
    text = "emoji 🚀🔥👍🏽 and 日本語"
    ids = tok.encode(text)
    # Several of these characters are split over byte-level tokens.
    assert any(
        tok.token_bytes(i).decode("utf-8", "replace")
        != tok.token_bytes(i).decode("utf-8", "ignore")
        for i in ids
    )
    dec = tok.incremental_decoder()
    pieces = [dec.feed(i) for i in ids]
    assert "\ufffd" not in "".join(pieces)
    assert "".join(pieces) + dec.flush() == text
    # An unfinished character at the end comes out as one replacement character.
    rocket = tok.encode("🚀")
    assert len(rocket) > 1
    assert dec.feed(rocket[0]) == ""
    assert dec.flush() == "\ufffd"
    assert dec.feed(tok.encode("ok")[0]) == "ok"


def test_long_text_is_fast(tok: Tokenizer, data_dir: Path) -> None:
    text = (data_dir / "text" / "promessi_sposi.txt").read_text()[:60_000]
    start = time.perf_counter()
    ids = tok.encode(text)
    elapsed = time.perf_counter() - start
    assert len(ids) >= 20_000
    assert elapsed < 1.0, f"{len(ids)} tokens took {elapsed:.2f} s"
    assert tok.decode(ids) == text


def _bpe_fields(reader: gguf.GGUFReader) -> dict:
    return {
        "tokens": reader.fields["tokenizer.ggml.tokens"].contents(),
        "token_types": reader.fields["tokenizer.ggml.token_type"].contents(),
        "merges": [
            tuple(m.split(" ", 1)) for m in reader.fields["tokenizer.ggml.merges"].contents()
        ],
    }


def test_unknown_pre_type_falls_back_to_gpt2_with_warning(
    reader: gguf.GGUFReader, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="ds4d.engine.tokenizer"):
        fallback = Tokenizer(model="gpt2", pre="no-such-pre", **_bpe_fields(reader))
    assert "no-such-pre" in caplog.text
    gpt2 = Tokenizer(model="gpt2", pre="gpt-2", **_bpe_fields(reader))
    text = "a\n\nb (foo) I'M 12345!!\n\n"
    assert fallback.encode(text) == gpt2.encode(text)


def test_pre_type_selects_llama_cpp_regex(reader: gguf.GGUFReader) -> None:
    gpt2 = Tokenizer(model="gpt2", pre="gpt-2", **_bpe_fields(reader))
    llama3 = Tokenizer(model="gpt2", pre="llama-bpe", **_bpe_fields(reader))
    assert llama3.add_bos and not gpt2.add_bos  # llama.cpp's defaults for these types
    # GPT-2's "\s+(?!\S)" leaves the last newline to stand alone; llama3's "\s*[\r\n]+"
    # keeps the newline run together.
    assert [gpt2.decode([i]) for i in gpt2.encode("a\n\nb")] == ["a", "\n", "\n", "b"]
    assert [llama3.decode([i]) for i in llama3.encode("a\n\nb")] == ["a", "\n\n", "b"]


def _write_gguf(path: Path, **fields) -> Path:
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tokenizer_model(fields["model"])
    writer.add_token_list(fields["tokens"])
    if "types" in fields:
        writer.add_token_types(fields["types"])
    if "scores" in fields:
        writer.add_token_scores(fields["scores"])
    for key in ("bos", "eos", "unk"):
        if key in fields:
            getattr(writer, f"add_{key}_token_id")(fields[key])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_unsupported_tokenizer_model_is_refused(tmp_path: Path) -> None:
    # (bert, WordPiece, is supported since the embedding families: rwkv is not)
    path = _write_gguf(tmp_path / "rwkv.gguf", model="rwkv", tokens=["[PAD]", "a"])
    with pytest.raises(ModelLoadError, match="'rwkv'"):
        Tokenizer.from_gguf(gguf.GGUFReader(path))


# --- SentencePiece ("llama" tokenizer model) ------------------------------------------

SPM_SPECIALS = ["<unk>", "<s>", "</s>", "<|im_end|>"]
SPM_USER = "<tool>"


@pytest.fixture(scope="module")
def spm_vocab(data_dir: Path) -> tuple[list[str], list[int], list[float]]:
    """A SentencePiece-style vocabulary (▁ pieces, byte tokens, scores falling with the
    piece's rank) learned here with tokenizers' BPE trainer from the Italian text."""
    from tokenizers import Tokenizer as HF
    from tokenizers import models, normalizers, pre_tokenizers, trainers

    text = (data_dir / "text" / "promessi_sposi.txt").read_text()[:300_000]
    trainer_tok = HF(models.BPE())
    trainer_tok.normalizer = normalizers.Replace(" ", "▁")
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=3000, show_progress=False, limit_alphabet=120)
    trainer_tok.train_from_iterator(text.splitlines(), trainer)
    learned = sorted(trainer_tok.get_vocab().items(), key=lambda kv: kv[1])
    pieces = [p for p, _ in learned] + ["▁▁", "▁▁▁", "▁▁▁▁"]
    tokens = [*SPM_SPECIALS, *(f"<0x{b:02X}>" for b in range(256)), SPM_USER, *pieces]
    types = [
        UNKNOWN,
        CONTROL,
        CONTROL,
        CONTROL,
        *([BYTE] * 256),
        USER_DEFINED,
        *([NORMAL] * len(pieces)),
    ]
    scores = [0.0] * (len(tokens) - len(pieces)) + [-float(i) for i in range(len(pieces))]
    return tokens, types, scores


def _spm_oracle(
    tokens: list[str], types: list[int], scores: list[float], text: str, special: bool
) -> list[int]:
    """llama.cpp's SPM tokenize (llm_tokenizer_spm_session), ported literally."""
    ids = {t: i for i, t in enumerate(tokens)}
    matched = [
        t
        for t, k in zip(tokens, types, strict=True)
        if k == USER_DEFINED or (special and k in (CONTROL, UNKNOWN))
    ]
    matched.sort(key=len, reverse=True)
    out: list[int] = []
    for j, part in enumerate(re.split("(" + "|".join(map(re.escape, matched)) + ")", text)):
        if j % 2:
            out.append(ids[part])
        elif part:
            out.extend(_spm_span(ids, scores, ("▁" + part).replace(" ", "▁")))
    return out


def _spm_span(ids: dict[str, int], scores: list[float], text: str) -> list[int]:
    sym = list(text)
    nxt = [*range(1, len(sym)), -1]
    prv = list(range(-1, len(sym) - 1))
    queue: list[tuple[float, int, int, int]] = []

    def try_bigram(left: int, right: int) -> None:
        if left == -1 or right == -1:
            return
        merged = sym[left] + sym[right]
        if merged in ids:  # best score first, then leftmost
            heapq.heappush(queue, (-scores[ids[merged]], left, right, len(merged)))

    for i in range(1, len(sym)):
        try_bigram(i - 1, i)
    while queue:
        _, left, right, size = heapq.heappop(queue)
        if not sym[left] or not sym[right] or len(sym[left]) + len(sym[right]) != size:
            continue
        sym[left] += sym[right]
        sym[right] = ""
        nxt[left] = nxt[right]
        if nxt[right] != -1:
            prv[nxt[right]] = left
        try_bigram(prv[left], left)
        try_bigram(left, nxt[left])
    out = []
    i = 0
    while i != -1:
        piece = sym[i]
        if piece in ids:
            out.append(ids[piece])
        else:
            out.extend(ids[f"<0x{b:02X}>"] for b in piece.encode())
        i = nxt[i]
    return out


def test_sentencepiece_matches_llama_cpp_algorithm(
    tmp_path: Path, spm_vocab: tuple[list[str], list[int], list[float]], data_dir: Path
) -> None:
    tokens, types, scores = spm_vocab
    path = _write_gguf(
        tmp_path / "spm.gguf",
        model="llama",
        tokens=tokens,
        types=types,
        scores=scores,
        bos=1,
        eos=2,
        unk=0,
    )
    spm = Tokenizer.from_gguf(gguf.GGUFReader(path))
    assert spm.add_bos and spm.bos_id == 1
    assert spm.token_to_id("<|im_end|>") in spm.eog_ids and 2 in spm.eog_ids

    novel = (data_dir / "text" / "promessi_sposi.txt").read_text()
    texts = [
        "Quel ramo del lago di Como",
        "  due  spazi,\tuna tab\n\ne righe    vuote ",
        "<s>Renzo<|im_end|>\n<tool>Lucia</s>",
        "unknown → 🚀 bytes ✓ ж",
        novel[300_000:304_000],  # text the vocabulary was not trained on
        novel[-3_000:],
    ]
    for text in texts:
        for special in (True, False):
            expected = _spm_oracle(tokens, types, scores, text, special)
            assert spm.encode(text, special=special) == expected, (text[:40], special)
    assert spm.decode(spm.encode("Quel ramo")) == " Quel ramo"  # the added space prefix
    assert spm.decode(spm.encode("🚀")) == " 🚀"


def test_every_known_pre_type_regex_compiles_and_splits_losslessly() -> None:
    from tokenizers import Regex, pre_tokenizers

    from ds4d.engine.tokenizer import _PRE_TYPES

    sample = (
        "Hello, World! It's 2024-12-31: 3.14159\n\n\tcafé ÀB ×÷ 日本語のテキスト 한국어 🚀 x__y  "
    )
    assert {"smollm", "gpt-2", "llama-bpe", "qwen2", "deepseek-llm", "deepseek-v3"} <= set(
        _PRE_TYPES
    )
    for name, pre in _PRE_TYPES.items():
        pieces = [sample]
        for regex in pre.regexes:
            split = pre_tokenizers.Split(Regex(regex), behavior="isolated")
            pieces = [p for piece in pieces for p, _ in split.pre_tokenize_str(piece)]
        assert "".join(pieces) == sample, name
        assert len(pieces) > 5, name
