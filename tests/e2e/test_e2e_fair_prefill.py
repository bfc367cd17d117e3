"""Fair prefill on a real ds4d (two slots, the embedded model, the real openai SDK): a
short request sent while another slot prefills a long prompt is answered within a few of
that prefill's chunks, not one chunk per generated token.

Measured in the long prompt's own progress, not in seconds: `ds4d_slot_tokens` shows the
prefilling slot's KV growing chunk by chunk (256 tokens each)."""

from __future__ import annotations

import openai
import pytest

from tests.e2e.daemon_process import Daemon, running_daemon
from tests.polling import wait_until

CHUNK = 256  # ds4d.state.slots.PREFILL_CHUNK
SHORT_TOKENS = 16
TTFT_COUNT = "ds4d_time_to_first_token_seconds_count"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ds4d-fair")
    with running_daemon(tmp, "--slots", "2", "--ctx", "4096") as d:
        yield d


@pytest.fixture(scope="module")
def oai(daemon):
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="x", max_retries=0, timeout=120)


def _busy_slot_tokens(daemon: Daemon) -> tuple[int, int]:
    """(index, tokens held) of the one busy slot."""
    m = daemon.metrics()
    busy = [i for i in range(2) if m[f'ds4d_slot_busy{{slot="{i}"}}'] == 1]
    assert len(busy) == 1
    return busy[0], int(m[f'ds4d_slot_tokens{{slot="{busy[0]}"}}'])


def test_short_request_finishes_within_a_few_chunks_of_a_long_prefill(daemon, oai):
    # The long request streams: its first chunk (the role) comes before its prefill, and
    # once the short request is answered the stream is closed, which cancels the rest of
    # the prefill (nothing is left to learn from it). Its first token, had it come, would
    # have counted in the time-to-first-token samples: that it has not shows the long
    # prefill still running when the short request ended.
    first_tokens = daemon.metrics()[TTFT_COUNT]
    with oai.chat.completions.create(
        model="m",
        max_tokens=1,
        stream=True,
        messages=[{"role": "user", "content": "word " * 3300}],
    ) as long_stream:
        assert next(iter(long_stream)).choices[0].delta.role == "assistant"
        wait_until(
            lambda: daemon.metrics()["ds4d_requests_running"] == 1,
            60,
            "the long request never started",
        )
        slot, before = _busy_slot_tokens(daemon)
        r = oai.chat.completions.create(
            model="m",
            max_tokens=SHORT_TOKENS,
            temperature=0,
            messages=[{"role": "user", "content": "Write a long story about a dragon."}],
        )
        m = daemon.metrics()
        after = int(m[f'ds4d_slot_tokens{{slot="{slot}"}}'])
        # (+1: the short request's own first token)
        ended = m[TTFT_COUNT] != first_tokens + 1
        assert not ended, "the long prefill ended first: the test proves nothing"
    assert r.usage is not None and r.usage.completion_tokens == SHORT_TOKENS
    # One token per chunk would take 17+ chunks (its prefill, then 16 tokens); fairly
    # scheduled, the short request waits for about one chunk before its prefill and one
    # before its first token, and its tokens then come in bursts between chunks.
    assert after - before <= 5 * CHUNK, (before, after)
