"""KV state as an asset, end to end: real ds4d processes on the embedded model, restarted
with SIGTERM and killed with SIGKILL, driven by the real openai SDK; the cache decision of
every request is read back from the --trace file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import openai
import pytest

from ds4d.state import kvfile
from tests.e2e.daemon_process import running_daemon, runtime_dir
from tests.helpers.polling import wait_until


@pytest.fixture(scope="module")
def book(data_dir) -> str:
    return (data_dir / "text" / "promessi_sposi.txt").read_text()


def client(d) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{d.url}/v1", api_key="none", max_retries=0, timeout=600)


def traces(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def start(tmp: Path, *args: str):
    kv, trace = tmp / "kv", tmp / "trace.jsonl"
    return running_daemon(tmp, "--kv-disk", "--kv-disk-dir", str(kv), "--trace", str(trace), *args)


def ask(c: openai.OpenAI, messages: list[dict], max_tokens: int = 8, **kw):
    return c.chat.completions.create(
        model="ds4d", messages=messages, max_tokens=max_tokens, temperature=0, **kw
    )


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def test_restart_reuses_a_long_prompt_from_disk(tmp_path, book):
    """~6000-token prompt cold; SIGTERM; restart; same conversation plus one user turn:
    >= 5000 cached tokens from disk-text, time to first token <= 10% of the cold one."""
    trace = tmp_path / "trace.jsonl"
    messages = [
        {"role": "system", "content": "You summarise Italian novels."},
        {"role": "user", "content": "Summarise this chapter:\n" + book[:15500]},
    ]
    with start(tmp_path, "--slots", "1") as d:
        first = ask(client(d), messages)
        assert 5500 <= first.usage.prompt_tokens <= 7000
        assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert "saved 1 slot(s) to the disk KV cache" in d.log()

    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Now in one sentence."},
    ]
    with start(tmp_path, "--slots", "1") as d:
        second = ask(client(d), messages, max_tokens=4)
    cold, warm = traces(trace)
    assert (cold["cache_source"], warm["cache_source"]) == ("none", "disk-text")
    assert second.usage.prompt_tokens_details.cached_tokens == warm["cached_tokens"] >= 5000
    assert warm["disk_file"] and warm["ttft_s"] <= 0.10 * cold["ttft_s"], (cold, warm)
    assert kvfile.read_header(tmp_path / "kv" / warm["disk_file"]).hits == 1


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city",
        "parameters": {
            "type": "object",
            "required": ["city", "unit", "days"],
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string"},
                "days": {"type": "integer"},
            },
        },
    },
}


def reserialized(arguments: str) -> str:
    """What some clients send back: other key order, other spacing."""
    return json.dumps(dict(reversed(json.loads(arguments).items())), indent=2)


def test_tool_replay_with_reserialized_arguments_survives_restart(tmp_path):
    trace = tmp_path / "trace.jsonl"
    messages = [
        {"role": "system", "content": "You are a weather bot. " * 60},
        {"role": "user", "content": "Weather in Rome for 3 days in celsius?"},
    ]
    with start(tmp_path, "--slots", "1", "--ctx", "2048", "--trace-content") as d:
        c = client(d)
        first = ask(c, messages, max_tokens=80, tools=[WEATHER], tool_choice="required")
        (call,) = first.choices[0].message.tool_calls
        (record,) = traces(trace)  # opted in: the rendered prompt and the output
        assert (
            record["prompt"].startswith("<|im_start|>system") and "weather bot" in record["prompt"]
        )
        assert call.id in record["output"] and record["finish_reason"] == "tool_calls"
        assert reserialized(call.function.arguments) != call.function.arguments
        history = messages + [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {
                            "name": call.function.name,
                            "arguments": reserialized(call.function.arguments),
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call.id, "content": "sunny, 25C"},
        ]
        second = ask(c, history, tools=[WEATHER])
        # everything the slot held (prompt + the sampled call) is reused
        held = first.usage.prompt_tokens + first.usage.completion_tokens
        assert second.usage.prompt_tokens_details.cached_tokens >= held
        assert traces(trace)[-1]["cache_source"] in ("memory-token", "memory-text")

        # contrast: an id the daemon never handed out cannot be replayed, so the
        # re-serialized arguments change the prompt bytes and reuse stops before them
        other = json.loads(json.dumps(history).replace(call.id, "call_" + "0" * 32))
        contrast = ask(c, other, tools=[WEATHER])
        assert contrast.usage.prompt_tokens_details.cached_tokens < held
        # back to the real conversation (its state is on disk from the contrast's evict)
        second = ask(c, history, tools=[WEATHER])

    history += [
        {"role": "assistant", "content": second.choices[0].message.content},
        {"role": "user", "content": "Thanks!"},
    ]
    with start(tmp_path, "--slots", "1", "--ctx", "2048") as d:
        third = ask(client(d), history, tools=[WEATHER])
    last = traces(trace)[-1]
    assert last["cache_source"] == "disk-text"
    assert third.usage.prompt_tokens_details.cached_tokens >= held


def test_evicted_conversations_come_back_from_disk_within_budget(tmp_path, book):
    """N+1 long conversations through N slots, then the first again: a disk hit reusing
    >= 90% of it; with a small budget the directory stays within it after every request.
    (A conversation's checkpoints are one full file and deltas of its new rows, about
    20 MB each in the default f16 KV; 50 MB holds two.)"""
    budget_mb = 50
    kv = tmp_path / "kv"
    talks = [
        [{"role": "user", "content": f"Riassumi:\n{book[i * 2500 : (i + 1) * 2500]}"}]
        for i in range(3)
    ]
    with start(
        tmp_path, "--slots", "2", "--ctx", "2048", "--kv-disk-space-mb", str(budget_mb)
    ) as d:
        c = client(d)
        replies = []
        for talk in talks:
            r = ask(c, talk)
            replies.append(r)
            assert dir_bytes(kv) <= budget_mb * 2**20
        again = talks[0] + [
            {"role": "assistant", "content": replies[0].choices[0].message.content},
            {"role": "user", "content": "E poi?"},
        ]
        r = ask(c, again)
        assert dir_bytes(kv) <= budget_mb * 2**20
        # checkpoints are written in the background: compare the directory once they are
        wait_until(lambda: d.metrics()["ds4d_kv_disk_pending_writes"] == 0, 120,
                   "checkpoint writes still pending")  # fmt: skip
        assert dir_bytes(kv) <= budget_mb * 2**20
        metrics = d.metrics()
        last = traces(tmp_path / "trace.jsonl")[-1]

        # the admin channel sees the same cache, and can empty it
        stats = ds4ctl(tmp_path, "cache", "stats")
        assert stats["entries"] == len(list(kv.glob("*.kv"))) > 0
        assert stats["bytes_written"] == metrics["ds4d_kv_disk_bytes_written_total"]
        listing = ds4ctl(tmp_path, "cache", "ls")
        assert {e["name"] for e in listing} == {p.name for p in kv.glob("*.kv")}
        assert listing[0]["reason"] in ("cold", "continued", "evict")
        ds4ctl(tmp_path, "cache", "evict", "--all")
        assert list(kv.glob("*.kv")) == []

        # tracing switched off and on at runtime
        n = len(traces(tmp_path / "trace.jsonl"))
        ds4ctl(tmp_path, "trace", "off")
        ask(c, again)
        assert len(traces(tmp_path / "trace.jsonl")) == n
        ds4ctl(tmp_path, "trace", "on", str(tmp_path / "trace.jsonl"))
        ask(c, again)
        assert len(traces(tmp_path / "trace.jsonl")) == n + 1
    assert last["cache_source"] == "disk-text"
    first_prompt = replies[0].usage.prompt_tokens
    assert r.usage.prompt_tokens_details.cached_tokens >= 0.9 * first_prompt
    assert metrics["ds4d_kv_disk_evictions_total"] >= 1  # the budget really was binding
    assert metrics["ds4d_kv_disk_bytes_written_total"] > budget_mb * 2**20


def test_kill_9_mid_write_and_damaged_files_never_accepted(tmp_path, book):
    kv = tmp_path / "kv"
    talk = [{"role": "user", "content": "Riassumi:\n" + book[:2500]}]

    # 1. SIGKILL while a checkpoint is being written
    with start(tmp_path, "--slots", "1", "--ctx", "2048") as d:
        worker = threading.Thread(target=lambda: _swallow(ask, client(d), talk), daemon=True)
        worker.start()

        def writing() -> bool:
            return kv.is_dir() and any(kvfile.TMP_MARKER in n for n in os.listdir(kv))

        # a fine interval: the write lasts a moment, and the kill must land inside it
        wait_until(writing, 300, "no checkpoint write was observed", interval=0.002)
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        worker.join(10)
    assert any(kvfile.TMP_MARKER in n for n in os.listdir(kv))

    # 2. a fresh start drops the partial file and answers; SIGTERM leaves good files
    with start(tmp_path, "--slots", "1", "--ctx", "2048") as d:
        assert ask(client(d), talk).choices[0].finish_reason
        assert "removing unfinished write" in d.log()
    assert not any(kvfile.TMP_MARKER in n for n in os.listdir(kv))
    # (the shutdown checkpoint goes last: it holds the reply too, so it is no prefix of
    # the prompt and never loaded for it)
    files = sorted(
        kv.glob("*.kv"),
        key=lambda p: (
            kvfile.read_header(p).reason != kvfile.Reason.SHUTDOWN,
            kvfile.read_header(p).tokens,
        ),
    )
    assert len(files) >= 2

    # 3. damage every file: the longest prefix of the prompt bit-flipped in its KV rows
    #    (found on load), the others truncated (found when listing); the request still
    #    succeeds, cold
    raw = bytearray(files[-1].read_bytes())
    raw[len(raw) // 2] ^= 0x40
    files[-1].write_bytes(bytes(raw))
    for p in files[:-1]:
        with open(p, "r+b") as f:
            f.truncate(p.stat().st_size - 1000)
    with start(tmp_path, "--slots", "1", "--ctx", "2048") as d:
        r = ask(client(d), talk)
        log = d.log()
    assert r.choices[0].finish_reason and r.usage.prompt_tokens_details.cached_tokens == 0
    assert traces(tmp_path / "trace.jsonl")[-1]["cache_source"] == "none"
    assert log.count("rejected") == len(files)
    assert sorted(p.name for p in (kv / "quarantine").iterdir()) == sorted(p.name for p in files)


def ds4ctl(tmp: Path, *args: str):
    """Run the real ds4ctl against the daemon started in `tmp`; its JSON result."""
    env = dict(os.environ, XDG_RUNTIME_DIR=str(runtime_dir(tmp)))
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from ds4ctl.cli import main; sys.exit(main(sys.argv[1:]))",
            "--json",
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _swallow(fn, *args):
    try:
        fn(*args)
    except (openai.APIError, httpx.HTTPError):
        pass  # the daemon was killed under it


def test_a_growing_conversation_writes_each_row_once(tmp_path, book, engine):
    """A conversation growing turn by turn on a real daemon: its first checkpoint is a full
    file, every later one a delta holding only the rows added since the one before (the
    rest of a file is its header, key text, new token ids and last logits), and the bytes
    /metrics counts as written are exactly those files: no prefix is written twice."""
    row = engine.model.kv_token_bytes("f16")
    logits = 4 * engine.info.n_vocab
    flags = ("--slots", "1", "--ctx", "4096", "--kv-type", "f16",
             "--kv-cache-continued-interval-tokens", "512",
             "--kv-cache-boundary-align-tokens", "256")  # fmt: skip
    messages: list[dict] = []
    with start(tmp_path, *flags) as d:
        c = client(d)
        prompt = 0
        for turn in range(6):
            part = book[2000 + 1100 * turn : 2000 + 1100 * (turn + 1)]
            messages.append({"role": "user", "content": f"Riassumi:\n{part}"})
            r = ask(c, messages)
            if turn:
                assert r.usage.prompt_tokens_details.cached_tokens > prompt
            prompt = r.usage.prompt_tokens
            messages.append({"role": "assistant", "content": r.choices[0].message.content})
        wait_until(lambda: d.metrics()["ds4d_kv_disk_pending_writes"] == 0, 120,
                   "checkpoint writes still pending")  # fmt: skip
        written = d.metrics()["ds4d_kv_disk_bytes_written_total"]
        files = sorted(ds4ctl(tmp_path, "cache", "ls"), key=lambda f: f["tokens"])
    assert prompt > 2048 and len(files) >= 4, (prompt, files)
    assert written == sum(f["bytes"] for f in files)
    assert not files[0]["base"]
    by_name = {f["name"]: f for f in files}
    for prev, f in zip(files, files[1:], strict=False):
        assert f["base"] == prev["name"], "each checkpoint extends the one before"
        new = f["tokens"] - by_name[f["base"]]["tokens"]
        rest = f["bytes"] - new * row - f["text_bytes"]
        assert 0 < rest <= 1024 + 4 * new + logits, (f, new, rest)
