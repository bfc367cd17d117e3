"""Fair prefill on a real ds4d (two slots, the embedded model, the real openai SDK): a
short request sent while another slot prefills a long prompt gets its first token after
at most the chunk being computed and its own prefill, and its last within a few chunks
more, not one chunk per generated token.

Measured in the daemon's prefill engine calls (`ds4d_prefill_chunks_total`), not in
seconds: the long prompt must still be prefilling when the short answer ends, and the
chunks counted from the short request's entry (its stream's first chunk) to its first
and its last token bound how long it waited, whatever the machine's speed (each chunk is
sized to a fixed engine time, so the decode steps' share of the credit it earns does not
depend on the load)."""

from __future__ import annotations

import openai
import pytest

from tests.e2e.daemon_process import Daemon, running_daemon
from tests.helpers.polling import wait_until

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


def _chunks(daemon: Daemon) -> int:
    return int(daemon.metrics()["ds4d_prefill_chunks_total"])


def _busy_slots(daemon: Daemon) -> list[tuple[int, int]]:
    """(index, tokens held) of each busy slot."""
    m = daemon.metrics()
    busy = [i for i in range(2) if m[f'ds4d_slot_busy{{slot="{i}"}}'] == 1]
    return [(i, int(m[f'ds4d_slot_tokens{{slot="{i}"}}'])) for i in busy]


def test_short_request_is_answered_within_a_few_chunks_of_a_long_prefill(daemon, oai):
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
            lambda: any(n >= 512 for _, n in _busy_slots(daemon)),
            120,
            "the long prefill never got going",
        )
        ((slot, before),) = _busy_slots(daemon)
        sent: int | None = None
        at_first: int | None = None
        tokens = 0
        stream = oai.chat.completions.create(
            model="m",
            max_tokens=SHORT_TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "Write a long story about a dragon."}],
        )
        for chunk in stream:
            # Counted from the stream's first chunk (the role): the daemon sends it once
            # the prompt is prepared, just before the request goes to the engine loop.
            # Counted from the sending instead, the HTTP request's way in (its connection,
            # the template, the tokenizer) would count as chunks on a loaded machine.
            if sent is None:
                sent = _chunks(daemon)
            if chunk.choices and chunk.choices[0].delta.content and at_first is None:
                at_first = _chunks(daemon)
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        at_end = _chunks(daemon)
        m = daemon.metrics()
        after = int(m[f'ds4d_slot_tokens{{slot="{slot}"}}'])
        # (+1: the short request's own first token)
        ended = m[TTFT_COUNT] != first_tokens + 1
        assert not ended, "the long prefill ended first: the test proves nothing"
    assert tokens == SHORT_TOKENS
    assert sent is not None and at_first is not None
    # Before its first token: the long chunk being computed when it arrived, its own
    # prefill, and one more finished while the metrics were read. One token per chunk
    # would take 17+ chunks (its prefill, then 16 tokens).
    assert at_first - sent <= 3, (sent, at_first, at_end)
    # Its 16 tokens come in bursts between the long prompt's chunks, each burst as much
    # decode time as a chunk took: a few chunks, not one per token.
    assert at_end - sent <= 6, (sent, at_first, at_end)
    assert before < after < 3300, (before, after)
