"""Fair prefill on a real ds4d (two slots, the embedded model, the real openai SDK): a
short request sent while another slot prefills a long prompt gets its first token after
at most the chunk being computed and its own prefill, and its last within a chunk more,
not one chunk per generated token.

Measured in the daemon's prefill engine calls (`ds4d_prefill_chunks_total`), not in
seconds: the long prompt must still be prefilling when the short answer ends, and the
chunks counted from the short request's sending to its first and its last token bound
how long it waited, whatever the machine's speed (each chunk is sized to a fixed engine
time, so the decode steps' share of the credit it earns does not depend on the load)."""

from __future__ import annotations

import threading

import openai
import pytest

from tests.e2e.daemon_process import Daemon, running_daemon
from tests.polling import wait_until

SHORT_TOKENS = 16


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


def test_short_request_is_answered_within_a_chunk_or_two_of_a_long_prefill(daemon, oai):
    done = threading.Event()
    failure: list[BaseException] = []

    def long_request() -> None:
        try:
            oai.chat.completions.create(
                model="m", max_tokens=1, messages=[{"role": "user", "content": "word " * 3300}]
            )
        except BaseException as e:  # reported by the test body
            failure.append(e)
        done.set()

    t = threading.Thread(target=long_request)
    t.start()
    try:
        wait_until(
            lambda: done.is_set() or any(n >= 512 for _, n in _busy_slots(daemon)),
            120,
            "the long prefill never got going",
        )
        assert not done.is_set(), "the long request ended before the short one was sent"
        ((slot, before),) = _busy_slots(daemon)
        sent = _chunks(daemon)
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
            if chunk.choices and chunk.choices[0].delta.content and at_first is None:
                at_first = _chunks(daemon)
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        at_end = _chunks(daemon)
        after = int(daemon.metrics()[f'ds4d_slot_tokens{{slot="{slot}"}}'])
        assert not done.is_set(), "the long prefill ended first: the test proves nothing"
    finally:
        t.join(300)
    assert not failure
    assert tokens == SHORT_TOKENS
    assert at_first is not None
    # Before its first token: the long chunk being computed when it arrived, its own
    # prefill, and one more finished while the metrics were read. One token per chunk
    # would take 17+ chunks (its prefill, then 16 tokens).
    assert at_first - sent <= 3, (sent, at_first, at_end)
    # Its 16 tokens come in bursts between the long prompt's chunks, each burst as much
    # decode time as a chunk took: a few chunks, not one per token.
    assert at_end - sent <= 6, (sent, at_first, at_end)
    assert before < after < 3300, (before, after)
