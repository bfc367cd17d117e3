"""The embedded question set of `ds4d eval` and its answer extractors.

Questions small models can answer: arithmetic, reading short Python, well-known facts,
and calling a declared tool in the model's own tool-call format. Each question names its
extractor, which turns the reply into the answer compared with the expected one:

    number  the number the reply gives: after "answer is" / the last "=" when present,
            else the first number (commas in thousands allowed)
    word    the expected word (or any of its `|` alternatives) as a whole word in the
            reply's first 200 characters, case-insensitive
    output  the program output: the reply's first non-empty line, code fences and
            quotes stripped, equal to the expected text
    tool    the first tool call: its name, and each expected argument equal (strings
            case-insensitive)

`self_test()` checks the extractors on written examples (`ds4d eval --self-test`)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ds4d.chat.types import Tool

WEATHER = Tool(
    name="get_weather",
    description="Get the current weather for a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}},
                "required": ["city"]},
)  # fmt: skip
ADD = Tool(
    name="add_numbers",
    description="Add two integers and return the sum.",
    parameters={"type": "object", "properties": {"a": {"type": "integer"},
                "b": {"type": "integer"}}, "required": ["a", "b"]},
)  # fmt: skip


@dataclass(frozen=True)
class Question:
    id: str
    kind: str  # arithmetic | code | facts | tools
    prompt: str
    expected: str  # for `tool`: JSON {"name": ..., "arguments": {...}}
    extractor: str
    tools: tuple[Tool, ...] = field(default=())


JUST_NUMBER = " Answer with just the number."
CODE = "What does this Python code print? Answer with just the output.\n```python\n{}\n```"

QUESTIONS: tuple[Question, ...] = (
    Question("add", "arithmetic", "What is 7 + 5?" + JUST_NUMBER, "12", "number"),
    Question("sub", "arithmetic", "What is 20 - 8?" + JUST_NUMBER, "12", "number"),
    Question("mul", "arithmetic", "What is 6 times 7?" + JUST_NUMBER, "42", "number"),
    Question("div", "arithmetic", "What is 100 divided by 4?" + JUST_NUMBER, "25", "number"),
    Question("double", "arithmetic", "What is double 15?" + JUST_NUMBER, "30", "number"),
    Question("sum3", "arithmetic", "What is 10 + 20 + 30?" + JUST_NUMBER, "60", "number"),
    Question("print-sum", "code", CODE.format("print(2 + 3)"), "5", "output"),
    Question("print-len", "code", CODE.format("x = [1, 2, 3]\nprint(len(x))"), "3", "output"),
    Question("print-upper", "code", CODE.format('print("hi".upper())'), "HI", "output"),
    Question("print-index", "code", CODE.format('s = "cat"\nprint(s[0])'), "c", "output"),
    Question("print-max", "code", CODE.format("print(max(4, 9, 2))"), "9", "output"),
    Question("print-loop", "code", CODE.format("n = 0\nfor i in range(3):\n    n += 2\nprint(n)"),
             "6", "output"),  # fmt: skip
    Question("france", "facts", "What is the capital of France?", "Paris", "word"),
    Question("japan", "facts", "What is the capital of Japan?", "Tokyo", "word"),
    Question("week", "facts", "How many days are in a week?", "7|seven", "word"),
    Question("sky", "facts", "What color is the sky on a clear day?", "blue", "word"),
    Question("water", "facts", "What is the chemical formula of water?", "H2O", "word"),
    Question("planet", "facts", "Which planet do we live on?", "Earth", "word"),
    Question("weather-paris", "tools", "What is the weather in Paris right now?",
             '{"name": "get_weather", "arguments": {"city": "Paris"}}', "tool", (WEATHER,)),
    Question("weather-rome", "tools", "Use the tool to get the weather in Rome.",
             '{"name": "get_weather", "arguments": {"city": "Rome"}}', "tool", (WEATHER,)),
    Question("add-tool", "tools", "Use the add_numbers tool to add 3 and 4.",
             '{"name": "add_numbers", "arguments": {"a": 3, "b": 4}}', "tool", (ADD,)),
    Question("weather-choice", "tools", "Is it raining in London? Check with a tool.",
             '{"name": "get_weather", "arguments": {"city": "London"}}', "tool",
             (ADD, WEATHER)),
)  # fmt: skip

KINDS = ("arithmetic", "code", "facts", "tools")

_NUMBER = r"-?\d[\d,]*(?:\.\d+)?"


def _norm_number(text: str) -> str:
    text = text.replace(",", "")
    return text[:-2] if text.endswith(".0") else text


def extract_number(reply: str) -> str | None:
    m = re.search(r"answer is\s*:?\s*\**\s*(" + _NUMBER + ")", reply, re.IGNORECASE)
    if m:
        return _norm_number(m.group(1))
    if "=" in reply:
        after = re.search(_NUMBER, reply[reply.rindex("=") + 1 :])
        if after:
            return _norm_number(after.group(0))
    m = re.search(_NUMBER, reply)
    return _norm_number(m.group(0)) if m else None


def extract_output(reply: str) -> str | None:
    for line in reply.splitlines():
        line = line.strip().strip("`").strip()
        if line.lower() in ("", "python", "output:", "text"):
            continue
        line = re.sub(r"^(the )?output( is)?:?\s*", "", line, flags=re.IGNORECASE)
        return line.strip().strip("`'\".").strip()
    return None


def word_found(reply: str, expected: str) -> bool:
    head = reply[:200]
    return any(re.search(r"\b" + re.escape(w) + r"\b", head, re.IGNORECASE)
               for w in expected.split("|"))  # fmt: skip


def tool_matches(calls: list[tuple[str, str]], expected: str) -> bool:
    want = json.loads(expected)
    if not calls:
        return False
    name, arguments = calls[0]
    try:
        args: Any = json.loads(arguments)
    except ValueError:
        return False
    if name != want["name"] or not isinstance(args, dict):
        return False
    for key, value in want["arguments"].items():
        got = args.get(key)
        if isinstance(value, str):
            if not isinstance(got, str) or got.strip().lower() != value.lower():
                return False
        elif str(got) != str(value):
            return False
    return True


def judge(q: Question, text: str, calls: list[tuple[str, str]]) -> tuple[bool, str]:
    """(correct, the answer as extracted) for a reply's text and tool calls."""
    if q.extractor == "number":
        got = extract_number(text)
        return got == q.expected, got or "(no number)"
    if q.extractor == "output":
        got = extract_output(text)
        return got == q.expected, got if got is not None else "(empty)"
    if q.extractor == "word":
        ok = word_found(text, q.expected)
        return ok, q.expected.split("|")[0] if ok else "(not found)"
    if q.extractor == "tool":
        shown = f"{calls[0][0]}({calls[0][1]})" if calls else "(no tool call)"
        return tool_matches(calls, q.expected), shown
    raise ValueError(f"unknown extractor {q.extractor!r}")


SELF_TESTS: tuple[tuple[str, str, str | None], ...] = (
    ("number", "12", "12"),
    ("number", "The answer is 12.", "12"),
    ("number", "7 + 5 = 12", "12"),
    ("number", "**Answer is: 1,200**", "1200"),
    ("number", "25.0", "25"),
    ("number", "I don't know.", None),
    ("number", "-3 degrees", "-3"),
    ("output", "5", "5"),
    ("output", "```\nHI\n```", "HI"),
    ("output", "The output is: 6", "6"),
    ("output", "'c'", "c"),
    ("output", "", None),
)


def self_test() -> list[str]:
    """The extractors on written examples: the failures (empty when all pass)."""
    failures = []
    for kind, reply, want in SELF_TESTS:
        got = extract_number(reply) if kind == "number" else extract_output(reply)
        if got != want:
            failures.append(f"{kind} extractor on {reply!r}: {got!r}, want {want!r}")
    word_cases = [("Paris is the capital.", "Paris", True), ("It has seven days", "7|seven", True),
                  ("Parisian food", "Paris", False)]  # fmt: skip
    for reply, expected, ok in word_cases:
        if word_found(reply, expected) != ok:
            failures.append(f"word {expected!r} in {reply!r}: want {ok}")
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    tool_cases = [([("get_weather", '{"city": "paris"}')], True),
                  ([("get_weather", '{"city": "Rome"}')], False),
                  ([("add_numbers", '{"city": "Paris"}')], False),
                  ([("get_weather", "not json")], False), ([], False)]  # fmt: skip
    for calls, ok in tool_cases:
        if tool_matches(calls, call) != ok:
            failures.append(f"tool {calls!r}: want {ok}")
    if not tool_matches([("add_numbers", '{"a": 3, "b": 4}')], QUESTIONS[20].expected):
        failures.append("tool with integer arguments")
    return failures
