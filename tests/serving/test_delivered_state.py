"""A reply cut inside the generated text (a stop sequence; a tool-result marker the model
began writing) leaves the slot holding only what the client was given
(ds4d.serving.decoding.Decoding._drop_undelivered): the client's next turn does not hold
the cut text, so KV past it would make the slot's state, and every checkpoint of it, no
longer a prefix of the conversation (a restart then fell back to an older checkpoint).
The end-to-end case, a model playing its tool's turn, is in
tests/e2e/test_e2e_state.py::test_tool_replay_with_reserialized_arguments_survives_restart."""

from __future__ import annotations

from ds4d.chat.types import TextDelta
from tests.serving.test_speculation_real import REWRITE, chat, serve


def test_a_stop_sequence_leaves_only_the_delivered_text_in_the_kv(engine):
    (free,) = serve(engine, "off", [chat(REWRITE)])
    words = free.text.split()
    stop = " ".join(words[12:14])  # a stop string inside the copied text
    (cut,) = serve(engine, "off", [chat(REWRITE, stop=[stop])])
    delivered = "".join(e.text for e in cut.events if isinstance(e, TextDelta))
    assert cut.record.finish == "stop" and stop not in delivered
    n_prompt = cut.record.prompt_tokens
    tail = engine.tokenizer.decode(cut.session_tokens[n_prompt:])
    assert delivered.startswith(tail)  # nothing of the stop sequence is held
    # and not a token more was dropped than the cut needs (whitespace aside)
    kept = len(cut.session_tokens) - n_prompt
    longer = engine.tokenizer.decode(free.session_tokens[n_prompt : n_prompt + kept + 1])
    assert not delivered.rstrip().startswith(longer)
