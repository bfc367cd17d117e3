"""Inline code completion end to end: a real ds4d process on the qwen2 kit model (Qwen2.5's
tokenizer, with its FIM tokens), driven as llama.vim drives llama-server's /infill and as
OpenAI clients send /v1/completions with `suffix`; a model without FIM tokens refused."""

from __future__ import annotations

import functools
import json
import threading

import httpx
import openai
import pytest

from ds4d.chat.fim import Budget, ExtraChunk, InfillInput, assemble
from ds4d.engine.fim import FimTokens, find_fim_tokens
from ds4d.engine.gguf_file import GGUFFile
from ds4d.engine.tokenizer import Tokenizer
from ds4d.state.matching import common_prefix
from tests.e2e.daemon_process import running_daemon
from tests.helpers.kit import kit_model
from tests.helpers.polling import wait_until

CTX = 4096
SOURCE = '''import os


def read_config(path):
    """Read a key=value file into a dict."""
    out = {}
    with open(path) as f:
        for line in f:
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def main():
    cfg = read_config(os.environ.get("CONFIG", "app.conf"))
    print(cfg)
'''
EXTRA = [
    {"filename": "app/util.py", "text": "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n"},
    {
        "filename": "app/io.py",
        "text": "import json\n\ndef load(p):\n    return json.load(open(p))\n",
    },
]


@functools.cache
def vocab() -> tuple[Tokenizer, FimTokens]:
    gf = GGUFFile(kit_model("qwen2"))
    tok = Tokenizer.from_gguf(gf)
    return tok, find_fim_tokens(gf.get, tok)


def expected_ids(body: dict, n_predict: int) -> list[int]:
    """The prompt ds4d must assemble for `body` (its window: llama-server's 2048)."""
    tok, fim = vocab()
    extra = [ExtraChunk(c["text"], c.get("filename", "tmp")) for c in body.get("input_extra", [])]
    inp = InfillInput(body["input_prefix"], body["input_suffix"], body.get("prompt", ""), extra)
    return assemble(tok, fim, inp, Budget(CTX, 2048, n_predict)).ids


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ds4d-infill")
    args = ("-m", str(kit_model("qwen2")), "--ctx", str(CTX), "--threads", "1",
            "--slots", "1", "--max-tokens", "64")  # fmt: skip
    with running_daemon(tmp, *args) as d:
        yield d


def infill(daemon, **body) -> dict:
    r = httpx.post(f"{daemon.url}/infill", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def at_cursor(text: str, cursor: int, **more) -> dict:
    return {"input_prefix": text[:cursor], "input_suffix": text[cursor:],
            "input_extra": EXTRA, **more}  # fmt: skip


def test_infill_answers_with_llama_cpp_fields(daemon):
    body = at_cursor(SOURCE, SOURCE.index("out = {}"), n_predict=4, temperature=0,
                     samplers=["top_k", "top_p", "infill"], top_k=40, top_p=0.99)  # fmt: skip
    reply = infill(daemon, **body)
    assert reply["tokens_evaluated"] == len(expected_ids(body, 4))
    assert reply["stop"] is True and reply["stop_type"] in ("eos", "limit")
    assert 0 <= reply["tokens_predicted"] <= 4 and isinstance(reply["content"], str)
    t = reply["timings"]
    assert t["prompt_n"] == reply["tokens_evaluated"] - t["cache_n"]
    assert reply["tokens_cached"] == reply["tokens_evaluated"] + reply["tokens_predicted"]
    assert t["predicted_n"] == reply["tokens_predicted"] and t["prompt_ms"] > 0
    assert reply["truncated"] is False
    picked = infill(daemon, **body, response_fields=["content", "timings/prompt_n", "no/such"])
    assert set(picked) == {"content", "timings/prompt_n"}


def test_streamed_infill_ends_with_the_full_object(daemon):
    body = at_cursor(SOURCE, 40, n_predict=3, temperature=0, stream=True)
    with httpx.stream("POST", f"{daemon.url}/infill", json=body, timeout=120) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert [e["stop"] for e in events] == [False] * (len(events) - 1) + [True]
    last = events[-1]
    assert last["tokens_evaluated"] == len(expected_ids(body, 3))
    assert last["tokens_predicted"] == len(events) - 1 == 3  # stops ignored: none set


def test_keystrokes_reuse_exactly_the_shared_prefix(daemon):
    """llama.vim's pattern: a warm-up (n_predict 0), then a request per keystroke; with
    one slot every prompt evaluates only the tokens from its first difference with the
    closest state seen before (no more, no fewer), a state seen before (a warm-up
    repeated, a backspace, the cursor back where it was) nothing at all."""
    cursor = SOURCE.index("    return out")
    typed = "    # done\n"
    states = []
    for i in range(len(typed) + 1):
        text = SOURCE[:cursor] + typed[:i] + SOURCE[cursor:]
        states.append((text, cursor + i))
    up = SOURCE.index("    out = {}")
    states += [states[-2], states[-3], states[4],  # backspaces, then a jump back
               (states[6][0], up), states[6], states[7]]  # the cursor up, down, and on  # fmt: skip
    warm = at_cursor(SOURCE, cursor, n_predict=0)
    infill(daemon, **warm)
    again = infill(daemon, **warm)
    assert again["timings"]["cache_n"] == again["tokens_cached"] == len(expected_ids(warm, 0))
    assert again["timings"]["prompt_n"] == 0
    seen = [expected_ids(warm, 0)]
    returns = 0
    for text, at in states:
        body = at_cursor(text, at, n_predict=0)
        ids = expected_ids(body, 0)
        reply = infill(daemon, **body)
        assert reply["tokens_evaluated"] == len(ids)
        if ids in seen:
            shared, returns = len(ids), returns + 1
        else:
            shared = min(max(common_prefix(s, ids) for s in seen), len(ids) - 1)
        assert reply["timings"]["cache_n"] == shared, text[at - 5 : at + 5]
        assert reply["timings"]["prompt_n"] == len(ids) - shared
        seen.append(ids)
    assert returns == 6
    # the extra context and the file up to the cursor's line were never evaluated again
    assert common_prefix(seen[-1], seen[0]) > len(vocab()[0].encode(SOURCE[:300]))


def test_completions_with_suffix_fill_in_the_middle(daemon):
    client = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="none")
    prefix, suffix = SOURCE[:200], SOURCE[200:]
    got = client.completions.create(model="m", prompt=prefix, suffix=suffix, max_tokens=2,
                                    temperature=0)  # fmt: skip
    body = {"input_prefix": prefix, "input_suffix": suffix}
    assert got.usage.prompt_tokens == len(expected_ids(body, 2))  # the suffix is in it
    plain = client.completions.create(model="m", prompt=prefix, max_tokens=2, temperature=0)
    assert plain.usage.prompt_tokens == len(vocab()[0].encode(prefix))


def test_several_candidates_share_the_prompts_evaluation(daemon):
    """n_cmpl: llama-server's array of final objects, each with its index; the prompt is
    evaluated once, and candidate i is the one a single request with seed + i gives."""
    body = at_cursor(SOURCE, SOURCE.index("    return out"), n_predict=6, temperature=1.5, prompt="n = ",
                     top_k=0, top_p=1.0, min_p=0.0, seed=1234)  # fmt: skip
    ids = expected_ids(body, 6)
    infill(daemon, **at_cursor(SOURCE, 7, n_predict=0))  # the slot elsewhere first
    replies = infill(daemon, **body, n_cmpl=3)
    assert isinstance(replies, list) and [r["index"] for r in replies] == [0, 1, 2]
    assert all(r["stop"] is True and r["tokens_evaluated"] == len(ids) for r in replies)
    assert replies[0]["timings"]["prompt_n"] > 0  # a prompt not seen before
    assert [r["timings"]["prompt_n"] for r in replies[1:]] == [0, 0]
    assert [r["timings"]["cache_n"] for r in replies[1:]] == [len(ids), len(ids)]
    for i, r in enumerate(replies):
        infill(daemon, **at_cursor(SOURCE, 7, n_predict=0))
        alone = infill(daemon, **{**body, "seed": 1234 + i})
        assert alone["content"] == r["content"]
    assert len({r["content"] for r in replies}) > 1  # sampled hot: not all the same
    with httpx.stream("POST", f"{daemon.url}/infill", json={**body, "n_cmpl": 2, "stream": True},
                      timeout=120) as s:  # fmt: skip
        assert s.status_code == 200
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    finals = [e for e in events if e["stop"]]
    assert [e["index"] for e in finals] == [0, 1]
    assert [e["index"] for e in events] == sorted(e["index"] for e in events)
    for i in (0, 1):
        text = "".join(e["content"] for e in events if e["index"] == i and not e["stop"])
        assert text == replies[i]["content"]


def test_bad_infill_fields_are_400s_in_llama_cpp_shape(daemon):
    for body, param in (
        ({"input_suffix": ""}, "input_prefix"),
        ({"input_prefix": "", "input_suffix": "", "input_extra": [{"filename": "a"}]}, "text"),
        ({"input_prefix": "", "input_suffix": "", "samplers": ["nope"]}, "sampler"),
        ({"input_prefix": "", "input_suffix": "", "n_cmpl": 17}, "n_cmpl"),
        ({"input_prefix": "", "input_suffix": "", "n_cmpl": 0}, "n_cmpl"),
    ):
        r = httpx.post(f"{daemon.url}/infill", json=body, timeout=30)
        assert r.status_code == 400, body
        err = r.json()["error"]
        assert err["code"] == 400 and param in err["message"], err


def test_metrics_count_completions_and_their_ttft(daemon):
    before = daemon.metrics()
    infill(daemon, **at_cursor(SOURCE, 10, n_predict=2, temperature=0))
    after = wait_until(
        lambda: (
            (m := daemon.metrics())['ds4d_completions_total{outcome="served"}']
            > before['ds4d_completions_total{outcome="served"}']
            and m
        ),
        10,
        "the completion was not counted",
    )
    key = "ds4d_completion_time_to_first_token_seconds_count"
    assert after[key] == before[key] + 1


def test_a_newer_completion_cancels_the_older_one(daemon):
    # long enough that the newer one arrives while it generates, on a loaded machine too
    first = at_cursor(SOURCE, 30, n_predict=1000, id_slot=0, stream=True, temperature=1)
    second = at_cursor(SOURCE, 31, n_predict=1, id_slot=0)
    before = daemon.metrics()['ds4d_completions_total{outcome="cancelled"}']
    events: list[dict] = []
    started = threading.Event()

    def run_first() -> None:
        with httpx.stream("POST", f"{daemon.url}/infill", json=first, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
                    started.set()

    t = threading.Thread(target=run_first)
    t.start()
    assert started.wait(60)
    infill(daemon, **second)
    t.join(120)
    assert sum(1 for e in events if not e["stop"]) < 1000  # cut short, not run to its end
    wait_until(
        lambda: daemon.metrics()['ds4d_completions_total{outcome="cancelled"}'] == before + 1,
        10,
        "the superseded completion was not counted cancelled",
    )


def test_a_model_without_fim_tokens_refuses_in_one_line(tmp_path):
    with running_daemon(tmp_path, "-m", str(kit_model("llama")), "--ctx", "1024",
                        "--threads", "1", "--slots", "1") as d:  # fmt: skip
        r = httpx.post(f"{d.url}/infill", json={"input_prefix": "a", "input_suffix": "b"})
        assert r.status_code == 400
        message = r.json()["error"]["message"]
        assert "fill-in-the-middle" in message and "\n" not in message
        c = httpx.post(f"{d.url}/v1/completions", json={"prompt": "a", "suffix": "b"})
        assert c.status_code == 400 and c.json()["error"]["message"] == message
        plain = httpx.post(f"{d.url}/v1/completions", json={"prompt": "a", "max_tokens": 1})
        assert plain.status_code == 200


def test_a_completion_during_a_long_chat_prefill_answers_first(tmp_path):
    """An agent's 5.7k-token prompt is prefilling on one slot when an editor asks for a
    completion: the completion is answered before the agent's first token, and the
    agent's prefix is still held afterwards (its next turn reuses it)."""
    args = ("-m", str(kit_model("qwen2")), "--ctx", "8192", "--threads", "1", "--slots", "2")
    words = " ".join(f"w{i}" for i in range(1350))
    chat = {"messages": [{"role": "user", "content": words}], "max_tokens": 1, "stream": True}
    with running_daemon(tmp_path, *args) as d:
        order: list[str] = []
        before = d.metrics()["ds4d_prefill_chunks_total"]

        def agent() -> None:
            with httpx.stream("POST", f"{d.url}/v1/chat/completions", json=chat, timeout=300) as r:
                for line in r.iter_lines():  # its one token comes with its finish
                    if '"finish_reason": "' in line:
                        order.append("agent's first token")

        t = threading.Thread(target=agent)
        t.start()
        wait_until(
            lambda: d.metrics()["ds4d_prefill_chunks_total"] > before,
            60,
            "the agent's prefill did not start",
        )
        assert not order, "the agent's prefill ended before the completion was sent"
        reply = infill(d, **at_cursor(SOURCE, 50, n_predict=1, temperature=0))
        order.append("completion")
        t.join(300)
        assert order == ["completion", "agent's first token"]
        assert reply["tokens_predicted"] <= 1
        again = httpx.post(f"{d.url}/v1/chat/completions", json={**chat, "stream": False},
                           timeout=300).json()  # fmt: skip
        usage = again["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] >= usage["prompt_tokens"] - 8


def test_suffix_first_order_keeps_the_suffix_while_typing(tmp_path):
    """--infill-order spm: the suffix goes before the prefix, so a keystroke at the cursor
    evaluates only the last few tokens, however long the suffix."""
    tok, fim = vocab()
    args = ("-m", str(kit_model("qwen2")), "--ctx", str(CTX), "--threads", "1",
            "--slots", "1", "--infill-order", "spm")  # fmt: skip
    cursor = SOURCE.index("    return out")
    with running_daemon(tmp_path, *args) as d:
        previous: list[int] | None = None
        for typed in ("", "p", "pr", "pri"):
            body = at_cursor(SOURCE[:cursor] + typed + SOURCE[cursor:], cursor + len(typed),
                             n_predict=0)  # fmt: skip
            extra = [ExtraChunk(c["text"], c["filename"]) for c in EXTRA]
            inp = InfillInput(body["input_prefix"], body["input_suffix"], "", extra)
            ids = assemble(tok, fim, inp, Budget(CTX, 2048, 0, suffix_first=True)).ids
            assert ids.index(fim.suf) < ids.index(fim.pre)
            reply = infill(d, **body)
            assert reply["tokens_evaluated"] == len(ids)
            if previous is not None:
                assert reply["timings"]["cache_n"] == common_prefix(previous, ids)
                assert reply["timings"]["prompt_n"] <= 4  # the typed tokens and [MID]
            previous = ids
