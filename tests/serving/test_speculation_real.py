"""Speculative decoding changes no output (ds4d.serving.speculation), on real models.

What the guarantee rests on, measured: a verification chunk's per-position logits are
bitwise those of token-by-token decode (up to VERIFY_ROWS tokens) on the embedded model
and every kit family. Then, through the real ModelServer and engine loop: greedy and
seeded outputs are token for token the same with speculation on and off (prompts that
repeat text, so drafts are made and accepted), with stop strings, max_tokens, a forced
tool call whose arguments copy the prompt, a speculating slot decoding beside a plain
one, and the continued checkpoints written at the same lengths. A chi-square test on the
real model's logits checks the acceptance rule's distribution, and fails on a broken rule.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import trio
from trio.testing import MockClock

from ds4d.api import openai_chat
from ds4d.chat.formats import ChatFormat, chat_format_for
from ds4d.chat.types import (
    ChatRequest,
    Event,
    Finish,
    Sampling,
    TextDelta,
    ToolCallEnd,
    ToolCallStart,
)
from ds4d.daemon.metrics import Metrics
from ds4d.engine import Engine
from ds4d.engine.sampler import SamplingParams, make_rng, sample
from ds4d.serving.decoding import DecodeStep, Decoding, OutputSink
from ds4d.serving.draft import DraftModel
from ds4d.serving.gate import ComputeGate
from ds4d.serving.model import ModelServer
from ds4d.serving.speculation import VERIFY_ROWS, Draw, accept, exact_draw, verify
from ds4d.state.service import StateService
from ds4d.state.slots import Slot
from ds4d.state.trace import GenerationRecord
from tests.helpers.kit import kit_families, kit_model

SOURCE = (Path(__file__).resolve().parents[2] / "ds4d" / "serving" / "lookup.py").read_text()
FILE = SOURCE[SOURCE.index("class PromptLookup") :][:900]
REWRITE = f"Repeat this code exactly, with no changes:\n\n{FILE}"
GREEDY = Sampling(temperature=0)


@dataclasses.dataclass
class Run:
    events: list[Event]
    record: GenerationRecord
    session_tokens: list[int]
    saved: list[int]  # lengths of the checkpoints written

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, TextDelta))


def serve(
    engine: Engine,
    mode: str,
    requests: list[ChatRequest],
    *,
    ctx: int = 2048,
    kv_dir: Path | None = None,
    api: str = "chat",
    draft: DraftModel | None = None,
) -> list[Run]:
    """The requests through a fresh ModelServer (one slot each, decoding together)."""
    # continued checkpoints every 96 tokens: several fall inside the generated text
    policy = {"min_tokens": 64, "continued_interval_tokens": 96, "boundary_align_tokens": 0}
    state = StateService.create(tokenizer=engine.tokenizer, fingerprint="t", ctx=ctx,
                                kv_dir=kv_dir, policy=policy)  # fmt: skip
    slots = [Slot(i, engine.new_session(ctx), ctx) for i in range(len(requests))]
    server = ModelServer(engine, chat_format_for(engine, ctx), ctx, slots, state,
                         ComputeGate(), Metrics(), speculative=mode, draft=draft,
                         cost_aware=False)  # fmt: skip
    runs: list[Run | None] = [None] * len(requests)

    async def one(i: int) -> None:
        param = "prompt" if requests[i].raw_prompt is not None else "messages"
        prepared = await server.prepare(requests[i], api, param)
        events: list[Event] = []
        async with server.generate(prepared) as stream:
            async for ev in stream:
                events.append(ev)
        runs[i] = Run(events, prepared.record, [], [])

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            async with trio.open_nursery() as reqs:
                for i in range(len(requests)):
                    reqs.start_soon(one, i)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=MockClock(autojump_threshold=0.001))
    assert state.kv is not None
    state.kv.drain()
    out = []
    for run in runs:
        assert run is not None
        run.session_tokens = slots[run.record.slot].session.tokens
        out.append(run)
    for slot in slots:
        slot.session.close()
    if kv_dir is not None:
        assert state.kv.disk is not None
        out[0].saved = sorted(e.tokens for e in state.kv.disk.entries())
    return out


def chat(text: str, sampling: Sampling = GREEDY, max_tokens: int = 160, **extra) -> ChatRequest:
    req = openai_chat.parse({"messages": [{"role": "user", "content": text}], **extra},
                            Sampling())  # fmt: skip
    sampling = dataclasses.replace(sampling, speculative=req.sampling.speculative)
    return dataclasses.replace(req, sampling=sampling, max_tokens=max_tokens)


def without_ids(events: list[Event]) -> list[Event]:
    """Tool-call ids are drawn fresh for every request."""
    return [dataclasses.replace(e, id="") if isinstance(e, ToolCallStart) else e for e in events]


def assert_same(off: Run, on: Run) -> None:
    assert without_ids(on.events) == without_ids(off.events)
    assert on.session_tokens == off.session_tokens  # the KV holds exactly the same tokens
    assert on.record.generated_tokens == off.record.generated_tokens
    assert off.record.drafted_tokens == 0


# -- the measurement the guarantee rests on -------------------------------------------------


def chunk_equals_steps(engine: Engine, prompt: list[int], rows: int) -> bool:
    steps = engine.new_session(256)
    steps.eval(prompt[:16])
    one = []
    for t in prompt[16 : 16 + rows]:
        steps.eval([t])
        one.append(steps.compute_logits().copy())
    chunk = engine.new_session(256)
    chunk.eval(prompt[:16])
    all_rows = chunk.eval_all_logits(prompt[16 : 16 + rows])
    steps.close()
    chunk.close()
    return all(np.array_equal(a, b) for a, b in zip(all_rows, one, strict=True))


@pytest.mark.parametrize("rows", [2, VERIFY_ROWS])
def test_a_verification_chunk_is_bitwise_token_by_token_decode(engine, rows):
    prompt = engine.tokenizer.encode(FILE)
    assert chunk_equals_steps(engine, prompt, rows)


def decoding_for(engine: Engine, session, sampling: Sampling = GREEDY,
                 fmt: ChatFormat | None = None) -> Decoding:  # fmt: skip
    """A request's decode on a session that holds its prompt (as the loop builds one)."""
    req = ChatRequest(messages=[], raw_prompt="", max_tokens=64, sampling=sampling)
    sink = OutputSink(lambda r, e: None, lambda s, c, t: None, lambda s: None)
    fmt = fmt if fmt is not None else chat_format_for(engine, session.n_ctx)
    return Decoding(req, session, engine.tokenizer, fmt.decode(req),
                    GenerationRecord("completions", 0), sink, arrived=0.0, room=64)  # fmt: skip


@pytest.mark.parametrize("family", kit_families())
def test_kit_families_verify_exactly(family):
    """Every kit family: chunk logits bitwise token-by-token decode's; a draft of the
    model's own greedy continuation is kept whole (plus the model's next token), a draft
    with a wrong token is cut there, and the session then holds what plain decode holds;
    a request through the engine loop generates the same with speculation on and off."""
    with Engine.open(kit_model(family), threads=2) as engine:
        prompt = engine.tokenizer.encode("one two three four five six " * 6)
        assert chunk_equals_steps(engine, prompt, VERIFY_ROWS)
        plain = engine.new_session(256)
        plain.eval(prompt)
        greedy, logits = [], []
        for _ in range(VERIFY_ROWS + 1):
            logits.append(plain.compute_logits())
            greedy.append(sample(logits[-1], SamplingParams(temperature=0), make_rng()))
            plain.eval(greedy[-1:])
        for cut in (VERIFY_ROWS - 1, 3):
            session = engine.new_session(256)
            session.eval(prompt)
            decoding = decoding_for(engine, session)
            decoding.after(greedy[0])
            draft = greedy[1:VERIFY_ROWS]
            if cut < len(draft):  # a wrong token at position `cut`
                draft[cut] = (draft[cut] + 1) % engine.info.n_vocab
            step = decoding.step()
            verified = verify(decoding, session, step, draft)
            assert verified.accepted == cut
            assert decoding.output_ids == greedy[: cut + 2]
            assert session.tokens == prompt + greedy[: cut + 1]  # the model's token pending
            assert decoding.pending == [greedy[cut + 1]]
            if cut == VERIFY_ROWS - 1:  # all kept: the last row's logits are plain decode's
                assert np.array_equal(session.compute_logits(), logits[VERIFY_ROWS])
            session.close()
        plain.close()
        req = ChatRequest(messages=[], raw_prompt="one two three four five six " * 4,
                          max_tokens=48, sampling=GREEDY)  # fmt: skip
        (off,) = serve(engine, "off", [req], ctx=512, api="completions")
        (on,) = serve(engine, "lookup", [req], ctx=512, api="completions")
        assert_same(off, on)


def test_gemma3_drafts_past_512_keys_with_the_same_output():
    """gemma3's verification chunks are bitwise its decode steps at every depth
    (tests/engine/test_batch_forward.py; its drafts once stopped short of 512 keys): a
    repetitive prompt ending just before 512 keys drafts on past them (its sliding window's
    key blocks of 64 crossed at 512 and 576), with the same greedy output."""
    with Engine.open(kit_model("gemma3"), threads=2) as engine:
        req = ChatRequest(messages=[], raw_prompt="one two three four five six " * 80,
                          max_tokens=112, sampling=GREEDY)  # fmt: skip
        (off,) = serve(engine, "off", [req], ctx=1024, api="completions")
        (on,) = serve(engine, "lookup", [req], ctx=1024, api="completions")
    assert_same(off, on)
    rec = on.record
    assert rec.prompt_tokens < 512 < 576 < rec.prompt_tokens + 112
    assert rec.drafted_tokens > 512 - rec.prompt_tokens  # drafts past 512 keys
    assert rec.accepted_tokens > 0


# -- output unchanged through the engine loop -----------------------------------------------


def test_greedy_rewrite_is_unchanged_and_drafts_are_accepted(engine):
    (off,) = serve(engine, "off", [chat(REWRITE)])
    (on,) = serve(engine, "lookup", [chat(REWRITE)])
    assert_same(off, on)
    assert on.events[-1] == Finish("length")
    rec = on.record
    # the model copies much of the file: most drafted tokens are kept
    assert rec.drafted_tokens > 40 and rec.accepted_tokens > rec.drafted_tokens / 2


def test_seeded_sampling_is_token_for_token_unchanged(engine):
    for seed in (1, 2, 3):
        req = chat(REWRITE, Sampling(temperature=0.8, top_p=0.95, seed=seed), max_tokens=96)
        (off,) = serve(engine, "off", [req])
        (on,) = serve(engine, "lookup", [req])
        assert_same(off, on)
        assert on.record.accepted_tokens > 0


def test_stop_strings_and_max_tokens_cut_where_they_cut_without(engine):
    (free,) = serve(engine, "off", [chat(REWRITE)])
    words = free.text.split()
    stop = " ".join(words[12:14])  # a stop string inside the copied text
    for req in (chat(REWRITE, stop=[stop]), chat(REWRITE, max_tokens=37)):
        (off,) = serve(engine, "off", [req])
        (on,) = serve(engine, "lookup", [req])
        assert_same(off, on)
        assert on.record.drafted_tokens > 0
    assert off.record.generated_tokens == 37


def test_a_forced_tool_call_copying_the_prompt_is_unchanged(engine):
    tools = [{"type": "function", "function": {"name": "write_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"},
                                         "content": {"type": "string"}},
        "required": ["path", "content"]}}}]  # fmt: skip
    req = chat(f"Write this into lookup.py:\n\n{FILE}", max_tokens=200, tools=tools,
               tool_choice="required")  # fmt: skip
    (off,) = serve(engine, "off", [req])
    (on,) = serve(engine, "lookup", [req])
    assert_same(off, on)
    assert any(isinstance(e, ToolCallEnd) for e in on.events)
    assert on.record.accepted_tokens > 0  # drafts were kept inside the constrained call


def test_a_speculating_slot_beside_a_plain_one(engine):
    plain = chat("Once upon a time", max_tokens=40, speculative=False)
    assert plain.sampling.speculative is False
    requests = [chat(REWRITE, max_tokens=80), plain]
    off = serve(engine, "off", requests)
    on = serve(engine, "lookup", requests)
    for a, b in zip(off, on, strict=True):
        assert_same(a, b)
    assert on[0].record.drafted_tokens > 0 and on[1].record.drafted_tokens == 0


def test_continued_checkpoints_hold_only_accepted_tokens_at_the_same_lengths(engine, tmp_path):
    req = chat(REWRITE, max_tokens=200)
    (off,) = serve(engine, "off", [req], kv_dir=tmp_path / "off")
    (on,) = serve(engine, "lookup", [req], kv_dir=tmp_path / "on")
    assert_same(off, on)
    assert on.record.accepted_tokens > 0
    assert len(off.saved) >= 2 and on.saved == off.saved
    files = {d: sorted(p.name for p in (tmp_path / d).rglob("*") if p.is_file())
             for d in ("off", "on")}  # fmt: skip
    assert files["on"] == files["off"]  # named by their tokens' text: the same tokens


# -- the acceptance rule's distribution -----------------------------------------------------


def probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The sampler's distribution for top_k at a temperature, computed here from scratch."""
    top = np.argpartition(-logits, params.top_k)[: params.top_k]
    top = top[np.argsort(-logits[top], kind="stable")]
    p = np.zeros(logits.size)
    w = np.exp((logits[top] - logits[top[0]]) / params.temperature)
    p[top] = w / w.sum()
    return p


def chi_square_p(counts: Counter[int], p: np.ndarray, n: int) -> float:
    """The p-value of the counts against the distribution p (categories of expected count
    below 5 pooled), from scipy-free Wilson-Hilferty."""
    expected = {int(t): n * float(q) for t, q in enumerate(p) if q > 0}
    big = {t for t, e in expected.items() if e >= 5}
    stat, dof = 0.0, -1
    for t in big:
        stat += (counts[t] - expected[t]) ** 2 / expected[t]
        dof += 1
    rest_e = n - sum(expected[t] for t in big)
    rest_o = n - sum(counts[t] for t in big)
    if rest_e >= 5:
        stat += (rest_o - rest_e) ** 2 / rest_e
        dof += 1
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def broken_draw(i, logits, params, rng, allowed, drafted):  # type: ignore[no-untyped-def]
    """A wrong rule: keeps the draft with probability min(1, 2 p(d))."""
    p = probabilities(logits, params)
    if drafted >= 0 and rng.random() < min(1.0, 2 * p[drafted]):
        return drafted
    return sample(logits, params, rng, allowed)


@pytest.mark.parametrize(("draw", "holds"), [(exact_draw, True), (broken_draw, False)])
def test_the_acceptance_rule_samples_the_models_distribution(engine, draw: Draw, holds):
    """For many seeds, the first two tokens generated from a verification chunk [pending,
    d1, d2]: the first is distributed as the model's p1, and the second, when d1 was kept,
    as p2 (the logits after d1). A rule that favours the draft fails."""
    params = SamplingParams(temperature=1.5, top_k=6)
    sampling = Sampling(temperature=1.5, top_k=6, min_p=0.0)
    session = engine.new_session(256)
    session.eval(engine.tokenizer.encode("The weather today is"))
    n0 = session.n_tokens
    first = int(np.argmax(session.compute_logits()))
    session.eval([first])
    p1 = probabilities(session.compute_logits(), params)
    second = int(np.argsort(-p1)[1])  # the draft: plausible, not certain
    assert 0.05 < p1[second] < 0.45
    session.rewind(n0)
    chunk = [first, second, first]
    rows = session.eval_all_logits(chunk)
    assert np.array_equal(probabilities(rows[0], params), p1)
    p2 = probabilities(rows[1], params)
    n, t1, t2 = 3000, Counter[int](), Counter[int]()
    fmt = chat_format_for(engine, 256)
    for seed in range(n):
        decoding = decoding_for(engine, session, dataclasses.replace(sampling, seed=seed), fmt)
        decoding.pending = [first]
        accept(decoding, DecodeStep([first], True, params, None), chunk, rows, draw)
        out = decoding.output_ids
        t1[out[0]] += 1
        if out[0] == second:
            t2[out[1]] += 1
    session.close()
    ok = chi_square_p(t1, p1, n) > 1e-3 and chi_square_p(t2, p2, t1[second]) > 1e-3
    assert ok == holds
