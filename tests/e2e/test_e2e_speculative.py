"""Speculative decoding on a real ds4d process (the embedded model, `--speculative
lookup` and `--speculative draft`), driven by the real `openai` and `anthropic` clients: a
request that copies its prompt gives the same text streamed with speculation as with the
request's opt-out (`"speculative": false`), and /metrics counts the drafted and accepted
tokens of the speculating requests only. A draft model of another vocabulary stops the
daemon at start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anthropic
import openai
import pytest

from tests.e2e.daemon_process import free_port, running_daemon

FILE = (Path(__file__).resolve().parents[2] / "ds4d" / "serving" / "chunking.py").read_text()
PROMPT = f"Repeat this file exactly:\n\n{FILE[:1200]}"
TOKENS = 96
DRAFTED = "ds4d_speculative_drafted_tokens_total"
ACCEPTED = "ds4d_speculative_accepted_tokens_total"


@pytest.mark.parametrize("mode", ["lookup", "draft"])
def test_speculation_changes_no_text_and_is_counted(tmp_path, model_path, mode):
    """`--speculative lookup`, and `--speculative draft` with the embedded model's own
    file as the draft (a draft that is always right, so every drafted token is checked and
    most kept): the same text as the request's opt-out, through the real `openai` client
    (streamed) and, for lookup, the real `anthropic` client; the opt-out drafts nothing,
    the speculating request drafts and keeps a share of its drafts (a third for lookup,
    half for the draft model)."""
    args = ["--speculative", mode, "--slots", "1", "--ctx", "2048"]
    if mode == "draft":
        args += ["--draft-model", str(model_path)]
    with running_daemon(tmp_path, *args) as d:
        oa = openai.OpenAI(base_url=f"{d.url}/v1", api_key="x")
        an = anthropic.Anthropic(base_url=d.url, api_key="x")

        def chat(speculative: bool) -> str:
            extra = {} if speculative else {"speculative": False}
            stream = oa.chat.completions.create(
                model="m", messages=[{"role": "user", "content": PROMPT}], max_tokens=TOKENS,
                temperature=0, stream=True, extra_body=extra)  # fmt: skip
            return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

        def messages(speculative: bool) -> str:
            # this client version has no `temperature` argument: the body field
            extra = {"temperature": 0} if speculative else {"temperature": 0, "speculative": False}
            msg = an.messages.create(model="m", max_tokens=TOKENS,
                                     messages=[{"role": "user", "content": PROMPT}],
                                     extra_body=extra)  # fmt: skip
            return "".join(b.text for b in msg.content if b.type == "text")

        kept = {"lookup": 1 / 3, "draft": 1 / 2}[mode]
        for ask in (chat, messages) if mode == "lookup" else (chat,):
            before = d.metrics()
            plain = ask(False)
            middle = d.metrics()
            speculated = ask(True)
            after = d.metrics()
            assert speculated == plain and len(plain) > 100
            assert middle[DRAFTED] == before[DRAFTED]  # the opt-out drafted nothing
            assert after[DRAFTED] > middle[DRAFTED]
            assert after[ACCEPTED] - middle[ACCEPTED] > (after[DRAFTED] - middle[DRAFTED]) * kept
        log = d.log_path.read_text()
        assert "speculation drafted" in log
        if mode == "draft":
            assert "draft model" in log


def test_a_draft_model_of_another_vocabulary_stops_the_daemon(tmp_path):
    """The kit's qwen2 model cannot draft for the embedded SmolLM2: the daemon refuses to
    start, with the reason on stderr and the model-load exit code."""
    from ds4d.daemon import exitcodes
    from tests.helpers.kit import kit_model

    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
           "XDG_STATE_HOME": str(tmp_path / "st"), "XDG_RUNTIME_DIR": str(tmp_path / "run"),
           "XDG_CACHE_HOME": str(tmp_path / "cache")}  # fmt: skip
    ds4d = Path(sys.executable).parent / "ds4d"
    done = subprocess.run(
        [str(ds4d), "serve", "--no-kv-disk", "--port", str(free_port()), "--speculative",
         "draft", "--draft-model", str(kit_model("qwen2"))],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == exitcodes.MODEL_LOAD_FAILED, done.stderr
    assert "cannot draft for" in done.stderr and "vocabularies differ" in done.stderr
