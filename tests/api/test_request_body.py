"""Request bodies and sampling fields, checked before anything runs: invalid UTF-8, lone
surrogates and sampler-rejected values are 400s in our own words, in every API."""

from __future__ import annotations

import pytest

from ds4d.api import anthropic_messages, openai_chat, openai_completions, openai_responses
from ds4d.api.common import ApiError
from ds4d.api.request_body import parse_json_body
from ds4d.chat.types import Sampling
from ds4d.engine.sampler import SamplingParams

# Python's own wording for exceptions and codec failures: never in an error body.
LEAKS = ("Error", "Traceback", "codec", "can't decode", "TextInputSequence", "Expecting", "char ")


def _refused(data: bytes) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse_json_body(data)
    assert info.value.status == 400
    assert not any(word in info.value.message for word in LEAKS), info.value.message
    return info.value


def test_a_lone_surrogate_escape_is_refused_naming_where_it_is():
    err = _refused(b'{"messages":[{"role":"user","content":"a\\ud800b"}]}')
    assert err.param == "messages[0].content"
    _refused(b'{"x\\udfff": 1}')


def test_a_surrogate_pair_is_a_character_and_accepted():
    assert parse_json_body(b'{"content":"\\ud83d\\ude00"}') == {"content": "\U0001f600"}


@pytest.mark.parametrize("data", [b'{"content":"\xed\xa0\x80"}', b'{"a":"\xff"}', b'{"a":"\xc3"}'])
def test_invalid_utf8_is_refused(data):
    assert "UTF-8" in _refused(data).message


@pytest.mark.parametrize(
    "data",
    [b"", b"{", b"[1,]", b'{"a": tru}', b"\x00", b"[" * 100_000 + b"]" * 100_000, b"1" * 5000],
)
def test_malformed_json_is_refused_in_our_words(data):
    assert "JSON" in _refused(data).message


PARSERS = {
    "chat": (openai_chat.parse, {"messages": [{"role": "user", "content": "hi"}]}),
    "completions": (openai_completions.parse, {"prompt": "hi"}),
    "responses": (openai_responses.parse, {"input": "hi"}),
    "messages": (
        anthropic_messages.parse,
        {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
    ),
}
BAD_SAMPLING = [
    ("top_p", 0),
    ("top_p", -0.5),
    ("top_p", 1.5),
    ("seed", -1),
    ("seed", 1 << 64),
    ("seed", 1.5),
    ("temperature", -1),
    ("temperature", float("nan")),
    ("top_k", -1),
    ("min_p", 2),
    ("min_p", float("inf")),
    ("top_k", True),
]


@pytest.mark.parametrize("api", PARSERS)
@pytest.mark.parametrize(("key", "value"), BAD_SAMPLING)
def test_bad_sampling_values_are_400s_naming_the_field(api, key, value):
    parse, body = PARSERS[api]
    with pytest.raises(ApiError) as info:
        parse({**body, key: value}, Sampling())
    assert info.value.status == 400 and info.value.param == key
    assert key in info.value.message


@pytest.mark.parametrize("api", PARSERS)
def test_accepted_sampling_values_are_accepted_by_the_sampler(api):
    parse, body = PARSERS[api]
    for extra in (
        {"top_p": 1e-9, "seed": 0},
        {"top_p": 1, "seed": (1 << 64) - 1},
        {"temperature": 0, "top_k": 0, "min_p": 0},
        {"min_p": 1, "top_k": 1 << 31},
    ):
        s = parse({**body, **extra}, Sampling()).sampling
        SamplingParams(
            temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p, seed=s.seed
        )


USER = [{"role": "user", "content": "x"}]


@pytest.mark.parametrize(
    "api,body,message,param",
    [
        (openai_chat, {"messages": USER, "tools": {}}, "'tools' must be an array", "tools"),
        (openai_chat, {"messages": USER, "tools": [1]}, "'tools[0]' must be an object", "tools"),
        (openai_chat, {"messages": [*USER, "x"]}, "'messages[1]' must be an object", "messages"),
        (openai_chat, {"messages": []}, "'messages' must not be empty", "messages"),
        (openai_chat, {"messages": "hi"}, "'messages' must be an array", "messages"),
        (openai_chat, None, "the request body must be a JSON object", None),
        (openai_completions, [], "the request body must be a JSON object", None),
        (openai_responses, {"input": "x", "tools": "ls"}, "'tools' must be an array", "tools"),
        (openai_responses, {"input": "x", "tools": [None]}, "'tools[0]' must be an object",
         "tools"),
        (openai_responses, [], "the request body must be a JSON object", None),
        (anthropic_messages, {"max_tokens": 5, "messages": {}}, "'messages' must be an array",
         None),
        (anthropic_messages, {"max_tokens": 5, "messages": []}, "'messages' must not be empty",
         None),
        (anthropic_messages, {"max_tokens": 5, "messages": [3]},
         "'messages[0]' must be an object", None),
        (anthropic_messages, {"max_tokens": 5, "messages": USER, "tools": 1},
         "'tools' must be an array", None),
        (anthropic_messages, {"max_tokens": 5, "messages": USER, "tools": ["x"]},
         "'tools[0]' must be an object", None),
        (anthropic_messages, "x", "the request body must be a JSON object", None),
    ],
)  # fmt: skip
def test_arrays_of_objects_are_checked_item_by_item(api, body, message, param) -> None:
    """The body, and the arrays of messages and tools, in each API's own error shape: the
    message names the field and the item, OpenAI's param names the field."""
    with pytest.raises(ApiError) as info:
        api.parse(body, Sampling())
    assert (info.value.status, info.value.message, info.value.param) == (400, message, param)
