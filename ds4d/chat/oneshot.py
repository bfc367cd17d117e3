"""The prompt of a one-shot question (`ds4d generate`, `steer build`, `eval`): one user
message (and an optional system message) rendered with the model's own chat template, or
the text as is, tokenized as the engine evaluates it (BOS added when the model wants one).
"""

from __future__ import annotations

from ds4d.chat.template import ChatTemplate
from ds4d.engine.engine import Engine


def one_shot_prompt(engine: Engine, user: str, system: str | None = None,
                    raw: bool = False) -> tuple[str, list[int]]:  # fmt: skip
    """(text, token ids); TemplateError when the model's template fails. A model without
    a template, or raw, gets the text as is (control tokens in it then stay plain text)."""
    tok = engine.tokenizer
    templated = not raw and bool(engine.chat_template)
    if not templated:
        text = user
    else:
        assert engine.chat_template is not None
        messages = [{"role": "user", "content": user}]
        if system:
            messages.insert(0, {"role": "system", "content": system})
        bos = tok.token_text(tok.bos_id) if tok.bos_id is not None else ""
        eos = tok.token_text(tok.eos_id) if tok.eos_id is not None else ""
        text = ChatTemplate(engine.chat_template, bos, eos).render(messages)
    ids = tok.encode(text, special=templated)
    if tok.add_bos and tok.bos_id is not None and (not ids or ids[0] != tok.bos_id):
        ids.insert(0, tok.bos_id)
    return text, ids
