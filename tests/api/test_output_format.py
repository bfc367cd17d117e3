"""Structured output requests, protocol by protocol, into the neutral OutputFormat: what
each accepts, and refusals in the protocol's own error (a 400 naming the field)."""

from __future__ import annotations

from typing import Any

import pytest

from ds4d.api import ollama, openai_chat, openai_responses
from ds4d.api.common import ApiError
from ds4d.chat.types import OutputFormat, Sampling

DEFAULTS = Sampling()
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
BAD = {"type": "object", "properties": {"a": {"type": "string", "minLength": 2}}}
MSGS = [{"role": "user", "content": "hi"}]


def ollama_chat(**body: Any) -> OutputFormat | None:
    return ollama.parse_chat(
        {"model": "m", "messages": MSGS, **body}, DEFAULTS
    ).request.output_format


def oai(**body: Any) -> OutputFormat | None:
    return openai_chat.parse({"model": "m", "messages": MSGS, **body}, DEFAULTS).output_format


def responses(**body: Any) -> OutputFormat | None:
    return openai_responses.parse({"model": "m", "input": "hi", **body}, DEFAULTS).output_format


def test_each_protocol_reads_json_and_schemas_alike() -> None:
    for none in (ollama_chat(), ollama_chat(format=""), oai(), responses(),
                 oai(response_format={"type": "text"}),
                 responses(text={"format": {"type": "text"}}), responses(text={})):  # fmt: skip
        assert none is None
    any_object = OutputFormat()
    assert ollama_chat(format="json") == any_object
    assert ollama.parse_generate({"model": "m", "prompt": "p", "format": "json"},
                                 DEFAULTS).request.output_format == any_object  # fmt: skip
    assert oai(response_format={"type": "json_object"}) == any_object
    assert responses(text={"format": {"type": "json_object"}}) == any_object
    schema = OutputFormat(SCHEMA)
    assert ollama_chat(format=SCHEMA) == schema
    js = {"name": "a", "schema": SCHEMA, "strict": True}
    assert oai(response_format={"type": "json_schema", "json_schema": js}) == schema
    assert responses(text={"format": {"type": "json_schema", **js}}) == schema


@pytest.mark.parametrize(
    ("parse", "body", "param", "word"),
    [
        (ollama_chat, {"format": BAD}, "format", "minLength"),
        (ollama_chat, {"format": "yaml"}, "format", "json"),
        (ollama_chat, {"format": 3}, "format", "json"),
        (oai, {"response_format": {"type": "xml"}}, "response_format", "json_schema"),
        (oai, {"response_format": "json"}, "response_format", "object"),
        (oai, {"response_format": {"type": "json_schema"}}, "response_format.json_schema",
         "required"),
        (oai, {"response_format": {"type": "json_schema", "json_schema": {"schema": BAD}}},
         "response_format.json_schema.schema", "minLength"),
        (oai, {"response_format": {"type": "json_schema", "json_schema": {"schema": [1]}}},
         "response_format.json_schema.schema", "schema"),
        (responses, {"text": {"format": {"type": "json_schema", "schema": BAD}}},
         "text.format.schema", "minLength"),
        (responses, {"text": {"format": "json"}}, "text.format", "object"),
    ],
)  # fmt: skip
def test_refusals_name_the_field_and_the_keyword(parse, body, param, word) -> None:
    with pytest.raises(ApiError) as e:
        parse(**body)
    assert e.value.status == 400 and e.value.param == param and word in e.value.message
