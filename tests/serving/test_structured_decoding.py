"""A structured answer through the serving decode (ds4d.serving.decoding) on a real
engine: the kit's Qwen2 model with QwQ's template, whose prompt opens the thinking block.

With thinking on, the reasoning is the model's own, unconstrained, and the JSON starts
once the block is closed; with thinking off (the prompt closes the block) the first token
is already the JSON's. The random kit model would rarely write `</think>` itself, so the
test plays the reasoning tokens (as a model would sample them) and lets the model sample
the rest at temperature 1."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from ds4d.chat.constrain import VocabIndex
from ds4d.chat.formats import TemplateChatFormat
from ds4d.chat.structured import JsonVocab, json_output
from ds4d.chat.template import ChatTemplate
from ds4d.chat.toolsyntax import prefixed
from ds4d.chat.types import (
    ChatRequest,
    Finish,
    Message,
    OutputFormat,
    ReasoningDelta,
    Sampling,
    TextDelta,
)
from ds4d.engine import Engine
from ds4d.engine.sampler import make_rng, sample
from ds4d.serving.decoding import Decoding, OutputSink
from ds4d.state.trace import GenerationRecord
from tests.helpers.kit import kit_model

QWQ = Path(__file__).resolve().parents[1] / "e2e" / "templates" / "Qwen-QwQ-32B.jinja"
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "units": {"enum": ["c", "f"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["city", "days", "units"],
}


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    with Engine.open(kit_model("qwen2"), threads=2) as e:
        yield e


@pytest.fixture(scope="module")
def fmt(engine: Any) -> TemplateChatFormat:
    tok = engine.tokenizer
    return TemplateChatFormat(
        ChatTemplate(QWQ.read_text(), tok.decode([tok.bos_id]) if tok.bos_id is not None else "",
                     tok.decode([tok.eos_id]))
    )  # fmt: skip


@pytest.fixture(scope="module")
def jv(engine: Any) -> JsonVocab:
    return JsonVocab(VocabIndex.from_tokenizer(engine.tokenizer, engine.info.n_vocab))


def run(
    engine: Any, fmt: TemplateChatFormat, jv: JsonVocab, req: ChatRequest, played: list[int]
) -> tuple[str, str, Finish, list[bool], int]:
    """Decode `req` to its end: the tokens `played` first (while the step leaves the
    choice free), then the model's own samples. Returns (reasoning, text, finish, and per
    sampled step whether it was constrained, and the tokens generated)."""
    assert req.output_format is not None
    start = fmt.structured_start(req)
    answer = json_output(jv, req.output_format)
    if start.prefix:
        answer = prefixed(start.prefix, answer)
    tok = engine.tokenizer
    prompt = tok.encode(fmt.render(req), special=True)
    sink = OutputSink(lambda r, e: None, lambda s, i, t: None, lambda t: None)
    rng = make_rng(req.sampling.seed)
    reasoning, text, constrained = "", "", []
    with engine.new_session(4096) as session:
        session.eval(prompt)
        d = Decoding(req, session, tok, fmt.decode(req), GenerationRecord("chat", len(prompt)),
                     sink, arrived=0.0, room=4096 - len(prompt), answer=answer,
                     answer_after_reasoning=start.prefix is None)  # fmt: skip
        events = []
        while not d.done:
            step = d.step()
            if step.tokens:
                session.eval(step.tokens)
            token = None
            if step.sample:
                constrained.append(step.allowed is not None)
                if played and step.allowed is None:
                    token = played.pop(0)
                else:
                    token = sample(session.compute_logits(), step.params, rng, step.allowed)
            events += d.after(token)
        tail, finish = d.finish()
        generated = d.generated
    for ev in events + tail:
        if isinstance(ev, ReasoningDelta):
            reasoning += ev.text
        elif isinstance(ev, TextDelta):
            text += ev.text
    return reasoning, text, finish, constrained, generated


def request(thinking: bool, seed: int, max_tokens: int | None = None) -> ChatRequest:
    return ChatRequest(
        [Message("user", "Weather in Paris as JSON")],
        sampling=Sampling(temperature=1.0, top_p=1.0, min_p=0.0, seed=seed),
        thinking=thinking,
        max_tokens=max_tokens,
        output_format=OutputFormat(SCHEMA),
    )


def test_thinking_is_free_then_the_answer_is_the_json(engine, fmt, jv) -> None:
    assert fmt.structured_start(request(True, 0)).prefix is None  # the prompt opens it
    for seed in range(3):
        thought = engine.tokenizer.encode("Paris is mild. </think>", special=True)
        reasoning, text, finish, constrained, _ = run(engine, fmt, jv, request(True, seed), thought)
        assert reasoning.strip() == "Paris is mild."
        jsonschema.validate(json.loads(text), SCHEMA)
        assert finish.reason == "stop"
        n = len(engine.tokenizer.encode("Paris is mild. </think>", special=True))
        assert not any(constrained[:n]) and all(constrained[n:])


def test_thinking_off_constrains_from_the_first_token(engine, fmt, jv) -> None:
    assert fmt.structured_start(request(False, 0)).prefix == ""
    answers = set()
    for seed in range(3):
        reasoning, text, finish, constrained, _ = run(engine, fmt, jv, request(False, seed), [])
        assert reasoning == "" and all(constrained) and finish.reason == "stop"
        jsonschema.validate(json.loads(text), SCHEMA)
        answers.add(text)
    assert len(answers) == 3


def test_max_tokens_cuts_the_json_with_length(engine, fmt, jv) -> None:
    """The budget counts forced tokens too, and ends inside a forced piece if it must."""
    for limit in (1, 3, 9):
        _, text, finish, _, generated = run(engine, fmt, jv, request(False, 1, limit), [])
        assert finish.reason == "length" and generated == limit, (limit, text)
        with pytest.raises(ValueError):
            json.loads(text)
