"""The DS4 chat layer on a real (synthetic) DeepSeek V4 engine: the GGUF's own
vocabulary, a rendered conversation prefilled, and generated tokens parsed back."""

from __future__ import annotations

import pytest

from ds4d.chat.deepseek4_output import DS4ChatFormat
from ds4d.chat.types import ChatRequest, Message, ReasoningDelta, TextDelta


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from ds4d.engine.engine import Engine
    from ds4d.tools.synth import write_deepseek4

    path = tmp_path_factory.mktemp("ds4") / "synth.gguf"
    write_deepseek4(path, seed=5)
    with Engine.open(path) as eng:
        yield eng


def test_generation_round_trips_through_the_chat_layer(engine):
    from ds4d.engine.ds4_tokenizer import DS4Tokenizer
    from ds4d.engine.sampler import SamplingParams, make_rng, sample

    tok = engine.tokenizer
    assert isinstance(tok, DS4Tokenizer) and tok.n_vocab == engine.info.n_vocab
    fmt = DS4ChatFormat(n_ctx=512)
    history = [
        Message("system", "Be brief."),
        Message("user", "Hi"),
        Message("assistant", "Hello!", reasoning="greet"),
        Message("user", "Why?"),
    ]
    req = ChatRequest(messages=history)
    text = fmt.render(req)
    ids = tok.encode(text)
    assert tok.decode(ids) == text and ids[0] == tok.bos_id
    assert ids.count(tok.user_id) == 2 and ids[-2:] == [tok.assistant_id, tok.think_open_id]

    session = engine.new_session(512)
    session.eval(ids)
    decode = fmt.decode(req)
    decoder = tok.incremental_decoder()
    rng = make_rng(11)
    generated, events = [], []
    for _ in range(24):
        token = sample(
            session.compute_logits(), decode.sampling(SamplingParams(temperature=0.0)), rng
        )
        if tok.is_eog(token):
            break
        session.eval([token])
        generated.append(token)
        events += decode.feed(decoder.feed(token))
    events += decode.feed(decoder.flush()) + decode.flush()
    assert generated
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    answer = "".join(e.text for e in events if isinstance(e, TextDelta))
    closed = decode.parser.think.closed
    raw = tok.decode(generated)
    assert reasoning + ("</think>" if closed else "") + answer == raw
