"""A real ds4d process on the embedded model, driven by the real openai and anthropic SDKs.

One daemon serves the whole module (3 slots, an API key, a 2 MB body limit); every
generation is kept short so the module stays quick on two shared cores."""

from __future__ import annotations

import json
import re
import threading
import time

import anthropic
import httpx
import openai
import pytest

from tests.e2e.daemon_process import running_daemon, traces
from tests.helpers.polling import wait_until

KEY = "sk-test-e2e"
MAX_BODY = 2_000_000

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "the city name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer"},
            },
            "required": ["city", "unit"],
        },
    },
}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ds4d-api")
    with running_daemon(
        tmp,
        "--slots",
        "3",
        "--ctx",
        "4096",
        "--api-key",
        KEY,
        "--max-body-bytes",
        str(MAX_BODY),
        "--queue-size",
        "4",
    ) as d:
        yield d


@pytest.fixture(scope="module")
def oai(daemon):
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def claude(daemon):
    return anthropic.Anthropic(base_url=daemon.url, api_key=KEY, max_retries=0, timeout=120)


# -- OpenAI ------------------------------------------------------------------------------


def test_health_says_loading_until_the_model_is_ready(daemon):
    # The listener binds before the model loads: 503 first, then 200, nothing else.
    seen = daemon.health_seen
    assert seen[0] == 503 and seen[-1] == 200 and set(seen) == {503, 200}


def test_models_health_and_root(daemon, oai):
    models = oai.models.list()
    assert len(models.data) == 1 and models.data[0].id
    assert oai.models.retrieve("any-alias").id == "any-alias"
    assert httpx.get(f"{daemon.url}/health").status_code == 200  # open without a key
    assert httpx.head(f"{daemon.url}/").status_code == 200


def test_chat_completion(oai):
    r = oai.chat.completions.create(
        model="gpt-4o",
        max_tokens=8,
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Say hello."},
        ],
    )
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.model == "gpt-4o"  # names are aliases, echoed back
    assert r.usage.completion_tokens <= 8 and r.usage.prompt_tokens > 10
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_chat_completion_stream_with_usage(oai):
    chunks = list(
        oai.chat.completions.create(
            model="m",
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "Count to three."}],
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("stop", "length") and all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1


def test_legacy_completions(oai):
    r = oai.completions.create(model="m", prompt="The capital of France is", max_tokens=5)
    assert r.choices[0].text and r.usage.completion_tokens <= 5
    parts = list(oai.completions.create(model="m", prompt="1, 2, 3,", max_tokens=5, stream=True))
    assert "".join(p.choices[0].text for p in parts if p.choices)
    assert parts[-1].choices[0].finish_reason in ("stop", "length")


def test_responses(oai):
    r = oai.responses.create(
        model="m", instructions="Be brief.", input="Say hi.", max_output_tokens=8
    )
    assert r.status in ("completed", "incomplete")
    assert r.output_text
    assert r.usage.input_tokens > 5 and r.usage.input_tokens_details.cached_tokens >= 0


def test_responses_stream(oai):
    events = list(
        oai.responses.create(model="m", input="Say hi.", max_output_tokens=8, stream=True)
    )
    types = [e.type for e in events]
    assert types[0] == "response.created"
    assert "response.output_text.delta" in types
    assert types[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.output_text == deltas and final.usage.output_tokens >= 1


def test_responses_stream_helper(oai):
    # The SDK's accumulating helper checks item ids, indexes and the lifecycle as it goes.
    with oai.responses.stream(model="m", input="Say hi.", max_output_tokens=6) as stream:
        events = list(stream)
    last = events[-1]
    assert last.type in ("response.completed", "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and last.response.output_text == text


# -- Anthropic ---------------------------------------------------------------------------


def test_anthropic_messages(claude):
    m = claude.messages.create(
        model="local",
        max_tokens=8,
        system="Be brief.",
        messages=[{"role": "user", "content": "Say hello."}],
    )
    assert m.role == "assistant" and m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens")
    u = m.usage
    assert u.output_tokens <= 8
    assert u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens > 10


def test_anthropic_usage_follows_cache_control(claude):
    system = "You answer questions about the weather in one short sentence. " * 4
    plain = claude.messages.create(
        model="c",
        max_tokens=1,
        system=system,
        messages=[{"role": "user", "content": "Is it raining in Oslo today?"}],
    )
    u = plain.usage  # nothing marked: no cache writes, the unreused rest is input
    assert u.cache_creation_input_tokens == 0 and u.input_tokens > 10
    marked = [{"type": "text", "text": "Mark. " + system, "cache_control": {"type": "ephemeral"}}]
    first = claude.messages.create(
        model="c",
        max_tokens=1,
        system=marked,
        messages=[{"role": "user", "content": "Is it sunny in Rome today?"}],
    )
    f = first.usage
    total = f.input_tokens + f.cache_read_input_tokens + f.cache_creation_input_tokens
    # The marked system part is written, the user turn after it is input.
    assert f.cache_creation_input_tokens > 10 and f.input_tokens >= 5
    # The next turn extends the conversation: the slot's tokens are reused, the marked
    # prefix among them, so nothing is written.
    again = claude.messages.create(
        model="c",
        max_tokens=1,
        system=marked,
        messages=[
            {"role": "user", "content": "Is it sunny in Rome today?"},
            {"role": "assistant", "content": first.content[0].text},
            {"role": "user", "content": "And in Paris?"},
        ],
    )
    a = again.usage
    assert a.cache_read_input_tokens >= total - 1
    assert a.cache_creation_input_tokens == 0 and a.input_tokens > 0


def test_anthropic_stream(claude):
    with claude.messages.stream(
        model="c", max_tokens=8, messages=[{"role": "user", "content": "Say hello."}]
    ) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text and final.content[0].text == text
    assert final.stop_reason in ("end_turn", "max_tokens")


def test_anthropic_count_tokens(claude):
    short = claude.messages.count_tokens(model="c", messages=[{"role": "user", "content": "hi"}])
    long = claude.messages.count_tokens(
        model="c",
        system="You are a careful assistant.",
        messages=[{"role": "user", "content": "hi " * 50}],
    )
    assert 0 < short.input_tokens < long.input_tokens


# -- tools -------------------------------------------------------------------------------


def test_forced_tool_call_and_result_round_trip(oai):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = oai.chat.completions.create(
        model="m",
        messages=messages,
        tools=[WEATHER_TOOL],
        max_tokens=8,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    assert {"city", "unit"} <= set(args) and args["unit"] in ("celsius", "fahrenheit")
    assert "<tool_call>" not in (choice.message.content or "")

    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 degrees"},
    ]
    r2 = oai.chat.completions.create(
        model="m", messages=messages, tools=[WEATHER_TOOL], max_tokens=8
    )
    assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # The first turn, call and result included, is rendered into the second prompt, and
    # the call renders exactly as it was generated: the slot's KV is reused past it.
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens + 10
    reused = r2.usage.prompt_tokens_details.cached_tokens
    assert reused >= r.usage.prompt_tokens + r.usage.completion_tokens - 1


def test_forced_tool_call_streamed(oai):
    chunks = list(
        oai.chat.completions.create(
            model="m",
            stream=True,
            max_tokens=8,
            tools=[WEATHER_TOOL],
            tool_choice="required",
            messages=[{"role": "user", "content": "Weather in Oslo?"}],
        )
    )
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].id and deltas[0].function.name == "get_weather"
    args = "".join(d.function.arguments or "" for d in deltas)
    assert {"city", "unit"} <= set(json.loads(args))
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not any("<tool_call" in (c.choices[0].delta.content or "") for c in chunks if c.choices)


def test_anthropic_forced_tool_use_round_trip(claude):
    tool = {
        "name": "get_weather",
        "description": "Weather for a city",
        "input_schema": WEATHER_TOOL["function"]["parameters"],
    }
    messages = [{"role": "user", "content": "Weather in Rome?"}]
    m = claude.messages.create(
        model="c", max_tokens=8, tools=[tool], messages=messages, tool_choice={"type": "any"}
    )
    assert m.stop_reason == "tool_use"
    use = next(b for b in m.content if b.type == "tool_use")
    assert use.id.startswith("toolu_") and {"city", "unit"} <= set(use.input)
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in m.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": "Rainy, 12 degrees"}
            ],
        },
    ]
    with claude.messages.stream(model="c", max_tokens=8, tools=[tool], messages=messages) as s:
        final = s.get_final_message()
    assert final.stop_reason in ("end_turn", "max_tokens", "tool_use")
    first_prompt = (
        m.usage.input_tokens + m.usage.cache_read_input_tokens + m.usage.cache_creation_input_tokens
    )
    assert final.usage.cache_read_input_tokens >= first_prompt + m.usage.output_tokens - 1


def test_responses_forced_function_call_round_trip(oai):
    tool = {
        "type": "function",
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": WEATHER_TOOL["function"]["parameters"],
    }
    r = oai.responses.create(
        model="m",
        input="Weather in Lima?",
        tools=[tool],
        tool_choice="required",
        max_output_tokens=8,
    )
    call = next(o for o in r.output if o.type == "function_call")
    assert call.name == "get_weather" and {"city", "unit"} <= set(json.loads(call.arguments))
    r2 = oai.responses.create(
        model="m",
        tools=[tool],
        max_output_tokens=6,
        input=[
            {"role": "user", "content": "Weather in Lima?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "Foggy"},
        ],
    )
    assert r2.status in ("completed", "incomplete")


# -- concurrency and cancellation --------------------------------------------------------


def test_three_concurrent_streams(oai):
    results: dict[int, str | None] = {}

    def run(i: int) -> None:
        finish = None
        for c in oai.chat.completions.create(
            model="m",
            max_tokens=12,
            stream=True,
            messages=[{"role": "user", "content": f"Tell me about the number {i}."}],
        ):
            if c.choices and c.choices[0].finish_reason:
                finish = c.choices[0].finish_reason
        results[i] = finish

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == [0, 1, 2]
    assert all(f in ("stop", "length") for f in results.values())


def test_long_prefill_does_not_block_other_slots(oai, daemon):
    """Prefill runs chunk by chunk, taking turns with the other slots' steps: a short
    request sent while a long prompt is being prefilled finishes first."""
    done: dict[str, float] = {}

    def long_request() -> None:
        oai.chat.completions.create(
            model="m", max_tokens=1, messages=[{"role": "user", "content": "word " * 3300}]
        )
        done["long"] = time.monotonic()

    t = threading.Thread(target=long_request)
    t.start()
    wait_until(lambda: daemon.metrics()["ds4d_requests_running"] == 1, 30, "never running")
    oai.chat.completions.create(
        model="m", max_tokens=4, messages=[{"role": "user", "content": "Quick: say yes."}]
    )
    done["short"] = time.monotonic()
    t.join(120)
    assert done["short"] < done["long"]


def test_killed_client_frees_its_slot_within_a_second(daemon):
    body = {
        "model": "m",
        "stream": True,
        "max_tokens": 3000,
        "messages": [{"role": "user", "content": "Write a very long story."}],
    }
    with httpx.Client(timeout=60) as client:
        with client.stream(
            "POST",
            f"{daemon.url}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {KEY}"},
        ) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            got = 0
            for line in lines:
                got += line.startswith("data: ")
                if got >= 4:
                    break
            assert daemon.metrics()["ds4d_requests_running"] == 1
    wait_until(
        lambda: daemon.metrics()["ds4d_requests_running"] == 0,
        1.0,
        "slot still busy after the disconnect",
    )


def test_full_queue_is_503_with_retry_after(daemon):
    """3 slots busy, 4 requests queued (the limit): the next is refused at once; the
    queued ones run, in turn, once the slots come free."""
    stop = threading.Event()
    auth = {"Authorization": f"Bearer {KEY}"}
    statuses: list[int] = []

    def long_stream() -> None:
        body = {
            "model": "m",
            "stream": True,
            "max_tokens": 3000,
            "messages": [{"role": "user", "content": "Write a long story."}],
        }
        with httpx.stream(
            "POST", f"{daemon.url}/v1/chat/completions", json=body, headers=auth, timeout=60
        ) as r:
            for _ in r.iter_lines():
                if stop.is_set():
                    break

    def queued() -> None:
        r = httpx.post(
            f"{daemon.url}/v1/chat/completions",
            headers=auth,
            timeout=120,
            json={"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]},
        )
        statuses.append(r.status_code)

    def wait_for(name: str, value: float) -> None:
        wait_until(lambda: daemon.metrics()[name] == value, 30, f"{name} never reached {value}")

    runners = [threading.Thread(target=long_stream) for _ in range(3)]
    waiters = [threading.Thread(target=queued) for _ in range(4)]
    try:
        for t in runners:
            t.start()
        wait_for("ds4d_requests_running", 3)
        for t in waiters:
            t.start()
        wait_for("ds4d_requests_waiting", 4)
        r = httpx.post(
            f"{daemon.url}/v1/chat/completions",
            headers=auth,
            timeout=10,
            json={
                "model": "m",
                "max_tokens": 1,
                "messages": [{"role": "user", "content": "one more"}],
            },
        )
        assert r.status_code == 503 and int(r.headers["Retry-After"]) > 0
        assert r.json()["error"]["message"]
    finally:
        stop.set()
        for t in runners + waiters:
            t.join(120)
    assert statuses == [200] * 4
    wait_for("ds4d_requests_running", 0)


# -- memory reuse ------------------------------------------------------------------------


def test_memory_reuse_of_a_long_conversation(oai):
    filler = " ".join(
        f"Fact {i}: the item number {i} is stored in box {i * 7 % 13}." for i in range(120)
    )
    messages = [
        {"role": "system", "content": "You answer questions about boxes."},
        {"role": "user", "content": filler},
        {"role": "assistant", "content": "I have noted all the facts."},
        {"role": "user", "content": "Where is item 3?"},
    ]
    t0 = time.perf_counter()
    first = oai.chat.completions.create(model="m", messages=messages, max_tokens=1, temperature=0)
    ttft_first = time.perf_counter() - t0
    old_prompt = first.usage.prompt_tokens
    assert old_prompt >= 1800
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And item 4?"},
    ]
    t1 = time.perf_counter()
    second = oai.chat.completions.create(model="m", messages=messages, max_tokens=1, temperature=0)
    ttft_second = time.perf_counter() - t1
    assert second.usage.prompt_tokens_details.cached_tokens >= 0.9 * old_prompt
    assert ttft_second <= 0.2 * ttft_first, (ttft_first, ttft_second)


# -- bad input ---------------------------------------------------------------------------


def _post(daemon, path: str, content: bytes, key: str | None = KEY) -> httpx.Response:
    headers = {"content-type": "application/json"}
    if key:
        headers["x-api-key"] = key
    return httpx.post(f"{daemon.url}{path}", content=content, headers=headers, timeout=30)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/v1/completions"])
@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"\xff\xfe\x00garbage",
        b"[" * 100_000 + b"]" * 100_000,
        b'{"messages": "hello", "input": 5, "prompt": 7}',
        b'{"messages": [], "input": [], "prompt": null}',
        b'{"messages": [{"role": "user", "content": "x"}], "input": "x", "prompt": "x",'
        b' "temperature": "hot"}',
        b'{"messages": [{"role": "user", "content": "x"}], "input": "x", "prompt": "x",'
        b' "max_tokens": -3, "max_output_tokens": -3}',
    ],
)
def test_openai_bad_requests_are_400_in_openai_shape(daemon, path, body):
    r = _post(daemon, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "body",
    [
        b"[1, 2",
        b'{"max_tokens": 5, "messages": {"role": "user"}}',
        b'{"max_tokens": 5, "messages": []}',
        b'{"max_tokens": "five", "messages": [{"role": "user", "content": "x"}]}',
        b'{"max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]}',
    ],
)
def test_anthropic_bad_requests_are_400_in_anthropic_shape(daemon, body):
    r = _post(daemon, "/v1/messages", body)
    assert r.status_code == 400, r.text
    j = r.json()
    assert j["type"] == "error" and j["error"]["type"] == "invalid_request_error"
    assert j["error"]["message"]


def test_oversized_body_is_413_and_daemon_keeps_serving(daemon, oai, claude):
    big = json.dumps(
        {
            "model": "m",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "x" * (MAX_BODY + 10)}],
        }
    ).encode()
    r = _post(daemon, "/v1/chat/completions", big)
    assert r.status_code == 413 and r.json()["error"]["message"]
    r = _post(daemon, "/v1/messages", big)
    assert r.status_code == 413 and r.json()["type"] == "error"
    assert (
        oai.chat.completions.create(
            model="m", max_tokens=2, messages=[{"role": "user", "content": "still there?"}]
        )
        .choices[0]
        .message.content
        is not None
    )


def test_context_overflow_is_400_context_length_exceeded(oai):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(
            model="m", max_tokens=2, messages=[{"role": "user", "content": "word " * 5000}]
        )
    assert e.value.code == "context_length_exceeded"


def test_api_key_required_but_health_open(daemon):
    assert _post(daemon, "/v1/chat/completions", b"{}", key=None).status_code == 401
    r = _post(daemon, "/v1/messages", b"{}", key="wrong")
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    bearer = httpx.post(
        f"{daemon.url}/v1/chat/completions",
        json={"max_tokens": 1, "messages": [{"role": "user", "content": "x"}]},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=60,
    )
    assert bearer.status_code == 200
    assert httpx.get(f"{daemon.url}/health").status_code == 200


def test_unknown_route_is_404_json(daemon):
    r = httpx.get(f"{daemon.url}/v1/nothing", headers={"x-api-key": KEY})
    assert r.status_code == 404 and r.json()["error"]["message"]


# -- what the log, the trace and /metrics say about each request ---------------------------

LOG_LINE = re.compile(
    r"(?P<api>\w+) slot \d+: prompt (?P<prompt>\d+) tokens \((?P<cached>\d+) cached, [\w-]+\), "
    r"prefill (?P<prefilled>\d+) tokens in [\d.]+s, (?P<generated>\d+) generated in [\d.]+s, "
    r"finish (?P<finish>\w+)$"
)
COUNTERS = {
    "prompt": "ds4d_prompt_tokens_total",
    "prefilled": "ds4d_prefilled_tokens_total",
    "generated": "ds4d_generated_tokens_total",
}


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ds4d-traced")
    trace = tmp / "trace.jsonl"
    with running_daemon(tmp, "--slots", "1", "--ctx", "4096", "--trace", str(trace)) as d:
        d.trace_path = trace
        yield d


def _finished_lines(daemon) -> list[re.Match]:
    return [m for line in daemon.log().splitlines() if (m := LOG_LINE.search(line))]


def _cached(metrics: dict[str, float]) -> float:
    return sum(v for k, v in metrics.items() if k.startswith("ds4d_cached_prompt_tokens_total"))


def _accounted(daemon, before: dict[str, float], n_lines: int, act) -> dict[str, object]:
    """Run `act`, wait for its request's log line, and check that the log line, the trace
    line and the /metrics deltas tell the same story; returns that story."""
    n_trace = len(traces(daemon.trace_path))
    act()
    lines = wait_until(
        lambda: len(_finished_lines(daemon)) > n_lines and _finished_lines(daemon),
        120,
        "no log line for the request",
    )
    line = lines[-1]
    story = {k: int(line[k]) for k in ("prompt", "cached", "prefilled", "generated")}
    story["finish"] = line["finish"]
    rec = wait_until(
        lambda: len(traces(daemon.trace_path)) > n_trace and traces(daemon.trace_path),
        120,
        "no trace line for the request",
    )[-1]
    assert (
        rec["prompt_tokens"],
        rec["cached_tokens"],
        rec["prefilled_tokens"],
        rec["generated_tokens"],
        rec["finish_reason"],
    ) == (
        story["prompt"],
        story["cached"],
        story["prefilled"],
        story["generated"],
        story["finish"],
    ), (rec, story)
    after = daemon.metrics()
    for key, counter in COUNTERS.items():
        assert after[counter] - before[counter] == story[key], (key, story)
    assert _cached(after) - _cached(before) == story["cached"]
    name = f'ds4d_requests_finished_total{{finish_reason="{story["finish"]}"}}'
    assert after[name] - before.get(name, 0) == 1
    return story


def _stream_then_drop(daemon, body: dict, after_chunks: int, until=None) -> None:
    """Read `after_chunks` SSE chunks, wait for `until()` if given, then hang up.
    (Leaving a loop over iter_lines closes the response at once: the lines are taken one
    by one so that the connection stays open while `until` is awaited.)"""
    with httpx.Client(timeout=120) as client:
        with client.stream("POST", f"{daemon.url}/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            got = 0
            while got < after_chunks:
                got += next(lines).startswith("data: ")
            if until is not None:
                wait_until(until, 120, "the condition to hang up on was never met")


def _slot_tokens(daemon) -> float:
    return daemon.metrics()['ds4d_slot_tokens{slot="0"}']


def test_log_trace_and_metrics_agree_on_every_ending(traced):
    d = traced
    chat = f"{d.url}/v1/chat/completions"
    words = "word " * 2500

    # Completed: a stop sequence ends it.
    def completed() -> None:
        r = httpx.post(
            chat,
            timeout=120,
            json={
                "model": "m",
                "max_tokens": 50,
                "stop": [" "],
                "temperature": 0,
                "messages": [{"role": "user", "content": "Write a sentence about the sea."}],
            },
        )
        assert r.json()["choices"][0]["finish_reason"] == "stop"

    s = _accounted(d, d.metrics(), len(_finished_lines(d)), completed)
    assert s["finish"] == "stop" and s["prefilled"] == s["prompt"] - s["cached"]

    # Length-limited.
    def limited() -> None:
        r = httpx.post(
            chat,
            timeout=120,
            json={
                "model": "m",
                "max_tokens": 3,
                "temperature": 0,
                "messages": [{"role": "user", "content": "Count from one to fifty in words."}],
            },
        )
        assert r.json()["usage"]["completion_tokens"] == 3

    s = _accounted(d, d.metrics(), len(_finished_lines(d)), limited)
    assert (s["finish"], s["generated"]) == ("length", 3)

    # Cancelled during the prefill of a long prompt: the first SSE chunk (the role) comes
    # before the prefill; the client leaves once the slot holds more than two prefill
    # chunks of it (/metrics' slot gauge), and what was prefilled by then is accounted.
    seen = [0.0]

    def prefill_under_way() -> bool:
        seen[0] = _slot_tokens(d)
        return seen[0] > 512

    def cancelled_in_prefill() -> None:
        _stream_then_drop(
            d,
            {
                "model": "m",
                "stream": True,
                "max_tokens": 5,
                "messages": [{"role": "user", "content": words}],
            },
            after_chunks=1,
            until=prefill_under_way,
        )

    s = _accounted(d, d.metrics(), len(_finished_lines(d)), cancelled_in_prefill)
    assert s["finish"] == "cancelled" and s["generated"] == 0
    assert s["prompt"] > 2500 and s["prefilled"] < s["prompt"] - s["cached"]
    assert s["cached"] + s["prefilled"] >= seen[0], (s, seen)

    # Cancelled while decoding, after a few streamed tokens.
    def cancelled_in_decode() -> None:
        _stream_then_drop(
            d,
            {
                "model": "m",
                "stream": True,
                "max_tokens": 2000,
                "messages": [{"role": "user", "content": "Tell a long story."}],
            },
            after_chunks=6,
        )

    s = _accounted(d, d.metrics(), len(_finished_lines(d)), cancelled_in_decode)
    assert s["finish"] == "cancelled" and s["generated"] >= 4
    assert s["prefilled"] == s["prompt"] - s["cached"]
