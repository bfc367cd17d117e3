"""The daemon is family-agnostic: a (synthetic) DeepSeek V4 GGUF is served through its
own chat format — V4 encoding, thinking split — by the same HTTP layer and slots."""

from __future__ import annotations

import anthropic
import openai
import pytest

from ds4d.synth import write_deepseek4
from tests.e2e.daemon_process import running_daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ds4d-v4")
    model = tmp / "synthetic-v4.gguf"
    write_deepseek4(model)
    with running_daemon(tmp, "-m", str(model), "--ctx", "2048") as d:
        yield d


def test_deepseek4_chat_and_messages(daemon):
    oai = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="x", max_retries=0)
    r = oai.chat.completions.create(model="deepseek-v4-flash", max_tokens=6, seed=7,
                                    messages=[{"role": "user", "content": "hi"}])
    assert r.usage.completion_tokens >= 1 and r.usage.prompt_tokens > 1
    # thinking is V4's default: generation starts inside the reasoning (seeded: the
    # synthetic model's first tokens are fixed)
    assert r.choices[0].message.model_extra.get("reasoning_content") is not None
    claude = anthropic.Anthropic(base_url=daemon.url, api_key="x", max_retries=0)
    with claude.messages.stream(model="c", max_tokens=6, extra_body={"seed": 7}, thinking={
            "type": "enabled", "budget_tokens": 1024},
            messages=[{"role": "user", "content": "hi"}]) as s:
        final = s.get_final_message()
    assert final.content[0].type == "thinking"
