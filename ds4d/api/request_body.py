"""A request body as JSON: strict UTF-8, valid Unicode, errors in our own words.

`json.loads` on bytes lets invalid UTF-8 through as lone surrogates, and `"\\ud800"`
escapes decode to them as well; nothing downstream (tokenizer, templates, logs) can
encode such a string, so they are refused here with a 400 naming where they are.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ds4d.api.common import ApiError

# A \uD800-\uDFFF escape: only then can a decoded string hold a lone surrogate.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF][0-9a-fA-F]{2}")


def parse_json_body(data: bytes) -> Any:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(
            400, f"the request body is not valid UTF-8 (bad byte at offset {e.start})"
        ) from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ApiError(
            400, f"invalid JSON in the request body at line {e.lineno} column {e.colno}"
        ) from None
    except RecursionError:
        raise ApiError(400, "invalid JSON in the request body: nested too deeply") from None
    except ValueError:  # an integer literal longer than Python converts
        raise ApiError(400, "invalid JSON in the request body: a number is too long") from None
    if _SURROGATE_ESCAPE.search(text):
        where = _lone_surrogate_at(value, "")
        if where is not None:
            raise ApiError(
                400,
                f"'{where or 'body'}' holds a lone UTF-16 surrogate escape, "
                f"which is not a Unicode character",
                param=where or None,
            )
    return value


def _valid(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _lone_surrogate_at(value: Any, path: str) -> str | None:
    """The path of the first string (or key) that is not valid Unicode, else None."""
    stack = [(value, path)]
    while stack:
        v, p = stack.pop()
        if isinstance(v, str):
            if not _valid(v):
                return p
        elif isinstance(v, dict):
            for k, item in v.items():
                sub = f"{p}.{k}" if p else str(k)
                if not _valid(k):
                    return p or "body"
                stack.append((item, sub))
        elif isinstance(v, list):
            stack.extend((item, f"{p}[{n}]") for n, item in enumerate(v))
    return None
