"""Rendering a GGUF's ``tokenizer.chat_template`` the way Hugging Face transformers does.

Same sandbox and whitespace rules (ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, loop controls), same context (messages, tools, add_generation_prompt,
bos_token, eos_token, plus any extra keyword), same helpers (raise_exception,
strftime_now, a tojson that keeps non-ASCII text and accepts indent), so a template
written for transformers renders here byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class TemplateError(ValueError):
    """The chat template cannot be compiled, or failed (or refused) to render."""


class _RaisedByTemplate(Exception):
    """raise_exception() called by the template itself."""


def _raise_exception(message: str) -> None:
    raise _RaisedByTemplate(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Unlike jinja's own tojson: no HTML escaping, non-ASCII kept, key order kept.
    return json.dumps(
        value,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=separators,
        sort_keys=sort_keys,
    )


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (transformers' assistant-mask marker):
    accepted, and rendered as its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationTag],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = _environment()


class ChatTemplate:
    """A compiled chat template; ``render`` is safe to call from any thread."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _ENV.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(
                f"chat template does not compile: {exc.message} (line {exc.lineno})"
            ) from None

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **extra: Any,
    ) -> str:
        context = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **extra,
            "messages": messages,
            "tools": tools,
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            return self._template.render(context)
        except _RaisedByTemplate as exc:
            raise TemplateError(f"chat template refused the conversation: {exc}") from None
        except jinja2.TemplateError as exc:  # includes the sandbox's SecurityError
            raise TemplateError(f"chat template failed: {exc}") from None
        except (
            TypeError,
            ValueError,
            KeyError,
            IndexError,
            AttributeError,
            ZeroDivisionError,
        ) as exc:
            raise TemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from None
