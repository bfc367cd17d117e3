"""The embedding path: token lists -> one pooled, L2-normalised vector each.

A forward pass over throwaway states (float32 KV sized to each input, freed at once: an
embedding never holds a chat slot, its prefix or a checkpoint) returns every position's
final hidden state (`EmbeddingModel.embed_batch`); the model's pooling turns them into one
vector:

  mean  the average of every position (BERT-style sentence encoders: all-MiniLM, bge);
  cls   the first position (bge's [CLS]);
  last  the last position (Qwen3-Embedding: causal, so the last token has read all of it).

The pooling comes from the GGUF's `<arch>.pooling_type` (llama.cpp's numbers, written by
its converter from the sentence-transformers Pooling module), or an override (`--pooling`)
for a model that declares none. A reranker's `rank` pooling (a classifier head) is refused.
A model with projections after its pooling (EmbeddingGemma's sentence-transformers Dense
layers, when its GGUF carries them) applies them to the pooled vector, as llama.cpp does.
Vectors are L2-normalised, as the sentence-transformers Normalize module of these models,
llama.cpp's server and Ollama do.

Inputs are grouped into forward calls of up to `max_batch` sequences and
`EMBED_CALL_ROWS` rows (a longer input has a call of its own). Every row of a call is
computed as its sequence alone computes it (ds4n_dec_model_embed), so a vector does not
depend on what it was batched with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ds4d.engine.errors import EngineError, ModelLoadError
from ds4d.engine.family import EmbeddingModel, FamilyModel
from ds4d.engine.gguf_file import GGUFFile

POOLINGS = ("mean", "cls", "last")
# llama.cpp's enum llama_pooling_type, as GGUF files store it.
_GGUF_POOLING = {0: None, 1: "mean", 2: "cls", 3: "last", 4: "rank"}

# Rows (tokens, all inputs together) per forward call: prefill-sized calls keep the matrix
# kernels at full speed while the activations stay a few MB for a small model.
EMBED_CALL_ROWS = 2048


@dataclass(frozen=True)
class EmbeddingConfig:
    """How a model embeds: its pooling (None: it cannot, nobody said how), whether the
    file itself declares one (an embedding model), and whether its inputs end with EOS."""

    pooling: str | None
    declared: bool
    add_eos: bool  # an input ends with end_id (EOS, or a WordPiece vocabulary's [SEP])
    add_bos: bool
    end_id: int | None = None


def declared_pooling(gf: GGUFFile) -> str | None:
    """The pooling the GGUF declares (`<arch>.pooling_type`), None when it declares none;
    ModelLoadError for a reranker (rank) or a number llama.cpp does not define."""
    raw = gf.get(f"{gf.architecture}.pooling_type", None)
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or raw not in _GGUF_POOLING:
        raise ModelLoadError(f"{gf.architecture}.pooling_type {raw!r} is not a pooling type")
    name = _GGUF_POOLING[raw]
    if name == "rank":
        raise ModelLoadError("rank pooling (a reranker's classifier head) is not supported")
    return name


def embedding_config(
    gf: GGUFFile,
    override: str = "",
    add_bos: bool = False,
    eos_id: int | None = None,
    n_vocab: int = 0,
) -> EmbeddingConfig:
    """The model's embedding config: the file's pooling unless `override` names one, and
    the token an input ends with as llama.cpp's tokenizer adds it: a WordPiece (`bert`)
    vocabulary always closes with its separator ([SEP]), another with its EOS when
    `tokenizer.ggml.add_eos_token` says so."""
    if override and override not in POOLINGS:
        raise EngineError(f"unknown pooling {override!r} (known: {', '.join(POOLINGS)})")
    declared = declared_pooling(gf)
    end_id = eos_id if gf.get("tokenizer.ggml.add_eos_token", False) is True else None
    if gf.get("tokenizer.ggml.model", None) == "bert":
        sep = gf.get("tokenizer.ggml.seperator_token_id", 102)
        if not isinstance(sep, int) or isinstance(sep, bool) or not 0 <= sep < n_vocab:
            raise ModelLoadError(f"tokenizer.ggml.seperator_token_id {sep!r} is not a token")
        end_id = sep
    return EmbeddingConfig(override or declared, declared is not None, end_id is not None,
                           add_bos, end_id)  # fmt: skip


def pool(hidden: np.ndarray, pooling: str) -> np.ndarray:
    """One vector (float32) from a sequence's hidden states (n x n_embd), before
    normalisation. The mean is summed in float64 so its rounding does not grow with n."""
    out: np.ndarray
    if pooling == "mean":
        out = (hidden.astype(np.float64).sum(axis=0) / len(hidden)).astype(np.float32)
    elif pooling == "cls":
        out = hidden[0].copy()
    elif pooling == "last":
        out = hidden[-1].copy()
    else:
        raise EngineError(f"unknown pooling {pooling!r}")
    return out


def l2_normalize(v: np.ndarray) -> np.ndarray:
    """v / |v| (float32, the norm in float64); a zero vector stays zero."""
    norm = float(np.sqrt(np.dot(v.astype(np.float64), v.astype(np.float64))))
    return (v / norm).astype(np.float32) if norm > 0 else v.astype(np.float32)


def plan_calls(lengths: Sequence[int], max_batch: int, max_rows: int) -> list[list[int]]:
    """Indexes of the inputs, in order, grouped into forward calls of at most max_batch
    inputs and max_rows rows (an input longer than max_rows alone)."""
    calls: list[list[int]] = []
    rows = 0
    for i, n in enumerate(lengths):
        if calls and len(calls[-1]) < max_batch and rows + n <= max_rows:
            calls[-1].append(i)
            rows += n
        else:
            calls.append([i])
            rows = n
    return calls


def embed_tokens(
    model: FamilyModel,
    token_lists: Sequence[Sequence[int]],
    pooling: str,
    *,
    max_rows: int = EMBED_CALL_ROWS,
    max_batch: int | None = None,
) -> np.ndarray:
    """The pooled, L2-normalised vectors (len(token_lists) x n_embd float32) of the
    inputs (each non-empty, ids checked by the native call). Calls must not overlap other
    forward calls of the model (the engine's lock serialises them)."""
    if not isinstance(model, EmbeddingModel):
        raise EngineError("this model family has no embedding path")
    if pooling not in POOLINGS:
        raise EngineError(f"unknown pooling {pooling!r}")
    arrays = [np.ascontiguousarray(np.asarray(t, dtype=np.int64)) for t in token_lists]
    for a in arrays:
        if a.ndim != 1 or not len(a):
            raise EngineError("an embedding input has no tokens")
        if a.min() < 0 or a.max() >= model.n_vocab:
            bad = int(a[(a < 0) | (a >= model.n_vocab)][0])
            raise EngineError(f"token id {bad} is outside the vocabulary (0..{model.n_vocab - 1})")
    toks = [a.astype(np.int32) for a in arrays]
    out = np.empty((len(toks), model.n_embd), np.float32)
    batch = min(max_batch or model.max_batch, model.max_batch)
    for call in plan_calls([len(t) for t in toks], batch, max_rows):
        group = [toks[i] for i in call]
        states = [model.new_state(len(t), "f32") for t in group]
        try:
            hidden = np.empty((sum(len(t) for t in group), model.n_embd), np.float32)
            model.embed_batch(states, group, hidden)
        finally:
            for s in states:
                s.close()
        row = 0
        for i, t in zip(call, group, strict=True):
            pooled = pool(hidden[row : row + len(t)], pooling)
            out[i] = l2_normalize(model.project_pooled(pooled))
            row += len(t)
    return out
