"""Batched decode on real ds4d processes (the embedded model): four concurrent greedy
requests on a 4-slot daemon produce exactly the text each produces alone on a 1-slot
daemon, and their decode steps ran in batches (/metrics and `ds4ctl status`).

Both daemons start cold and every request is checked to be a cold prefill, so the only
difference between the runs is that the four decodes share engine calls."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx

from tests.e2e.daemon_process import Daemon, running_daemon, runtime_dir
from tests.helpers.together import run_together

BIN = Path(sys.executable).parent
MAX_TOKENS = 32
PROMPTS = [
    "Write a short poem about the sea.",
    "Describe a forest in autumn.",
    "Write a letter to a friend about your holiday.",
    "Tell me a story about a brave mouse.",
]


def ask(daemon: Daemon, prompt: str, stream: bool) -> tuple[str, int]:
    """(text, completion tokens) of one greedy chat request, streamed or not."""
    body = {
        "model": "m",
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "messages": [{"role": "user", "content": prompt}],
    }
    url = f"{daemon.url}/v1/chat/completions"
    if not stream:
        r = httpx.post(url, json=body, timeout=300)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # cold
        return out["choices"][0]["message"]["content"], out["usage"]["completion_tokens"]
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    text, usage = [], None
    with httpx.stream("POST", url, json=body, timeout=300) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                text.append(choice["delta"].get("content") or "")
            usage = chunk.get("usage") or usage
    assert usage is not None and usage["prompt_tokens_details"]["cached_tokens"] == 0
    return "".join(text), usage["completion_tokens"]


def test_concurrent_greedy_streams_match_each_alone_and_decode_in_batches(tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "four").mkdir()
    with running_daemon(tmp_path / "one", "--slots", "1", "--ctx", "1024") as one:
        alone = [ask(one, p, stream=False) for p in PROMPTS]
    assert all(n >= MAX_TOKENS // 2 for _, n in alone), alone  # long enough to overlap

    with running_daemon(tmp_path / "four", "--slots", "4", "--ctx", "1024") as four:
        before = four.metrics()
        results = run_together(
            [lambda i=i: ask(four, PROMPTS[i], stream=i % 2 == 1) for i in range(len(PROMPTS))]
        )
        after = four.metrics()
        status = subprocess.run(
            [str(BIN / "ds4ctl"), "--json", "status", "--socket",
             str(runtime_dir(tmp_path / "four") / "ds4d" / "ds4d.sock")],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert results == alone

    steps = after["ds4d_decode_steps_total"] - before["ds4d_decode_steps_total"]
    slots = after["ds4d_decode_step_slots_total"] - before["ds4d_decode_step_slots_total"]
    # Each request takes one step per token sampled and one that evaluates its last token.
    assert slots == sum(n + 1 for _, n in alone)
    assert slots / steps >= 2, (steps, slots)  # batched: four decodes shared their calls
    assert status.returncode == 0, status.stderr
    decode = json.loads(status.stdout)["decode"]
    assert decode["steps"] == steps and decode["slot_steps"] == slots
    assert decode["mean_batch"] == round(slots / steps, 2)
