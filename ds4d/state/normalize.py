"""Agent-client normalisation of prompt text before rendering (docs/kv-cache-format.md, "prompt normalisation").

Claude Code starts its system prompt with a line like

    x-anthropic-billing-header: cc_version=2.1.197.a3f; cc_entrypoint=cli; cch=5be2c;

for Anthropic's billing. `cch` changes on every request and the `cc_version` suffix per
conversation, and the line sits at the very start of the prompt: left in, no two
requests would share a cached prefix. It means nothing to a local model, so the whole
line is dropped. Switchable (config `normalize_claude_billing_header`, on by default).
"""

from __future__ import annotations

import re

_BILLING_LINE = re.compile(
    r"^[ \t]*x-anthropic-billing-header:[^\n]*(?:\n|\Z)", re.IGNORECASE | re.MULTILINE
)


def strip_billing_header(text: str) -> str:
    """`text` without any Claude Code billing-header line."""
    if "billing-header" not in text.lower():  # the common case costs one scan
        return text
    return _BILLING_LINE.sub("", text)


def normalize_system_blocks(blocks: list[str]) -> list[str]:
    """Normalise each system text block; blocks left empty are dropped entirely so no
    stray separator is rendered in their place."""
    out = []
    for block in blocks:
        cleaned = strip_billing_header(block)
        if cleaned.strip() or not block.strip():
            out.append(cleaned)
    return out
