"""`ds4d bench embed`'s corpus: chunks of ds4d's own source within the token bounds."""

from __future__ import annotations

from pathlib import Path

from ds4d.engine.tokenizer import Tokenizer
from ds4d.tools.bench_embed import MAX_TOKENS, MIN_TOKENS, corpus


def test_corpus_chunks_are_source_lines_of_256_to_512_tokens(model_path: Path) -> None:
    chunks = corpus(model_path, 6)
    tok = Tokenizer.from_gguf(model_path)
    assert len(chunks) == 6 and len(set(chunks)) == 6
    for chunk in chunks:
        assert chunk.endswith("\n")
        n = sum(len(tok.encode(line)) for line in chunk.splitlines(keepends=True))
        assert MIN_TOKENS <= n <= MAX_TOKENS
