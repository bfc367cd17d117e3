"""Draft-model speculation (ds4d.serving.draft) on real models, through the real engine loop.

The drafts come from a real second model: for every kit family the same file with its
residual stream steered by a fixed random direction (a model of the same vocabulary that
is right about some tokens and wrong about others, so drafts are both kept and cut), and
for the families that share a vocabulary (qwen3 / qwen3moe, gpt-oss / its MXFP4 twin) the
other family's model. A greedy request generates token for token the same with
`--speculative draft` as with `off`, and its slot's KV holds the same tokens. A sampled
request's drafts are drawn from the draft's distribution q and accepted by the ratio rule;
a chi-square test on the embedded model's logits checks that the tokens generated are
distributed as the target's p, and fails on a rule that resamples from p instead of the
residual. A draft model of another vocabulary is refused at load.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import trio
from trio.testing import MockClock

from ds4d.chat.formats import chat_format_for
from ds4d.chat.types import ChatRequest, Event, Sampling
from ds4d.daemon.metrics import Metrics
from ds4d.engine import Engine
from ds4d.engine.errors import ModelLoadError
from ds4d.engine.sampler import SamplingParams, distribution, make_rng, sample
from ds4d.engine.steering import Steering
from ds4d.serving.decoding import DecodeStep
from ds4d.serving.draft import DraftModel, check_same_vocabulary
from ds4d.serving.gate import ComputeGate
from ds4d.serving.model import ModelServer
from ds4d.serving.speculation import RatioDraw, accept
from ds4d.state.service import StateService
from ds4d.state.slots import Slot
from tests.helpers.kit import kit_families, kit_model
from tests.serving.test_speculation_real import (
    GREEDY,
    REWRITE,
    assert_same,
    chat,
    chi_square_p,
    decoding_for,
    serve,
)

# How far the steered draft is pushed off the target: enough that some greedy drafts are
# wrong, not so far that none is right (gemma3 scales its residual stream up).
STEER = {"gemma3": 1.0, "phi3": 0.1}
STEER_DEFAULT = 0.03
SAME_VOCABULARY = {"qwen3moe": "qwen3", "gpt-oss-mxfp4": "gpt-oss"}


def steered_draft(path: Path, scale: float, ctx: int) -> DraftModel:
    """The model at `path` with every layer's residual pushed along a fixed random
    direction: a different model of the same vocabulary."""
    engine = Engine.open(path, threads=2)
    dirs = np.random.default_rng(0).standard_normal((engine.info.n_layer, engine.info.n_embd))
    engine.set_steering(Steering(dirs=(dirs * scale).astype(np.float32)))
    return DraftModel(engine, ctx)


def completion(prompt: str, max_tokens: int = 48, sampling: Sampling = GREEDY) -> ChatRequest:
    return ChatRequest(messages=[], raw_prompt=prompt, max_tokens=max_tokens, sampling=sampling)


@pytest.mark.parametrize("family", kit_families())
def test_kit_families_generate_the_same_with_a_draft_model(family):
    req = completion("one two three four five six " * 4)
    with Engine.open(kit_model(family), threads=2) as engine:
        (off,) = serve(engine, "off", [req], ctx=512, api="completions")
        draft = steered_draft(kit_model(family), STEER.get(family, STEER_DEFAULT), 512)
        try:
            (on,) = serve(engine, "draft", [req], ctx=512, api="completions", draft=draft)
        finally:
            draft.close()
    assert_same(off, on)
    rec = on.record
    assert 0 < rec.accepted_tokens < rec.drafted_tokens  # drafts both kept and cut


@pytest.mark.parametrize(("target", "drafter"), sorted(SAME_VOCABULARY.items()))
def test_a_model_of_another_family_with_the_same_vocabulary_drafts(target, drafter):
    req = completion("one two three four five six " * 4)
    with Engine.open(kit_model(target), threads=2) as engine:
        draft = DraftModel(Engine.open(kit_model(drafter), threads=2), 512)
        try:
            check_same_vocabulary(engine, draft.engine)
            (off,) = serve(engine, "off", [req], ctx=512, api="completions")
            (on,) = serve(engine, "draft", [req], ctx=512, api="completions", draft=draft)
        finally:
            draft.close()
    assert_same(off, on)
    assert on.record.drafted_tokens > 0


def test_a_draft_model_of_another_vocabulary_is_refused():
    with Engine.open(kit_model("llama"), threads=2) as target:
        with Engine.open(kit_model("qwen2"), threads=2) as other:
            with pytest.raises(ModelLoadError, match="cannot draft for .*vocabularies differ"):
                check_same_vocabulary(target, other)


def one_slot(engine: Engine, mode: str, requests: list[ChatRequest],
             draft: DraftModel | None = None) -> list[tuple[list[Event], list[int], list[int]]]:  # fmt: skip
    """The requests one after another on one slot of one ModelServer: each one's events,
    the slot's tokens after it, and the draft session's tokens after it."""
    ctx = 2048
    state = StateService.create(tokenizer=engine.tokenizer, fingerprint="t", ctx=ctx, kv_dir=None)
    slot = Slot(0, engine.new_session(ctx), ctx)
    server = ModelServer(engine, chat_format_for(engine, ctx), ctx, [slot], state,
                         ComputeGate(), Metrics(), speculative=mode, draft=draft,
                         cost_aware=False)  # fmt: skip
    out: list[tuple[list[Event], list[int], list[int]]] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            for req in requests:
                prepared = await server.prepare(req, "chat")
                async with server.generate(prepared) as stream:
                    events = [ev async for ev in stream]
                held = draft.session_for(slot.session).tokens if draft is not None else []
                out.append((events, slot.session.tokens, held))
            nursery.cancel_scope.cancel()

    trio.run(main, clock=MockClock(autojump_threshold=0.001))
    slot.session.close()
    return out


def test_the_draft_session_follows_its_slot_across_requests(engine, model_path):
    """Three requests in turn on one slot: a rewrite, another prompt (sharing only the
    chat template's first tokens with it), then the rewrite again. The draft session
    follows the slot: after each request it holds a prefix of the slot's tokens (never a
    rejected draft), and every request generates what it generates without speculation."""
    requests = [chat(REWRITE, max_tokens=64), chat("Write a haiku about rain.", max_tokens=40),
                chat(REWRITE, max_tokens=48)]  # fmt: skip
    off = one_slot(engine, "off", requests)
    draft = steered_draft(model_path, STEER_DEFAULT, 2048)
    try:
        on = one_slot(engine, "draft", requests, draft)
    finally:
        draft.close()
    for (events_off, tokens_off, _), (events_on, tokens_on, held) in zip(off, on, strict=True):
        assert events_on == events_off and tokens_on == tokens_off
        assert len(held) > 0 and tokens_on[: len(held)] == held


def test_the_draft_session_takes_the_prompt_as_prefill_work(engine, model_path):
    """A request of one token never drafts (nothing is left to draft for), yet its draft
    session holds the prompt after it: the engine loop evaluated it as prefill work, not
    at a drafting step (a request that drafted would otherwise pay it inside a decode
    step)."""
    draft = steered_draft(model_path, STEER_DEFAULT, 2048)
    try:
        ((_, tokens, held),) = one_slot(engine, "draft", [chat(REWRITE, max_tokens=1)], draft)
    finally:
        draft.close()
    assert len(held) >= len(tokens) - 2 and tokens[: len(held)] == held


def test_a_sampled_request_with_a_draft_model_keeps_drafts_and_finishes(engine, model_path):
    sampling = Sampling(temperature=0.8, top_p=0.95, seed=7)
    draft = steered_draft(model_path, STEER_DEFAULT, 2048)
    try:
        (on,) = serve(engine, "draft", [chat(REWRITE, sampling, max_tokens=64)], draft=draft)
    finally:
        draft.close()
    rec = on.record
    assert rec.generated_tokens == 64 and len(on.text) > 100
    assert 0 < rec.accepted_tokens <= rec.drafted_tokens


# -- the ratio rule's distribution ------------------------------------------------------------


class ResamplingFromP(RatioDraw):
    """A wrong rule: a rejected draft is replaced by a draw from p, not from the residual."""

    def __call__(self, i, logits, params, rng, allowed, drafted):  # type: ignore[no-untyped-def]
        if drafted < 0 or i >= len(self.qs):
            return sample(logits, params, rng, allowed)
        p = distribution(logits, params, allowed)
        assert p is not None
        if rng.random() * self.qs[i][drafted] < p[drafted]:
            return drafted
        return sample(logits, params, rng, allowed)


@pytest.mark.parametrize(("rule", "holds"), [(RatioDraw, True), (ResamplingFromP, False)])
def test_the_ratio_rule_samples_the_models_distribution(engine, rule, holds):
    """For many seeds: two drafts drawn from a q that is not the target's p (a sharper
    temperature over the same top 6), verified as one chunk [pending, d1, d2]. The first
    token generated is distributed as p1, and the second, when d1 = a was kept, as p2
    after a. A rule that resamples a rejected draft from p fails."""
    params = SamplingParams(temperature=1.5, top_k=6)
    q_params = SamplingParams(temperature=0.5, top_k=6)
    session = engine.new_session(256)
    session.eval(engine.tokenizer.encode("The weather today is"))
    n0 = session.n_tokens
    first = int(np.argmax(session.compute_logits()))
    rows_after: dict[tuple[int, ...], np.ndarray] = {}

    def rows(chunk: tuple[int, ...]) -> np.ndarray:
        if chunk not in rows_after:
            rows_after[chunk] = session.eval_all_logits(chunk)
            session.rewind(n0)
        return rows_after[chunk]

    def dist(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
        out = distribution(logits, p)
        assert out is not None
        return out

    p1 = dist(rows((first,))[0], params)
    q1 = dist(rows((first,))[0], q_params)
    assert np.abs(p1 - q1).sum() > 0.3  # q is not p
    n, t1 = 3000, Counter[int]()
    t2: dict[int, Counter[int]] = {}
    fmt = chat_format_for(engine, 256)
    draft_rng = make_rng(12345)
    sampling = Sampling(temperature=1.5, top_k=6)
    q2_after: dict[int, np.ndarray] = {}
    for seed in range(n):
        d1 = int(draft_rng.choice(q1.size, p=q1))
        if d1 not in q2_after:
            q2_after[d1] = dist(rows((first, d1))[1], q_params)
        q2 = q2_after[d1]
        d2 = int(draft_rng.choice(q2.size, p=q2))
        chunk = (first, d1, d2)
        decoding = decoding_for(engine, session, dataclasses.replace(sampling, seed=seed), fmt)
        decoding.pending = [first]
        step = DecodeStep([first], True, params, None)
        accept(decoding, step, list(chunk), rows(chunk), rule([q1, q2]))
        out = decoding.output_ids
        t1[out[0]] += 1
        if out[0] == d1 and len(out) > 1:  # d1 was kept: the second token came from row 1
            t2.setdefault(d1, Counter())[out[1]] += 1
    session.close()
    a = max(t2, key=lambda k: sum(t2[k].values()))
    p2 = dist(rows((first, a))[1], params)
    ok = chi_square_p(t1, p1, n) > 1e-3 and chi_square_p(t2[a], p2, sum(t2[a].values())) > 1e-3
    assert ok == holds
