"""Structured output requests in each protocol's shape, read into the neutral
`OutputFormat` (ds4d.chat.structured writes the answer): Ollama's `format`, OpenAI
chat's `response_format`, the Responses API's `text.format`. A schema using what the
constraint cannot honour is refused with the keyword's name."""

from __future__ import annotations

from typing import Any

from ds4d.api.common import bad, field_of
from ds4d.chat.structured import unsupported
from ds4d.chat.types import OutputFormat


def schema_format(schema: Any, param: str) -> OutputFormat:
    """A JSON schema, checked."""
    if not isinstance(schema, dict):
        raise bad(f"'{param}' must be a JSON schema object", param)
    why = unsupported(schema)
    if why is not None:
        raise bad(f"'{param}': {why}", param)
    return OutputFormat(schema)


def ollama_format(body: dict[str, Any]) -> OutputFormat | None:
    """Ollama's `format`: "json" (any JSON object) or a JSON schema."""
    fmt = body.get("format")
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return OutputFormat()
    if isinstance(fmt, dict):
        return schema_format(fmt, "format")
    raise bad("'format' must be \"json\" or a JSON schema object", "format")


def _typed_format(value: dict[str, Any], param: str, schema_at: str | None) -> OutputFormat | None:
    """`{"type": "text" | "json_object" | "json_schema", ...}`; the schema is under
    `schema_at` (chat's `json_schema` object) or beside the type (Responses)."""
    kind = field_of(value, "type", str, where=param, required=True)
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputFormat()
    if kind != "json_schema":
        raise bad(f"'{param}.type' must be 'text', 'json_object' or 'json_schema'", param)
    holder = value
    where = param
    if schema_at is not None:
        holder = field_of(value, schema_at, dict, where=param, required=True)
        where = f"{param}.{schema_at}"
    field_of(holder, "name", str, None, where=where)
    field_of(holder, "strict", bool, None, where=where)  # always strict: constrained
    if holder.get("schema") is None:
        return OutputFormat()
    return schema_format(holder["schema"], f"{where}.schema")


def openai_response_format(body: dict[str, Any]) -> OutputFormat | None:
    """OpenAI chat completions' `response_format`."""
    value = field_of(body, "response_format", dict, None)
    if value is None:
        return None
    return _typed_format(value, "response_format", "json_schema")


def responses_text_format(body: dict[str, Any]) -> OutputFormat | None:
    """The Responses API's `text.format`."""
    text = field_of(body, "text", dict, None)
    if text is None:
        return None
    value = field_of(text, "format", dict, None, where="text")
    if value is None:
        return None
    return _typed_format(value, "text.format", None)
