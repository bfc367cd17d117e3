"""Streams show life before their prompt is prefilled: a real ds4d (one slot, a 50 ms
keepalive) driven by the real anthropic and openai SDKs.

Clients such as Claude Code drop a stream that sends no event they recognise for a while;
SSE comments do not count. So each protocol's opening events go out at once (Anthropic's
message_start, the chat role chunk, Responses' created / in_progress), Anthropic streams
then get empty thinking deltas while the prompt is prefilled, and the usage at the end
still tells what was reused.

"Before the prefill" is shown by order, not by timing: /metrics counts a request's first
token (`ds4d_time_to_first_token_seconds_count`) and shows the slot's KV growing chunk by
chunk (`ds4d_slot_tokens`); a request queued behind the busy slot shows in
`ds4d_requests_waiting`."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import openai
import pytest

from tests.e2e.daemon_process import running_daemon
from tests.helpers.polling import wait_until

# About 1230 tokens: a second or more of prefill on two shared cores, against 50 ms
# keepalives. A request the model answers: its first token is never the end of the answer
# (one word repeated 1200 times is answered by the end token about half the time), and
# greedy sampling (temperature 0) keeps it so whatever the daemon's sampling defaults.
LONG = "Tell me a story about a dragon. " * 150
TTFT_COUNT = "ds4d_time_to_first_token_seconds_count"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ds4d-stream-start")
    with running_daemon(tmp, "--slots", "1", "--ctx", "4096", "--keepalive-s", "0.05") as d:
        yield d


@pytest.fixture(scope="module")
def claude(daemon):
    return anthropic.Anthropic(base_url=daemon.url, api_key="x", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def oai(daemon):
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="x", max_retries=0, timeout=120)


def _sse_events(lines: Iterator[str]) -> Iterator[tuple[str | None, str | None]]:
    """(event name, data) of each SSE frame; comments come as (None, None)."""
    name = data = None
    comment = False
    for line in lines:
        if line.startswith(":"):
            comment = True
        elif line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data = line[6:]
        elif not line:
            if name is not None or data is not None or comment:
                yield name, data
            name = data = None
            comment = False


def test_anthropic_message_start_comes_before_the_prefill(daemon, claude):
    tokens = claude.messages.count_tokens(
        model="c", messages=[{"role": "user", "content": LONG}]
    ).input_tokens
    first_tokens = daemon.metrics()[TTFT_COUNT]
    stream = claude.messages.create(
        model="c",
        max_tokens=2,
        stream=True,
        extra_body={"temperature": 0},
        messages=[{"role": "user", "content": LONG}],
    )
    with stream:
        events = iter(stream)
        start = next(events)
        assert start.type == "message_start"
        # The request runs, has produced no token yet, and its slot (empty before: the
        # module's first request) holds only part of the prompt: it is being prefilled.
        m = daemon.metrics()
        assert m["ds4d_requests_running"] == 1 and m[TTFT_COUNT] == first_tokens
        assert m['ds4d_slot_tokens{slot="0"}'] < tokens
        assert start.message.usage.input_tokens == tokens
        assert start.message.usage.cache_read_input_tokens == 0
        rest = list(events)
    assert [e.type for e in rest][-2:] == ["message_delta", "message_stop"]
    final = rest[-2].usage
    assert final.output_tokens >= 1
    assert final.input_tokens + final.cache_read_input_tokens == tokens


def test_anthropic_keepalives_while_prefilling_and_reuse_in_the_final_usage(daemon, claude):
    # A different prompt of the same length: the slot's cached prefix is mostly lost.
    body = {
        "model": "c",
        "max_tokens": 2,
        "extra_body": {"temperature": 0},
        "stream": True,
        "messages": [{"role": "user", "content": "other " + LONG}],
    }
    first_tokens = daemon.metrics()[TTFT_COUNT]
    names: list[str | None] = []
    keepalives = 0
    prefilling_at_keepalive = None
    with claude.messages.with_streaming_response.create(**body) as r:
        for name, data in _sse_events(r.iter_lines()):
            names.append(name)
            # Claude Code counts content events only: the keepalive is an empty thinking
            # delta (in a thinking block opened for it) while the prompt is prefilled.
            if name == "content_block_delta" and json.loads(data)["delta"] == {
                "type": "thinking_delta",
                "thinking": "",
            }:
                keepalives += 1
                if keepalives == 2:
                    prefilling_at_keepalive = daemon.metrics()[TTFT_COUNT] == first_tokens
            if name == "message_delta":
                usage = json.loads(data)["usage"]
    assert None not in names, "an Anthropic stream sends events, not comments"
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert keepalives >= 3 and prefilling_at_keepalive is True
    assert names[-2:] == ["message_delta", "message_stop"]
    assert usage["output_tokens"] >= 1 and usage["input_tokens"] > 1000

    # The same prompt again: message_start cannot know the reuse, the final usage does.
    with claude.messages.stream(**{k: v for k, v in body.items() if k != "stream"}) as s:
        start = None
        for ev in s:
            if ev.type == "message_start":
                start = ev.message.usage
        final = s.get_final_message().usage
    assert start is not None and start.cache_read_input_tokens == 0
    assert final.cache_read_input_tokens > 1000
    assert final.input_tokens + final.cache_read_input_tokens == start.input_tokens


def test_queued_streams_open_at_once_in_every_protocol(daemon, claude, oai):
    """With the only slot busy prefilling a long prompt, each protocol's opening events
    arrive while the new request still waits in the queue. The streams are held open, not
    read on, and closed at the end: the daemon then cancels them, the long prefill too. So
    the long prompt can be three times LONG (the slot stays busy however slowly the streams
    open) and cost only the chunks prefilled before the cancel."""
    first_tokens = daemon.metrics()[TTFT_COUNT]

    def waiting() -> float:
        return daemon.metrics()["ds4d_requests_waiting"]

    with claude.messages.create(
        model="c",
        max_tokens=1,
        stream=True,
        messages=[{"role": "user", "content": "third " + LONG * 3}],
    ) as holder:
        assert next(iter(holder)).type == "message_start"
        # The long request has the slot (it runs, nothing waits) and is being prefilled.
        wait_until(
            lambda: daemon.metrics()["ds4d_requests_running"] == 1,
            60,
            "the long request never got the slot",
        )
        assert waiting() == 0

        # Opened one after another and held open: the n-th first event arrives while n
        # requests wait for the slot.
        with claude.messages.create(
            model="c", max_tokens=1, stream=True, messages=[{"role": "user", "content": "Say yes."}]
        ) as a:
            assert next(iter(a)).type == "message_start" and waiting() == 1
            with oai.chat.completions.create(
                model="m",
                max_tokens=1,
                stream=True,
                messages=[{"role": "user", "content": "Say yes."}],
            ) as c:
                first = next(iter(c))
                assert first.choices[0].delta.role == "assistant" and waiting() == 2
                with oai.responses.create(
                    model="m", input="Say yes.", max_output_tokens=16, stream=True
                ) as r:
                    events = iter(r)
                    assert next(events).type == "response.created"
                    assert next(events).type == "response.in_progress" and waiting() == 3
                    # All of it while the long prompt was still being prefilled: no
                    # request has produced a token since it started.
                    assert daemon.metrics()[TTFT_COUNT] == first_tokens


def test_openai_streams_keep_their_final_usage(oai):
    chunks = list(
        oai.chat.completions.create(
            model="m",
            max_tokens=2,
            stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "Say yes."}],
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens > 5 and usage.completion_tokens >= 1

    with oai.responses.stream(model="m", input="Say yes.", max_output_tokens=16) as s:
        events = list(s)
    # completed, or incomplete when the 16 tokens run out: either carries the usage
    last = events[-1]
    assert last.type in ("response.completed", "response.incomplete")
    usage = last.response.usage
    assert usage is not None and usage.input_tokens > 5 and usage.output_tokens >= 1
