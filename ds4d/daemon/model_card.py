"""What a model file says about itself, for listings (/api/tags, /api/show, /api/ps):
architecture, size, quantization, the GGUF's metadata, its chat template, and what it can
do. Read from the GGUF's header (blocking: run it on a worker), whether or not the model
is loaded, and cached per file (path, size, mtime).
"""

from __future__ import annotations

import hashlib
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ds4d.chat.render import template_supports_tools
from ds4d.engine.embedding import declared_pooling
from ds4d.engine.errors import ModelLoadError
from ds4d.engine.fim import find_fim_tokens
from ds4d.engine.gguf_file import GGUFFile

# Metadata values longer than this (the vocabulary, merges) are listed empty, as Ollama
# does unless asked for a verbose listing.
_MAX_ARRAY = 64


@dataclass(frozen=True)
class ModelCard:
    path: str
    architecture: str
    name: str
    quant: str
    file_bytes: int
    parameters: int
    context_length: int
    chat_template: str
    fim: tuple[str, str, str] | None  # the FIM tokens its vocabulary holds
    embedding: bool  # the file declares a pooling: a model made to embed, not to generate
    metadata: dict[str, Any]
    digest: str  # stands for the file (path, size, mtime): Ollama clients key on it
    modified: float  # the file's mtime

    @property
    def capabilities(self) -> list[str]:
        """What the model really has. An embedding model (its file declares a pooling, as
        Ollama decides it): `embedding` alone, since the generation routes refuse it.
        Another: `completion`; `tools` when its template renders tools; `thinking` when the
        template has a thinking switch or block; `insert` when its vocabulary has
        fill-in-the-middle tokens."""
        if self.embedding:
            return ["embedding"]
        caps = ["completion"]
        template = self.chat_template
        if template_supports_tools(template):
            caps.append("tools")
        if (
            "enable_thinking" in template
            or "reasoning_effort" in template
            or ("<think>" in template)
        ):
            caps.append("thinking")
        if self.fim is not None:
            caps.append("insert")
        return caps

    @property
    def parameter_size(self) -> str:
        """Ollama's spelling: "1.5B", "135M"."""
        n = self.parameters
        if n >= 10**9:
            return f"{n / 10**9:.1f}B"
        if n >= 10**6:
            return f"{n / 10**6:.0f}M"
        return f"{n / 10**3:.0f}K"

    @property
    def details(self) -> dict[str, Any]:
        return {
            "parent_model": "",
            "format": "gguf",
            "family": self.architecture,
            "families": [self.architecture],
            "parameter_size": self.parameter_size,
            "quantization_level": self.quant,
        }


def _plain(value: Any) -> Any:
    if isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value] if len(value) <= _MAX_ARRAY else []
    return None


class _TokenList:
    """A GGUF's token texts as `find_fim_tokens` looks them up."""

    def __init__(self, tokens: list[Any]) -> None:
        self.n_vocab = len(tokens)
        self._ids = {t: i for i, t in enumerate(tokens) if isinstance(t, str)}

    def token_to_id(self, text: str) -> int | None:
        return self._ids.get(text)


def read_card(path: Path) -> ModelCard:
    """The card of the GGUF at `path` (blocking)."""
    gf = GGUFFile(path, "mmap")
    arch = gf.architecture
    stat = path.stat()
    metadata = {
        key: _plain(gf.get(key))
        for key in gf.keys()
        if key != "tokenizer.chat_template"
    }  # fmt: skip
    params = sum(math.prod(t.shape) for t in gf.index.tensors)
    fim = None
    tokens = gf.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list):
        # the engine's own lookup (metadata ids, else the families' spellings), on the
        # file's token list: the card says "insert" exactly where /infill works
        found = find_fim_tokens(gf.get, _TokenList(tokens))
        if found.pre is not None and found.suf is not None and found.mid is not None:
            fim = (str(tokens[found.pre]), str(tokens[found.suf]), str(tokens[found.mid]))
    try:  # the engine's own reading: what it embeds with is what the card says
        embedding = declared_pooling(gf) is not None
    except ModelLoadError:  # a reranker's pooling, or none llama.cpp defines: not loadable
        embedding = False
    ctx = gf.get(f"{arch}.context_length")
    digest = hashlib.sha256(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()
    return ModelCard(
        path=str(path),
        architecture=arch,
        name=gf.name,
        quant=gf.file_type_name,
        file_bytes=gf.file_bytes,
        parameters=int(params),
        context_length=int(ctx) if isinstance(ctx, int) else 0,
        chat_template=gf.chat_template or "",
        fim=fim,
        embedding=embedding,
        metadata=metadata,
        digest=digest,
        modified=stat.st_mtime,
    )


class CardCache:
    """Cards by file, read again when the file changes (thread-safe: read on workers)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cards: dict[tuple[str, int, int], ModelCard] = {}

    def get(self, path: Path) -> ModelCard:
        stat = path.stat()
        key = (str(path), stat.st_size, stat.st_mtime_ns)
        with self._lock:
            card = self._cards.get(key)
        if card is None:
            card = read_card(path)
            with self._lock:
                self._cards[key] = card
        return card
