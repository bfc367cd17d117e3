"""Debugging dumps of what the engine does with a prompt (`ds4d generate --dump-*`).

`token_table` lists the prompt's token ids with their pieces, as the engine will see them.
`greedy_dump` runs a greedy continuation and returns it as a document in the project's
golden-vector shape (tests/data/vectors/smollm2/*.json, documented in docs/dumps.md):

    {"schema": "golden-logprobs-v1", "reference": "ds4d ...", "model_sha256_prefix": null,
     "id": ..., "chat": bool, "prompt": text, "prompt_tokens": [ids], "top_k": N,
     "steps": [{"step": i, "token": id, "bytes": hex, "logprob": lp,
                "top": [[id, lp], ...]}, ...]}

With logits, each step also carries "logits" (the n_vocab raw logits it was chosen from).
Log-probabilities are log-softmax of the float32 logits computed in float64.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ds4d.engine import native
from ds4d.engine.engine import Engine
from ds4d.engine.tokenizer_api import ModelTokenizer

SCHEMA = "golden-logprobs-v1"


def token_table(tok: ModelTokenizer, ids: Sequence[int]) -> list[dict[str, Any]]:
    """One entry per prompt token: its index, id, vocabulary text, raw bytes (hex) and
    whether it is a special (control) token."""
    return [
        {"index": i, "id": t, "piece": tok.token_text(t), "bytes": tok.token_bytes(t).hex(),
         "special": tok.is_special(t)}
        for i, t in enumerate(ids)
    ]  # fmt: skip


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max()
    out: np.ndarray = x - np.log(np.exp(x).sum())
    return out


def top_logprobs(logprobs: np.ndarray, k: int) -> list[list[float | int]]:
    """The k best [id, logprob] pairs, best first (ties: lower id first)."""
    k = min(k, len(logprobs))
    idx = np.argpartition(-logprobs, k - 1)[:k]
    idx = idx[np.lexsort((idx, -logprobs[idx]))]
    return [[int(i), float(logprobs[i])] for i in idx]


def greedy_dump(engine: Engine, prompt: str, prompt_tokens: Sequence[int], *, max_tokens: int,
                top_k: int, chat: bool, case_id: str, n_ctx: int, producer: str,
                with_logits: bool = False, stop_at_eog: bool = True) -> dict[str, Any]:  # fmt: skip
    """Greedy continuation of prompt_tokens: at most max_tokens steps, ending after an
    end-of-generation token when stop_at_eog (the step that chose it is kept). `producer`
    (e.g. "ds4d 0.1.0") starts the document's `reference`."""
    if top_k < 1:
        raise ValueError("top_k must be at least 1")
    tok = engine.tokenizer
    steps: list[dict[str, Any]] = []
    with engine.new_session(n_ctx) as session:
        session.eval(prompt_tokens)
        for i in range(max_tokens):
            logits = session.compute_logits()
            lp = log_softmax(logits)
            token = int(np.argmax(logits))
            step: dict[str, Any] = {
                "step": i, "token": token, "bytes": tok.token_bytes(token).hex(),
                "logprob": float(lp[token]), "top": top_logprobs(lp, top_k),
            }  # fmt: skip
            if with_logits:
                step["logits"] = [float(v) for v in logits]
            steps.append(step)
            if (stop_at_eog and token in tok.eog_ids) or i == max_tokens - 1:
                break
            session.eval([token])
    return {
        "schema": SCHEMA,
        "reference": f"{producer} ({engine.info.family}, {engine.info.quant}, "
        f"{native.SIMD_NAMES.get(native.simd_level(), '?')}, {engine.threads} threads)",
        "model_sha256_prefix": None,
        "id": case_id,
        "chat": chat,
        "prompt": prompt,
        "prompt_tokens": [int(t) for t in prompt_tokens],
        "top_k": top_k,
        "steps": steps,
    }
