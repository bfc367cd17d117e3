"""The first requests real agent clients send (Claude Code, Codex CLI), replayed as they
were captured against a real ds4d: accepted with 200 and the right stream type.

These prompts are 10-20k tokens, above SmolLM2's trained 8k, so this daemon runs a single
32k slot (allowed with a warning). Each stream is dropped once its headers arrive: the
daemon must then cancel the prefill and free the slot for the next one."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.e2e.daemon_process import running_daemon
from tests.helpers.polling import wait_until

FIXTURES = ["claude-code-2.1.197-first-request.json", "codex-cli-0.171.0-first-request.json"]
DROPPED_HEADERS = {"accept-encoding", "connection", "host", "content-length"}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with running_daemon(
        tmp_path_factory.mktemp("ds4d-clients"), "--slots", "1", "--ctx", "32768"
    ) as d:
        yield d


def load(data_dir, name):
    return json.loads((data_dir / "fixtures" / "clients" / name).read_text())


def test_ctx_above_training_is_a_warning(daemon):
    assert "above the model's trained context" in daemon.log()


def test_claude_code_head_probe(daemon):
    assert httpx.head(f"{daemon.url}/").status_code == 200


@pytest.mark.parametrize("name", FIXTURES)
def test_first_request_accepted_as_sent(daemon, data_dir, name):
    fx = load(data_dir, name)
    headers = {k: v for k, v in fx["headers"].items() if k.lower() not in DROPPED_HEADERS}
    with httpx.Client(timeout=120) as client:
        with client.stream(
            fx["method"],
            daemon.url + fx["path"],
            headers=headers,
            content=json.dumps(fx["body"]).encode(),
        ) as r:
            assert r.status_code == 200, r.read()
            assert r.headers["content-type"].startswith("text/event-stream")
            # A long prefill is no silence: the first event (Anthropic's message_start,
            # Responses' response.created) arrives long before the prompt is prefilled.
            t0 = time.monotonic()
            first = next(r.iter_raw())
            assert time.monotonic() - t0 < 8
            assert first.startswith((b"event: message_start", b"event: response.created"))
    # Dropped mid-prefill: the single slot must come free again.
    wait_until(lambda: daemon.metrics()["ds4d_requests_running"] == 0, 30, "slot never freed")


def test_claude_code_request_counts_its_tokens(daemon, data_dir):
    body = load(data_dir, FIXTURES[0])["body"]
    body = {k: body[k] for k in ("model", "messages", "system", "tools", "thinking")}
    r = httpx.post(f"{daemon.url}/v1/messages/count_tokens", json=body, timeout=60)
    assert r.status_code == 200
    assert r.json()["input_tokens"] > 5000
