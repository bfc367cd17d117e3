"""Rendering a GGUF's ``tokenizer.chat_template`` the way Hugging Face transformers does.

Same sandbox and whitespace rules (ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, loop controls, the ``{% generation %}`` tag), same context (messages,
tools, documents, add_generation_prompt, the special tokens, plus any extra keyword),
same helpers (raise_exception, strftime_now, a ``dict`` constructor, a ``namespace``
that refuses underscore names, a tojson that keeps non-ASCII text and accepts indent,
separators and sort_keys), so a template written for transformers renders here byte for
byte. Whatever goes wrong, compiling or rendering, is one `TemplateError` line.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace


class TemplateError(ValueError):
    """The chat template cannot be compiled, or failed (or refused) to render."""


class _RaisedByTemplate(Exception):
    """raise_exception() called by the template itself."""


def _raise_exception(message: str) -> None:
    raise _RaisedByTemplate(message)


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


class _DictConstructor:
    """``dict(...)`` for templates, without exposing the ``dict`` type itself (whose
    attributes a template could otherwise walk)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(Namespace):
    """jinja's namespace, refusing underscore-prefixed names (a way to reach interpreter
    internals through attribute assignment)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - jinja's signature trick
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"a chat template cannot set the underscore-prefixed attribute {name!r}"
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
    env.globals["dict"] = _DictConstructor()
    env.globals["namespace"] = _TemplateNamespace
    return env


_ENV = _environment()


class ChatTemplate:
    """A compiled chat template; ``render`` is safe to call from any thread.

    `clock` gives the time ``strftime_now`` formats (templates print today's date);
    tests fix it, serving uses the wall clock.
    """

    def __init__(
        self,
        source: str,
        bos_token: str = "",
        eos_token: str = "",
        *,
        clock: Callable[[], datetime] = datetime.now,
    ) -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._clock = clock
        try:
            ast = _ENV.parse(source)
            self._template = _ENV.from_string(ast)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(
                f"chat template does not compile: {exc.message} (line {exc.lineno})"
            ) from None
        # The names the template reads from its context (messages, tools,
        # enable_thinking, reasoning_effort, ...): which options it understands.
        self.variables = frozenset(jinja2.meta.find_undeclared_variables(ast))

    def _strftime_now(self, fmt: str) -> str:
        return self._clock().strftime(fmt)

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
            "strftime_now": self._strftime_now,
            **extra,
            "messages": messages,
            "tools": tools,
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            return self._template.render(context)
        except _RaisedByTemplate as exc:
            raise TemplateError(f"chat template refused the conversation: {exc}") from None
        except jinja2.TemplateError as exc:  # includes the sandbox's SecurityError
            raise TemplateError(f"chat template failed: {_one_line(exc)}") from None
        except (
            TypeError,
            ValueError,
            KeyError,
            IndexError,
            AttributeError,
            ZeroDivisionError,
            OverflowError,
            RecursionError,
        ) as exc:
            raise TemplateError(
                f"chat template failed: {type(exc).__name__}: {_one_line(exc)}"
            ) from None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
