"""The model engine: GGUF reading, model families, tokenizer, sampler, sessions.

The narrow API everything above depends on (docs/architecture.md places it):

    engine = Engine.open(path, threads=N)      # mmap GGUF, pick family, build tokenizer
    engine.info                                # family, name, n_vocab, n_ctx_train, ...
    engine.tokenizer.encode(text, special=True) / decode(ids) / token_bytes(id)
    engine.chat_template                       # the GGUF's jinja template or None
    session = engine.new_session(n_ctx)
    session.eval(tokens, on_chunk=None)        # prefill in chunks / decode one token
    session.tokens, session.compute_logits()   # held tokens; next-token logits (float32)
    session.rewind(n); session.save(fp); session.load(fp)
    sample(logits, SamplingParams(...), rng) -> token id

Knows nothing of HTTP, slots or disk caches.
"""

from ds4d.engine.errors import ContextFullError, EngineError, ModelLoadError

__all__ = ["ContextFullError", "EngineError", "ModelLoadError"]

try:  # filled in as the modules land; the API names above are the contract
    from ds4d.engine.engine import Engine, EngineInfo, Session  # noqa: F401
    from ds4d.engine.sampler import SamplingParams, sample  # noqa: F401

    __all__ += ["Engine", "EngineInfo", "Session", "SamplingParams", "sample"]
except ImportError:  # pragma: no cover - only while the engine is being built
    pass
