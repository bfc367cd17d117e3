"""Speculative decoding on a real ds4d process (the embedded model, `--speculative
lookup`), driven by the real `openai` and `anthropic` clients: a request that
copies its prompt gives the same text streamed with speculation as with the request's
opt-out (`"speculative": false`), and /metrics counts the drafted and accepted tokens of
the speculating requests only."""

from __future__ import annotations

from pathlib import Path

import anthropic
import openai

from tests.e2e.daemon_process import running_daemon

FILE = (Path(__file__).resolve().parents[2] / "ds4d" / "serving" / "chunking.py").read_text()
PROMPT = f"Repeat this file exactly:\n\n{FILE[:1200]}"
TOKENS = 96
DRAFTED = "ds4d_speculative_drafted_tokens_total"
ACCEPTED = "ds4d_speculative_accepted_tokens_total"


def test_speculation_changes_no_text_and_is_counted(tmp_path):
    with running_daemon(tmp_path, "--speculative", "lookup", "--slots", "1", "--ctx", "2048") as d:
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

        for ask in (chat, messages):
            before = d.metrics()
            plain = ask(False)
            middle = d.metrics()
            speculated = ask(True)
            after = d.metrics()
            assert speculated == plain and len(plain) > 100
            assert middle[DRAFTED] == before[DRAFTED]  # the opt-out drafted nothing
            assert after[DRAFTED] > middle[DRAFTED]
            assert after[ACCEPTED] - middle[ACCEPTED] > (after[DRAFTED] - middle[DRAFTED]) / 3
        assert "speculation drafted" in d.log_path.read_text()
