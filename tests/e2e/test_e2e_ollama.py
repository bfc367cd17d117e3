"""Ollama's native API against a real ds4d process, through the official `ollama` client
and replays of the editors' request shapes (tests/data/ollama_clients).

Two kit models are served: Qwen3 (the default: tools, thinking) and Qwen2 named `coder`
(its vocabulary has FIM tokens: `insert`). Kit models have random weights, so the tests
check the protocol, the counts and the timings, never the words.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest

from tests.e2e.daemon_process import Daemon, running_daemon
from tests.helpers.kit import kit_model

CLIENTS = Path(__file__).parent.parent / "data" / "ollama_clients"
TOOL = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("ds4d-ollama")
    with running_daemon(
        tmp,
        "--model",
        str(kit_model("qwen3")),
        "--add-model",
        f"coder={kit_model('qwen2')}",
        "--model-aliases",
        "qwen2.5-coder:0.5b=coder",
        "--slots",
        "1",
        "--ctx",
        "1024",
        "--temperature",
        "0",
    ) as d:
        yield d
        assert "Traceback" not in d.log(), d.log()[-4000:]


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> ollama.Client:
    return ollama.Client(host=daemon.url, timeout=120)


@pytest.fixture(scope="module")
def default(client: ollama.Client) -> str:
    return str(client.list().models[0].model)


def loads(daemon: Daemon, model: str) -> float:
    return daemon.metrics().get(f'ds4d_model_loads{{model="{model}"}}', 0.0)


def test_root_version_tags_and_ps(daemon: Daemon, client: ollama.Client, default: str) -> None:
    root = httpx.get(daemon.url)
    assert root.status_code == 200 and root.text == "Ollama is running"
    assert httpx.head(daemon.url).status_code == 200
    version = httpx.get(f"{daemon.url}/api/version").json()["version"]
    assert tuple(int(p) for p in version.split(".")) >= (0, 6, 4)
    listed = {m.model: m for m in client.list().models}
    assert set(listed) == {default, "coder"}
    assert listed["coder"].details is not None
    assert listed["coder"].details.family == "qwen2" and listed["coder"].details.format == "gguf"
    assert listed[default].size and listed[default].digest
    running = {m.model for m in client.ps().models}
    assert default in running  # the first model is loaded at start


def test_show_capabilities_are_what_each_model_has(client: ollama.Client, default: str) -> None:
    qwen3 = client.show(default)
    # Qwen3's vocabulary has the FIM tokens too
    assert set(qwen3.capabilities or []) == {"completion", "tools", "thinking", "insert"}
    assert qwen3.modelinfo is not None
    assert qwen3.modelinfo["general.architecture"] == "qwen3"
    assert qwen3.modelinfo["qwen3.context_length"] == 1024  # the served context
    assert "<|im_start|>" in (qwen3.template or "")
    coder = client.show("coder")
    assert set(coder.capabilities or []) == {"completion", "tools", "insert"}
    assert ".Suffix" in (coder.template or "")
    assert coder.details is not None and coder.details.quantization_level == "F16"


def test_chat_non_streaming_reports_counts_and_ns_timings(
    client: ollama.Client, default: str
) -> None:
    r = client.chat(
        model=default,
        messages=[{"role": "user", "content": "Say hello."}],
        options={"num_predict": 5, "seed": 7},
        think=False,
    )
    assert r.done and r.done_reason == "length"
    assert r.message.role == "assistant" and r.message.content
    assert r.eval_count == 5 and r.prompt_eval_count and r.prompt_eval_count > 5
    assert r.total_duration and r.prompt_eval_duration and r.eval_duration
    assert r.total_duration >= r.prompt_eval_duration + r.eval_duration
    assert r.created_at and r.created_at.endswith("Z")


def test_chat_streaming_ends_with_one_done_object(client: ollama.Client, default: str) -> None:
    parts = list(
        client.chat(
            model=default,
            messages=[{"role": "user", "content": "Count to three."}],
            options={"num_predict": 4},
            stream=True,
            think=False,
        )
    )
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    last = parts[-1]
    assert last.done_reason == "length" and last.eval_count == 4
    assert last.total_duration and last.eval_duration
    assert "".join(p.message.content or "" for p in parts[:-1])


def test_thinking_goes_to_its_own_field(client: ollama.Client, default: str) -> None:
    # Qwen3's template opens no <think> itself: whatever the model writes before a
    # </think> would be thinking; with think=False the prompt closes the block empty, so
    # the reply has no thinking at all.
    r = client.chat(
        model=default,
        messages=[{"role": "user", "content": "2+2?"}],
        options={"num_predict": 6},
        think=False,
    )
    assert not r.message.thinking
    on = client.chat(
        model=default,
        messages=[{"role": "user", "content": "2+2?"}],
        options={"num_predict": 6},
        think=True,
    )
    assert on.done and on.eval_count == 6


def test_tool_call_round_trip(daemon: Daemon, client: ollama.Client, default: str) -> None:
    # force_tool_choice is off here; a random model rarely calls: send a past call and
    # its result as clients do, check the conversation is accepted and answered.
    r = client.chat(
        model=default,
        messages=[
            {"role": "user", "content": "Read a.txt"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "read_file", "arguments": {"path": "a.txt"}}}],
            },
            {"role": "tool", "content": "alpha", "tool_name": "read_file"},
        ],
        tools=[TOOL],
        options={"num_predict": 4},
        think=False,
    )
    assert r.done and r.eval_count == 4


def test_generate_plain_and_with_suffix(client: ollama.Client, default: str) -> None:
    g = client.generate(model=default, prompt="Once upon a time", options={"num_predict": 3})
    assert g.done and g.eval_count == 3 and g.response
    fim = client.generate(
        model="coder", prompt="def add(a, b):\n    ", suffix="\n", options={"num_predict": 3}
    )
    assert fim.done and fim.eval_count == 3
    # the FIM prompt: <|fim_prefix|> + prefix + <|fim_suffix|> + suffix + <|fim_middle|>
    assert fim.prompt_eval_count is not None and fim.prompt_eval_count >= 3 + 1


def test_generate_with_suffix_on_a_model_without_fim_tokens_is_a_400(tmp_path: Path) -> None:
    # The embedded default model (SmolLM2) has no FIM tokens.
    with running_daemon(tmp_path, "--slots", "1", "--ctx", "512") as d:
        c = ollama.Client(host=d.url, timeout=120)
        assert set(c.show("x").capabilities or []) == {"completion"}
        with pytest.raises(ollama.ResponseError) as e:
            c.generate(model="x", prompt="a", suffix="b")
        assert e.value.status_code == 400
        assert "no fill-in-the-middle tokens" in e.value.error


def test_errors_in_ollamas_shape(daemon: Daemon, client: ollama.Client, default: str) -> None:
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="nope", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 404
    assert "model 'nope' not found" in e.value.error and "coder" in e.value.error
    for body, word in (
        ({"model": default, "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]},
         "images"),
        ({"model": default, "messages": [{"role": "user", "content": "x"}],
          "options": {"repeat_penalty": 1.3}}, "repeat_penalty"),
        ({"model": default, "messages": [{"role": "user", "content": "x"}],
          "options": {"num_ctx": 4}}, "num_ctx"),
    ):  # fmt: skip
        r = httpx.post(f"{daemon.url}/api/chat", json=body, timeout=60)
        assert r.status_code == 400, r.text
        assert word in r.json()["error"]
    bad = httpx.post(f"{daemon.url}/api/chat", content=b"{", timeout=60)
    assert bad.status_code == 400 and isinstance(bad.json()["error"], str)


def test_aliases_and_latest_tags_pick_the_model(client: ollama.Client) -> None:
    for name in ("qwen2.5-coder:0.5b", "coder:latest"):
        r = client.generate(model=name, prompt="x", options={"num_predict": 1})
        assert r.done and r.model == name


def test_num_ctx_is_a_limit_that_reloads_nothing_and_keeps_the_kv(
    daemon: Daemon, client: ollama.Client, default: str
) -> None:
    before = loads(daemon, default)
    messages = [{"role": "user", "content": "Tell me about the lighthouse keeper. " * 8}]
    first = client.chat(
        model=default, messages=messages, options={"num_predict": 2, "num_ctx": 512}
    )
    again = client.chat(
        model=default, messages=messages, options={"num_predict": 2, "num_ctx": 900}
    )
    assert first.prompt_eval_count and again.prompt_eval_count is not None
    assert again.prompt_eval_count < first.prompt_eval_count // 4  # the prefix was reused
    capped = client.chat(
        model=default, messages=messages, options={"num_ctx": first.prompt_eval_count + 3}
    )
    assert capped.done_reason == "length" and capped.eval_count is not None
    assert capped.eval_count <= 3
    assert loads(daemon, default) == before  # nothing was reloaded


def test_empty_prompt_loads_and_keep_alive_zero_unloads(
    daemon: Daemon, client: ollama.Client
) -> None:
    r = httpx.post(f"{daemon.url}/api/generate", json={"model": "coder"}, timeout=120).json()
    assert r["done"] is True and r["done_reason"] == "load"
    assert "coder" in {m.model for m in client.ps().models}
    r = httpx.post(
        f"{daemon.url}/api/generate", json={"model": "coder", "keep_alive": 0}, timeout=120
    ).json()
    assert r["done_reason"] == "unload"
    assert "coder" not in {m.model for m in client.ps().models}
    tags = {m["name"]: m["state"] for m in httpx.get(f"{daemon.url}/api/tags").json()["models"]}
    assert tags["coder"] == "unloaded"
    # the next request loads it again, its load time reported
    g = client.generate(model="coder", prompt="x", options={"num_predict": 1})
    assert g.load_duration and g.load_duration > 0


def _replay(daemon: Daemon, name: str, model: str) -> None:
    steps = json.loads((CLIENTS / f"{name}.json").read_text().replace("{model}", model))
    for step in steps:
        url = f"{daemon.url}{step['path']}"
        r = httpx.request(step["method"], url, json=step.get("body"), timeout=120)
        assert r.status_code == 200, (name, step["path"], r.text)
        expects = step["expects"]
        if "ndjson" in expects:
            lines = [json.loads(line) for line in r.text.splitlines()]
            assert all(expects["ndjson"] in obj for obj in lines), lines
            assert lines[-1]["done"] and "eval_count" in lines[-1]
        if "json" in expects:
            assert expects["json"] in r.json()
        if "parameters_match" in expects:  # Continue parses every line with this
            for line in r.json()["parameters"].split("\n"):
                assert re.match(expects["parameters_match"], line), line
        if "version_at_least" in expects:
            got = tuple(int(p) for p in r.json()["version"].split("."))
            assert got >= tuple(int(p) for p in expects["version_at_least"].split("."))
        if "model_info_context" in expects:
            info = r.json()["model_info"]
            assert info[f"{info['general.architecture']}.context_length"] == 1024
            assert "tools" in r.json()["capabilities"]
        if "sse" in expects:
            assert "data: [DONE]" in r.text


@pytest.mark.parametrize("name", ["continue", "zed", "copilot"])
def test_recorded_client_shapes_replay(daemon: Daemon, default: str, name: str) -> None:
    _replay(daemon, name, "coder" if name == "continue" else default)


def test_openai_sdk_sees_every_model_with_its_state(daemon: Daemon, default: str) -> None:
    oai = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="x", max_retries=0)
    listed = {m.id: m.model_extra for m in oai.models.list().data}
    assert set(listed) == {default, "coder"}
    assert all(extra and extra["state"] in ("loaded", "unloaded") for extra in listed.values())
    with pytest.raises(openai.NotFoundError):
        oai.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
