"""Times Engine.open: the embedded SmolLM2, and tiny llama models carrying the real
vocabularies of the test fixtures (Llama 3 128k, Qwen 3 152k, gpt-oss 201k, Gemma 3 262k),
so that the time is what the vocabulary costs. Prints wall and CPU seconds (median of
--repeat runs; CPU time is steadier on a shared machine) and where the time goes.

    PYTHONPATH=$PWD .venv/bin/python scripts/figures/bench_open.py [--repeat 3] [extra.gguf ...]

Extra GGUFs (any architecture) are timed as GGUFFile + tokenizer, the vocabulary-bound
part of Engine.open.
"""

from __future__ import annotations

import argparse
import lzma
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np

from ds4d.engine import Engine
from ds4d.engine.default_model import default_model_path
from ds4d.engine.gguf_file import GGUFFile
from ds4d.engine.tokenizer import Tokenizer

VOCAB = Path(__file__).resolve().parents[2] / "tests" / "data" / "vocab"
FIXTURES = {"llama3 128k": "llama3_1", "qwen3 152k": "qwen3", "gpt-oss 201k": "gptoss",
            "gemma3 262k": "gemma3"}  # fmt: skip
E, F, H, L = 64, 128, 4, 2


def llama_with_vocab(vocab_xz: Path, out: Path) -> Path:
    """A 2-layer llama (random Q8_0 weights) with the tokenizer metadata of vocab_xz."""
    plain = out.with_suffix(".vocab.gguf")
    with lzma.open(vocab_xz) as src, plain.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    v = GGUFFile(plain)
    tokens = v.get_array("tokenizer.ggml.tokens").strings()
    n = len(tokens)
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_block_count(L)
    w.add_context_length(256)
    w.add_embedding_length(E)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(H)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n)
    w.add_tokenizer_model(v.get("tokenizer.ggml.model"))
    if v.get("tokenizer.ggml.pre"):
        w.add_tokenizer_pre(v.get("tokenizer.ggml.pre"))
    w.add_token_list(tokens)
    w.add_token_types(v.get_array("tokenizer.ggml.token_type").numpy().tolist())
    if v.get_array("tokenizer.ggml.scores") is not None:
        w.add_token_scores(v.get_array("tokenizer.ggml.scores").numpy().tolist())
    if v.get_array("tokenizer.ggml.merges") is not None:
        w.add_token_merges(v.get_array("tokenizer.ggml.merges").strings())
    for key in ("bos", "eos"):
        if v.get(f"tokenizer.ggml.{key}_token_id") is not None:
            getattr(w, f"add_{key}_token_id")(v.get(f"tokenizer.ggml.{key}_token_id"))
    rng = np.random.default_rng(0)

    def q8(rows: int, cols: int) -> None:
        data = gguf.quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32),
                                    gguf.GGMLQuantizationType.Q8_0)  # fmt: skip
        return data

    w.add_tensor("token_embd.weight", q8(n, E), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("output_norm.weight", np.ones(E, np.float32))
    for il in range(L):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", np.ones(E, np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(E, np.float32))
        for name, rows, cols in (("attn_q", E, E), ("attn_k", E, E), ("attn_v", E, E),
                                 ("attn_output", E, E), ("ffn_gate", F, E), ("ffn_up", F, E),
                                 ("ffn_down", E, F)):  # fmt: skip
            w.add_tensor(p + name + ".weight", q8(rows, cols),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)  # fmt: skip
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    plain.unlink()
    return out


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    walls, cpus = [], []
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        result = fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
        close = getattr(result, "close", None)
        if close is not None:
            close()
    return statistics.median(walls), statistics.median(cpus)


def report(label: str, path: Path, repeat: int, engine: bool) -> None:
    parse = timed(lambda: GGUFFile(path), repeat)
    gf = GGUFFile(path)
    tok = timed(lambda: Tokenizer.from_gguf(gf), repeat)
    line = (f"{label:<22} vocab {gf.get_array('tokenizer.ggml.tokens').count:>6}  "
            f"parse {parse[0]:.3f}/{parse[1]:.3f}  tokenizer {tok[0]:.3f}/{tok[1]:.3f}")  # fmt: skip
    if engine:
        total = timed(lambda: Engine.open(path, threads=1), repeat)
        line += f"  Engine.open {total[0]:.3f}/{total[1]:.3f}"
    print(line + "  (wall/CPU s)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("extra", nargs="*", type=Path)
    args = ap.parse_args()
    report("SmolLM2-135M Q4_1", default_model_path(), args.repeat, engine=True)
    with tempfile.TemporaryDirectory() as tmp:
        for label, name in FIXTURES.items():
            path = llama_with_vocab(VOCAB / f"{name}.gguf.xz", Path(tmp) / f"{name}.gguf")
            report(f"llama + {label}", path, args.repeat, engine=True)
    for path in args.extra:
        report(path.name[:22], path, args.repeat, engine=False)


if __name__ == "__main__":
    main()
