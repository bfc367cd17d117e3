"""DeepSeek V4 prompt rendering: the official vectors' prompt token counts and the byte
layout ds4-server renders (thinking modes, reasoning drop, tools, DSML, tool results)."""

from __future__ import annotations

import json

import pytest

from ds4d.chat.deepseek4 import (
    THINK_MAX_MIN_CONTEXT,
    THINK_MAX_PREFIX,
    TOOLS_PREAMBLE,
    ThinkMode,
    assistant_suffix,
    encode_single_prompt,
    render_completion,
    render_request,
    think_mode,
    tools_block,
)
from ds4d.chat.deepseek4_dsml import render_tool_calls
from ds4d.chat.types import ChatRequest, Message, Tool, ToolCall, ToolChoice
from ds4d.engine.ds4_tokenizer import default_tokenizer

VECTORS = [
    "short_italian_fact",
    "short_code_completion",
    "short_reasoning_plain",
    "long_memory_archive",
    "long_code_audit",
]

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
U, A = "<｜User｜>", "<｜Assistant｜>"
BASH = Tool(
    "bash", "Run a shell command", {"type": "object", "properties": {"command": {"type": "string"}}}
)


@pytest.fixture(scope="module")
def tok():
    return default_tokenizer()


@pytest.mark.parametrize("case", VECTORS)
def test_official_vector_prompt_tokens(data_dir, tok, case):
    official = json.loads(
        (data_dir / "vectors/ds4-official/official" / f"{case}.official.json").read_text()
    )
    req = official["request"]
    request = ChatRequest(messages=[Message(m["role"], m["content"]) for m in req["messages"]])
    thinking = req["thinking"]["type"] == "enabled"
    mode = think_mode(thinking, None, 16384)
    ids = tok.encode(render_request(request, mode))
    assert len(ids) == official["usage"]["prompt_tokens"]
    assert ids[0] == tok.bos_id and ids[-2:] == [tok.assistant_id, tok.think_close_id]
    # The CLI's piecewise single-prompt form is the same token sequence here.
    prompt = (data_dir / "vectors/ds4-official/prompts" / f"{case}.txt").read_text()
    assert prompt == req["messages"][0]["content"]
    assert encode_single_prompt(tok, prompt, mode=mode) == ids


def test_think_mode_resolution():
    big, small = THINK_MAX_MIN_CONTEXT, 32768
    assert think_mode(None, None, small) is ThinkMode.HIGH
    assert think_mode(False, None, small) is ThinkMode.NONE
    assert think_mode(True, "none", small) is ThinkMode.NONE
    for effort in ("low", "medium", "high", "xhigh", "minimal"):
        assert think_mode(None, effort, big) is ThinkMode.HIGH
    assert think_mode(None, "max", big) is ThinkMode.MAX
    assert think_mode(None, "max", big - 1) is ThinkMode.HIGH
    assert think_mode(False, "max", big) is ThinkMode.NONE
    with pytest.raises(ValueError, match="banana"):
        think_mode(None, "banana", big)


def test_think_max_and_modes():
    req = ChatRequest(messages=[Message("system", "You are terse."), Message("user", "Hello")])
    assert render_request(req, ThinkMode.MAX) == (
        BOS + THINK_MAX_PREFIX + "You are terse." + U + "Hello" + A + "<think>"
    )
    assert (
        render_request(req, ThinkMode.HIGH) == BOS + "You are terse." + U + "Hello" + A + "<think>"
    )
    none = render_request(req, ThinkMode.NONE)
    assert none.endswith(A + "</think>") and THINK_MAX_PREFIX not in none
    assert THINK_MAX_PREFIX.endswith(".\n\n") and THINK_MAX_PREFIX.count("\n") == 4


def test_old_reasoning_dropped_without_tool_context():
    msgs = [
        Message("system", "You are terse."),
        Message("user", "first"),
        Message("assistant", "first answer", reasoning="old thoughts"),
        Message("user", "second"),
    ]
    assert render_request(ChatRequest(messages=msgs), ThinkMode.HIGH) == (
        BOS
        + "You are terse."
        + U
        + "first"
        + A
        + "</think>first answer"
        + EOS
        + U
        + "second"
        + A
        + "<think>"
    )
    # An assistant message after the last user turn keeps its reasoning (a prefill).
    tail = render_request(ChatRequest(messages=msgs[:3]), ThinkMode.HIGH)
    assert tail.endswith(A + "<think>old thoughts</think>first answer" + EOS)


def test_tool_context_keeps_reasoning_and_renders_results():
    call = ToolCall("call_1", "bash", '{"command": "pwd"}')
    msgs = [
        Message("user", "where am I?"),
        Message("assistant", "", reasoning="tool reasoning", tool_calls=[call]),
        Message("tool", "/tmp", tool_call_id="call_1"),
        Message("tool", "a </tool_result> b <<< & >>>", tool_call_id="call_2"),
    ]
    # No schemas in this request: the history's calls alone make it a tool context.
    text = render_request(ChatRequest(messages=msgs), ThinkMode.HIGH)
    assert text == (
        BOS
        + U
        + "where am I?"
        + A
        + "<think>tool reasoning</think>"
        + render_tool_calls([call])
        + EOS
        + U
        + "<tool_result>/tmp</tool_result>"
        + "<tool_result>a &lt;/tool_result> b <<< & >>></tool_result>"
        + A
        + "<think>"
    )


def test_tools_block_precedes_system_text():
    req = ChatRequest(
        messages=[
            Message("system", "Be brief."),
            Message("system", "Use tools."),
            Message("user", "hi"),
        ],
        tools=[BASH],
    )
    text = render_request(req, ThinkMode.NONE)
    schema = '{"name": "bash", "description": "Run a shell command", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}'
    assert text == BOS + TOOLS_PREAMBLE + schema + tools_block([])[len(TOOLS_PREAMBLE) :] + (
        "\n\nBe brief.\n\nUse tools." + U + "hi" + A + "</think>"
    )
    assert text.index("## Tools") < text.index("Be brief.") < text.index(U)
    assert tools_block([]).endswith("Use the exact parameter names from the schemas.")
    # tool_choice "none" drops the schemas.
    off = ChatRequest(messages=req.messages, tools=[BASH], tool_choice=ToolChoice("none"))
    assert "## Tools" not in render_request(off, ThinkMode.NONE)


def test_canonical_dsml_rendering():
    calls = [
        ToolCall(
            "c1",
            "bash",
            '{"description": "list", "command": "ls 2>&1 && echo </｜DSML｜parameter>", "timeout": 30, "env": {"A": [1, 2]}}',
        ),
        ToolCall("c2", 'we"ird<name>', "not json"),
    ]
    assert render_tool_calls(calls) == (
        "\n\n<｜DSML｜tool_calls>\n"
        '<｜DSML｜invoke name="bash">\n'
        '<｜DSML｜parameter name="description" string="true">list</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="command" string="true">ls 2>&1 && echo &lt;/｜DSML｜parameter></｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="timeout" string="false">30</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="env" string="false">{"A":[1,2]}</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n"
        '<｜DSML｜invoke name="we&quot;ird&lt;name&gt;">\n'
        '<｜DSML｜parameter name="arguments" string="true">not json</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n"
        "</｜DSML｜tool_calls>"
    )


def test_exact_replay_needs_every_id_in_one_block():
    calls = [
        ToolCall("c1", "bash", '{"command": "pwd"}'),
        ToolCall("c2", "bash", '{"command": "ls"}'),
    ]
    msgs = [Message("user", "go"), Message("assistant", "", tool_calls=calls)]
    req = ChatRequest(messages=msgs)
    raw = '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="bash">sampled exactly</｜DSML｜invoke>\n</｜DSML｜tool_calls>'
    assert raw in render_request(req, ThinkMode.NONE, {"c1": raw, "c2": raw})
    canonical = render_tool_calls(calls)
    assert canonical in render_request(req, ThinkMode.NONE, {"c1": raw})
    assert canonical in render_request(req, ThinkMode.NONE, {"c1": raw, "c2": raw + " "})


def test_assistant_suffix_is_the_next_turns_prefix():
    call = ToolCall("c1", "bash", '{"command": "echo exact", "timeout": 5}')
    first = [Message("user", "run it")]
    req1 = ChatRequest(messages=first, tools=[BASH])
    for mode in (ThinkMode.HIGH, ThinkMode.NONE):
        prompt = render_request(req1, mode)
        suffix = assistant_suffix(mode, "need a shell", "Running.", [call])
        turn = Message("assistant", "Running.", reasoning="need a shell", tool_calls=[call])
        req2 = ChatRequest(messages=[*first, turn, Message("tool", "exact")], tools=[BASH])
        assert render_request(req2, mode).startswith(prompt + suffix)


def test_first_assistant_without_user_gets_no_marker():
    msgs = [Message("assistant", "hello"), Message("assistant", "again"), Message("user", "x")]
    assert render_request(ChatRequest(messages=msgs), ThinkMode.NONE) == (
        BOS + "hello" + EOS + "again" + EOS + U + "x" + A + "</think>"
    )


def test_completion_prompt(tok):
    assert render_completion("2+2=", ThinkMode.HIGH) == (
        BOS + "You are a helpful assistant" + U + "2+2=" + A + "<think>"
    )
    ids = tok.encode(render_completion("2+2=", ThinkMode.NONE))
    assert ids[-1] == tok.think_close_id


def test_calls_carrying_their_sampled_block_render_it_verbatim():
    # How the state layer's tool memory hands back DS4 calls: arguments = the sampled block.
    calls = [ToolCall("c1", "bash", '{"command": "pwd"}'), ToolCall("c2", "ls", '{"dir": "/"}')]
    raw = (
        '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="bash">\n'
        '<｜DSML｜parameter name="command" string="true">pwd</｜DSML｜parameter>\n'
        '</｜DSML｜invoke>\n<｜DSML｜invoke name="ls">\n'
        '<｜DSML｜parameter name="dir" string="true">/</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
    )
    raw = raw.replace("\n<｜DSML｜invoke", "  \n<｜DSML｜invoke")  # not the canonical spacing
    swapped = [ToolCall(c.id, c.name, raw) for c in calls]

    def render(cs):
        msgs = [Message("user", "go"), Message("assistant", "", tool_calls=cs)]
        return render_request(ChatRequest(messages=msgs), ThinkMode.NONE)

    assert raw + EOS in render(swapped)
    # Only one call swapped: canonical rendering, its arguments recovered from the block.
    mixed = render([swapped[0], calls[1]])
    assert raw not in mixed and render_tool_calls(calls) + EOS in mixed


def test_generated_control_tokens_stream_as_their_marker_text_and_replay(tok):
    """ds4 ends a generation at EOS only; any other control token it samples is streamed
    as its literal text (a vocabulary string holding U+FF5C verbatim, any other through
    the byte table). ds4d does the same, and that keeps the KV reusable: the client sends
    the text back, and the next prompt's text starts with exactly what the slot's tokens
    decode to (hiding the markers would break the match at the first one)."""
    controls = [
        "<｜User｜>",
        "<｜tool▁call▁begin｜>",
        "<|EOT|>",
        "<｜place▁holder▁no▁5｜>",
        "<｜begin▁of▁sentence｜>",
    ]
    ids = [tok.token_to_id(c) for c in controls]
    assert all(tok.is_special(i) for i in ids) and not set(ids) & tok.eog_ids
    assert tok.eog_ids == {tok.token_to_id(EOS)}
    generated = tok.encode("Sure", special=False) + ids + tok.encode(" done", special=False)
    dec = tok.incremental_decoder()
    content = "".join(dec.feed(i) for i in generated) + dec.flush()
    assert content == "Sure" + "".join(controls) + " done"

    first = ChatRequest([Message("user", "q")])
    prompt = render_request(first, ThinkMode.NONE)
    following = ChatRequest(
        [Message("user", "q"), Message("assistant", content), Message("user", "more")]
    )
    live = tok.encode(prompt) + generated
    assert render_request(following, ThinkMode.NONE).startswith(tok.decode(live))


def test_model_aliases_set_thinking_only_when_the_client_did_not():
    from ds4d.chat.deepseek4_output import DS4ChatFormat

    fmt = DS4ChatFormat(n_ctx=4096)
    hi = [Message("user", "hi")]
    assert fmt.mode(ChatRequest(hi, model="deepseek-chat")) is ThinkMode.NONE
    assert fmt.mode(ChatRequest(hi, model="deepseek-reasoner")) is ThinkMode.HIGH
    assert fmt.mode(ChatRequest(hi, model="deepseek-v4-flash")) is ThinkMode.HIGH
    assert fmt.mode(ChatRequest(hi, model="deepseek-chat", thinking=True)) is ThinkMode.HIGH
    assert fmt.render(ChatRequest(hi, model="deepseek-chat")).endswith(A + "</think>")
