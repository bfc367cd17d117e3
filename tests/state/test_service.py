"""StateService: stable history rendering (tool replay, billing-line normalisation),
replay surviving a restart through the KV files' tool maps, metrics lines."""

from __future__ import annotations

import json

import pytest

from ds4d.chat.render import hermes_call_text
from ds4d.chat.types import ChatRequest, Message, ToolCall
from ds4d.state.kvfile import Reason
from ds4d.state.service import StateService, tool_call_ids

FP = "fingerprint-for-service-tests"
SAMPLED = '{"path":"/tmp","recursive":true,"limit":5}'  # what the model produced
CLIENT = '{ "limit": 5, "path": "/tmp", "recursive": true }'  # what the client sends back


@pytest.fixture(scope="module")
def tok(model_path):
    from ds4d.engine.tokenizer import Tokenizer

    # ds4d's own GGUF reader: the gguf package's takes seconds over the vocabulary
    # (tests/engine/test_tokenizer.py builds the same tokenizer through it)
    return Tokenizer.from_gguf(model_path)


@pytest.fixture(scope="module")
def session(engine):
    """A real engine session: the state layer keys its bookkeeping by session object."""
    with engine.new_session(64) as s:
        yield s


def service(tmp_path, tok, **kw) -> StateService:
    return StateService.create(
        tokenizer=tok, fingerprint=FP, ctx=8192, kv_dir=tmp_path / "kv", **kw
    )


def conversation(call_id: str, billing: str = "cch=0a1b2;") -> ChatRequest:
    return ChatRequest(
        messages=[
            Message(
                "system",
                f"x-anthropic-billing-header: cc_version=2.1.1.abc; {billing}\nYou list files.",
            ),
            Message("user", "list /tmp"),
            Message("assistant", "", tool_calls=[ToolCall(call_id, "ls", CLIENT)]),
            Message("tool", "a b c", tool_call_id=call_id),
        ]
    )


def rendered(req: ChatRequest) -> str:
    return "\n".join(
        [m.content for m in req.messages]
        + [hermes_call_text(c) for m in req.messages for c in m.tool_calls]
    )


def test_replay_restores_sampled_argument_order(tmp_path, tok, session):
    s = service(tmp_path, tok)
    s.remember_tool_call(session, "call_1", SAMPLED)
    req = conversation("call_1")
    out = s.prepare_request(req)
    assert out.messages[2].tool_calls[0].arguments == SAMPLED
    assert req.messages[2].tool_calls[0].arguments == CLIENT  # the request is not mutated
    body = json.loads(
        hermes_call_text(out.messages[2].tool_calls[0])
        .removeprefix("<tool_call>\n")
        .removesuffix("\n</tool_call>")
    )
    assert list(body["arguments"]) == ["path", "recursive", "limit"]
    assert tool_call_ids(req) == ["call_1", "call_1"]


def test_billing_line_normalised_and_switchable(tmp_path, tok):
    s = service(tmp_path, tok)
    a, b = conversation("call_x"), conversation("call_x", billing="cch=ffff0;")
    assert rendered(s.prepare_request(a)) == rendered(s.prepare_request(b))
    assert s.prepare_request(a).messages[0].content == "You list files."
    off = service(tmp_path, tok, normalize=lambda: False)
    assert rendered(off.prepare_request(a)) != rendered(off.prepare_request(b))


def test_replay_survives_restart_through_kv_tool_map(tmp_path, tok, session):
    s = service(tmp_path, tok, policy={"min_tokens": 16})
    s.remember_tool_call(session, "call_2", SAMPLED)
    s.tool_memory.remember("call_unrelated", "{}")
    text = "a conversation with a tool call " * 4
    s.disk.save(Reason.SHUTDOWN, text, 100, b"payload", tool_map=s.tool_memory.select(["call_2"]))

    after = service(tmp_path, tok, policy={"min_tokens": 16})  # a new process
    assert len(after.tool_memory) == 0
    out = after.prepare_request(conversation("call_2"))
    assert out.messages[2].tool_calls[0].arguments == SAMPLED
    assert "call_unrelated" not in after.tool_memory


def test_metrics_lines(tmp_path, tok):
    s = service(tmp_path, tok, policy={"min_tokens": 16})
    s.disk.save(Reason.COLD, "x" * 100, 50, b"p" * 1000)
    text = "\n".join(s.metrics_lines())
    assert "# TYPE ds4d_kv_disk_bytes_written_total counter" in text
    assert "ds4d_kv_disk_files_written_total 1" in text
    assert "ds4d_kv_disk_evictions_total 0" in text
    nodisk = StateService.create(tokenizer=tok, fingerprint=FP, ctx=8192, kv_dir=None)
    assert nodisk.disk is None and nodisk.kv.disk is None
    assert "ds4d_kv_disk" not in "\n".join(nodisk.metrics_lines())
