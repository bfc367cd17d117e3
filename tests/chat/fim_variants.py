"""Vocabularies in each FIM format, made from the kit's models, and the inputs their
reference fixtures hold (tests/data/fim/<variant>.json, written by
scripts/fixtures/make_fim_fixtures.py from llama-server's own prompts).

The kit has one real FIM vocabulary (Qwen2.5's, in the qwen2 kit); the other formats are
the kit's vocabularies with control tokens renamed to another family's FIM spelling, or
with the ids given by metadata keys, so both of llama.cpp's ways of finding them are
covered: by text and by key."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tests.e2e.kit_gguf import with_metadata
from tests.helpers.kit import cache_dir, kit_manifest, kit_model

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "fim"


@dataclass(frozen=True)
class Variant:
    name: str
    base: str  # kit family
    renames: dict[int, str] = field(default_factory=dict)
    numbers: dict[str, int] = field(default_factory=dict)
    what: str = ""


_QWEN_PRE, _QWEN_MID, _QWEN_SUF, _QWEN_PAD, _QWEN_REP, _QWEN_SEP = range(151659, 151665)

VARIANTS = {
    v.name: v
    for v in (
        Variant("qwen25", "qwen2", what="Qwen2.5-Coder: found by text, repository markers"),
        Variant(
            "starcoder2",
            "qwen2",
            renames={
                _QWEN_PRE: "<fim_prefix>",
                _QWEN_MID: "<fim_middle>",
                _QWEN_SUF: "<fim_suffix>",
                _QWEN_PAD: "<fim_pad>",
                _QWEN_REP: "<repo_name>",
                _QWEN_SEP: "<file_sep>",
            },
            # llama.cpp looks StarCoder2's repository markers up by key only
            numbers={
                "tokenizer.ggml.fim_rep_token_id": _QWEN_REP,
                "tokenizer.ggml.fim_sep_token_id": _QWEN_SEP,
            },
            what="StarCoder2 spelling; repository markers by key",
        ),
        Variant(
            "deepseek",
            "qwen2",
            renames={
                _QWEN_PRE: "<｜fim▁begin｜>",
                _QWEN_MID: "<｜fim▁end｜>",
                _QWEN_SUF: "<｜fim▁hole｜>",
                _QWEN_PAD: "<|x_pad|>",
                _QWEN_REP: "<|x_repo|>",
                _QWEN_SEP: "<|x_sep|>",
            },
            what="DeepSeek-Coder: no repository markers, chunks by snippet separator",
        ),
        Variant(
            "llama-keys",
            "llama",
            numbers={
                "tokenizer.ggml.fim_pre_token_id": 128002,
                "tokenizer.ggml.fim_suf_token_id": 128003,
                "tokenizer.ggml.fim_mid_token_id": 128004,
            },
            what="ids from fim_*_token_id keys; BOS added (after the extra context)",
        ),
        Variant(
            "llama-old-keys",
            "llama",
            numbers={
                "tokenizer.ggml.fim_pre_token_id": 128002,
                "tokenizer.ggml.fim_suf_token_id": 128003,
                "tokenizer.ggml.fim_mid_token_id": 128004,
                # the deprecated keys come later in llama.cpp's list: they win
                "tokenizer.ggml.prefix_token_id": 128005,
                "tokenizer.ggml.suffix_token_id": 128008,
                "tokenizer.ggml.middle_token_id": 128010,
            },
            what="the deprecated prefix/suffix/middle_token_id keys",
        ),
        Variant(
            "codellama",
            "phi3",
            renames={32002: "▁<PRE>", 32003: "▁<SUF>", 32004: "▁<MID>", 32005: "▁<EOT>"},
            what="CodeLlama spelling in a SentencePiece vocabulary",
        ),
    )
}


def variant_gguf(name: str) -> Path:
    """The variant's GGUF, written into the kit cache on first use."""
    v = VARIANTS[name]
    src = kit_model(v.base)
    if not v.renames and not v.numbers:
        return src
    sha = kit_manifest(v.base)["sha256"][:16]
    dst = cache_dir() / f"fim-{name}-{sha}.gguf"
    if not dst.is_file():
        tmp = dst.with_suffix(".part")
        with_metadata(src, tmp, token_names=v.renames, numbers=v.numbers)
        tmp.replace(dst)
    return dst


# ---- the inputs ------------------------------------------------------------------------

_LINES = [f"    total += values[{i}] * weights[{i}]  # step {i}\n" for i in range(60)]
_LONG_PREFIX = "def weighted(values, weights):\n    total = 0\n" + "".join(_LINES)
_LONG_SUFFIX = "".join(f"print('line {i}', weighted([{i}], [2]))\n" for i in range(40))
_CHUNKS = [
    {"filename": f"src/mod_{i}.py", "text": f"def helper_{i}(x):\n    return x * {i} + 1\n" * 3}
    for i in range(6)
]

# (name, request fields); every case runs on each variant
CASES: list[tuple[str, dict]] = [
    ("basic", {
        "input_prefix": "def add(a, b):\n    ", "input_suffix": "\n\nprint(add(1, 2))\n",
        "prompt": "return",
        "input_extra": [{"filename": "util.py", "text": "import math\n\nPI = math.pi\n"},
                        {"text": "x = 1\n"}],
    }),
    ("no_extra", {"input_prefix": "int main() {\n  ", "input_suffix": "\n}\n"}),
    ("empty", {"input_prefix": "", "input_suffix": ""}),
    ("markup_is_text", {
        "input_prefix": "s = '<|fim_prefix|><fim_suffix><｜fim▁hole｜> <PRE> <|file_sep|>'\n",
        # (not in `prompt`: llama.cpp parses markup there, ds4d does not; see
        # test_markup_in_user_text_is_never_a_marker)
        "input_suffix": "<|fim_middle|><|endoftext|>\n", "prompt": "t = '<'",
        "input_extra": [{"filename": "<|file_sep|>", "text": "<fim_middle><s></s>"}],
    }),
    ("unicode", {
        "input_prefix": "# café — naïve 日本語 🙂\nname = '", "input_suffix": "'\n",
        "input_extra": [{"filename": "ü.txt", "text": "Grüße\n"}],
    }),
    ("long", {
        "input_prefix": _LONG_PREFIX, "input_suffix": _LONG_SUFFIX, "prompt": "tot",
        "input_extra": _CHUNKS,
    }),
]  # fmt: skip

# llama-server configurations: the default window, and a small one that cuts every part
SERVERS = {
    "wide": {"n_ctx": 4096, "n_batch": 2048, "n_predict": -1, "spm": False},
    "narrow": {"n_ctx": 512, "n_batch": 128, "n_predict": 32, "spm": False},
    "narrow-spm": {"n_ctx": 512, "n_batch": 128, "n_predict": 32, "spm": True},
}


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())
