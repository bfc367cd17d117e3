"""A forced tool call (tool_choice "required" or a named tool) in DeepSeek V4's DSML.

ds4 ignores forced tool choices; ds4d honours them as it does for template models: the
markup, the tool name (a choice among the offered ones) and the parameter keys (the
schema's required properties) are forced, and the model only picks the values, from
tokens that keep the block well formed:

    [</think>] (blank line) <｜DSML｜tool_calls>
    <｜DSML｜invoke name="NAME">
    <｜DSML｜parameter name="KEY" string="true">raw text</｜DSML｜parameter>
    <｜DSML｜parameter name="KEY" string="false">JSON</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls>

A string property is written as V4 writes strings (raw text, string="true", no `<`
inside so the closing tag cannot be spelled early; an enum's value chosen among its
options); every other value is JSON (string="false"), built by the same steps as the
Hermes constraint. In thinking mode the call is the whole answer: the reasoning is
closed at once, so the block is parsed as an answer and the generation ends at its end
tag, as any V4 tool call does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ds4d.chat.constrain import (
    MAX_STRING_TOKENS,
    Allow,
    Force,
    Step,
    VocabIndex,
    choose,
    json_value,
    offered_tools,
    required_keys,
)
from ds4d.chat.deepseek4_dsml import DSML, PARAM_END, attr_escape
from ds4d.chat.types import Tool, ToolChoice
from ds4d.engine.ds4_tokenizer import THINK_CLOSE

# What may never appear inside a value: `<` opens every DSML tag.
MARKUP = "<"


class DSMLVocab:
    """The per-model token sets a forced DSML call samples from (built once)."""

    def __init__(self, vocab: VocabIndex) -> None:
        self.json = vocab.with_markup(MARKUP)
        self.raw_text = np.array(
            [i for text, ids in vocab.by_text.items() for i in ids if MARKUP not in text],
            dtype=np.int64,
        )
        self.closers = vocab.prefix_ids([PARAM_END])  # `<`, `</`, ...: the value ends


def forced_dsml_call(
    vocab: DSMLVocab, tools: list[Tool], choice: ToolChoice, *, close_thinking: bool
) -> Step:
    """The whole block; `close_thinking`: the prompt ends inside `<think>`."""
    candidates = offered_tools(tools, choice)
    opening = THINK_CLOSE if close_thinking else ""
    yield Force(f'{opening}\n\n<{DSML}tool_calls>\n<{DSML}invoke name="')
    names = [attr_escape(t.name) + '"' for t in candidates]
    picked = yield from choose(vocab.json, names)
    tool = candidates[names.index(picked)]
    yield Force(">\n")
    schema = tool.parameters if isinstance(tool.parameters, dict) else {}
    props = schema.get("properties") or {}
    for key in required_keys(schema):
        prop = props.get(key)
        options = _raw_options(prop)
        raw = options is not None or _is_plain_string(prop)
        flag = "true" if raw else "false"
        yield Force(f'<{DSML}parameter name="{attr_escape(key)}" string="{flag}">')
        if options is not None:
            yield from choose(vocab.json, [o + PARAM_END for o in options])
        elif raw:
            yield from _raw_text(vocab)
        else:
            yield from json_value(vocab.json, prop or {})
            yield Force(PARAM_END)
        yield Force("\n")
    yield Force(f"</{DSML}invoke>\n</{DSML}tool_calls>")


def _raw_options(schema: Any) -> list[str] | None:
    """A string enum's values, when each reads the same as a raw DSML body."""
    values = schema.get("enum") if isinstance(schema, dict) else None
    if not values or not all(isinstance(v, str) and v and not set(v) & set("<&") for v in values):
        return None
    return [str(v) for v in values]


def _is_plain_string(schema: Any) -> bool:
    return (
        isinstance(schema, dict)
        and schema.get("type") == "string"
        and "enum" not in schema
        and "const" not in schema
    )


def _raw_text(vocab: DSMLVocab) -> Step:
    """A non-empty string="true" body and its closing tag: the model ends the value by
    starting the tag."""
    if not vocab.raw_text.size:
        yield Force(PARAM_END)
        return
    either = np.concatenate([vocab.raw_text, vocab.closers])
    for n in range(MAX_STRING_TOKENS):
        text = yield Allow(vocab.raw_text if n == 0 else either)
        if PARAM_END.startswith(text):
            yield Force(PARAM_END[len(text) :])
            return
    yield Force(PARAM_END)
