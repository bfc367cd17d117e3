"""Live and per-request steering on real ds4d processes (the embedded model), driven by the
real ds4ctl and the real openai, anthropic and ollama clients (docs/steering.md).

The control vector is random (seeded) directions of norm 4 at layers 4..12 in llama.cpp's
file format: enough to change a greedy answer of the embedded model, which is all these
tests need (what a direction built from prompts does is tests/cli/test_steer.py's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anthropic
import numpy as np
import ollama
import openai
import pytest

from ds4d.daemon.admin_protocol import AdminError, call
from ds4d.engine.steering import write_control_vector
from tests.e2e.daemon_process import Daemon, running_daemon, runtime_dir, traces
from tests.helpers.polling import wait_until
from tests.helpers.together import run_together

PROMPT = "What is a rainbow?"
# long enough for its KV to be reused (kv_cache_min_tokens is 64 at --ctx 1024)
SYSTEM = "You are a helpful assistant who answers questions about nature and weather. " * 6
MAX_TOKENS = 40
LONG_TOKENS = 100  # a story still being written when the steering changes


@pytest.fixture(scope="module")
def vector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(0)
    dirs = {}
    for layer in range(4, 13):
        v = rng.standard_normal(576).astype(np.float32)
        dirs[layer] = 4.0 * v / np.linalg.norm(v)
    path = tmp_path_factory.mktemp("steering") / "random.gguf"
    write_control_vector(path, dirs, "SmolLM2-135M-Instruct")
    return path


def run_ds4ctl(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real ds4ctl against the daemon started in `tmp`."""
    return subprocess.run(
        [sys.executable, "-c", "import sys; from ds4ctl.cli import main; sys.exit(main(sys.argv[1:]))",
         *args],
        env=dict(os.environ, XDG_RUNTIME_DIR=str(runtime_dir(tmp))),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def ds4ctl(tmp: Path, *args: str) -> Any:
    """ds4ctl's JSON result."""
    out = run_ds4ctl(tmp, "--json", *args)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def socket_of(tmp: Path) -> Path:
    return runtime_dir(tmp) / "ds4d" / "ds4d.sock"


def oa(d: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{d.url}/v1", api_key="none", max_retries=0, timeout=300)


def messages(prompt: str) -> list[Any]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]


def ask(d: Daemon, steering: Any = None, prompt: str = PROMPT,
        max_tokens: int = MAX_TOKENS) -> tuple[str, int]:  # fmt: skip
    """(text, cached prompt tokens) of a greedy chat request, with its own steering."""
    r = oa(d).chat.completions.create(
        model="ds4d", max_tokens=max_tokens, messages=messages(prompt),
        temperature=0, extra_body={"steering": steering} if steering is not None else None,
    )  # fmt: skip
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    return r.choices[0].message.content or "", r.usage.prompt_tokens_details.cached_tokens or 0


def test_ds4ctl_steer_set_changes_the_next_answer_and_off_restores_it(tmp_path, vector):
    """One slot, so each steering change lands on the KV computed under the other one: it
    is dropped (nothing cached), and `off` gives the never-steered answer bit for bit."""
    with running_daemon(tmp_path, "--slots", "1", "--ctx", "1024") as d:
        shown = ds4ctl(tmp_path, "steer", "show")
        assert [(m["steering"], m["vectors"]) for m in shown] == [(None, [])]
        plain, cached = ask(d)
        assert cached == 0

        now = ds4ctl(tmp_path, "steer", "set", str(vector), "1",
                     "--control-vector-layer-range", "4", "12", "--ffn", "1")  # fmt: skip
        s = now["steering"]
        assert s["files"] == [{"path": str(vector), "scale": 1.0}]
        assert (s["layer_range"], s["attn"], s["ffn"], s["set_by"]) == ([4, 12], 0.0, 1.0, "ds4ctl")
        assert s["key"] and ds4ctl(tmp_path, "steer", "show")[0]["steering"] == s
        text = run_ds4ctl(tmp_path, "steer", "show").stdout
        assert f"{vector} x1, layers 4..12, attn 0, ffn 1 (set by ds4ctl, key {s['key']})" in text
        steered, cached = ask(d)
        assert steered != plain and cached == 0  # the unsteered KV was not reused
        again, cached = ask(d)
        assert again == steered and cached > 0  # the same steering reuses its own KV

        assert ds4ctl(tmp_path, "steer", "off")["steering"] is None
        assert run_ds4ctl(tmp_path, "steer", "show").stdout.endswith(": unsteered\n")
        unsteered, cached = ask(d)
        assert unsteered == plain and cached == 0
        # scale 0 is no steering at all: the unsteered KV is kept
        ds4ctl(tmp_path, "steer", "set", str(vector), "0")
        zero, cached = ask(d)
        assert zero == plain and cached > 0


def test_bad_steer_set_is_refused_and_changes_nothing(tmp_path, vector):
    with running_daemon(tmp_path, "--slots", "1", "--ctx", "1024") as d:
        for args, why in (
            ([str(tmp_path / "missing.gguf")], "cannot read control vector"),
            ([str(vector), "1", "--control-vector-layer-range", "9", "3"], "layer range"),
        ):
            out = run_ds4ctl(tmp_path, "steer", "set", *args)
            assert out.returncode == 1 and why in out.stderr, (args, out.stderr)
        with pytest.raises(AdminError, match="must be a finite number"):
            call(socket_of(tmp_path), "steer.set", {"files": [[str(vector), "nan"]]})
        assert ds4ctl(tmp_path, "steer", "show")[0]["steering"] is None
        ask(d)


def test_a_running_request_keeps_the_steering_it_started_with(tmp_path, vector):
    """A steering set while a request generates is for the next requests: the running one
    finishes exactly as it would have unsteered."""
    long = "Write a long story about a lighthouse keeper and the sea."
    with running_daemon(tmp_path, "--slots", "1", "--ctx", "1024") as d:
        reference, _ = ask(d, prompt=long, max_tokens=LONG_TOKENS)
        ds4ctl(tmp_path, "steer", "set", str(vector), "1")
        steered_ref, _ = ask(d, prompt=long, max_tokens=LONG_TOKENS)
        assert steered_ref != reference
        ds4ctl(tmp_path, "steer", "off")
        ask(d, prompt="hi", max_tokens=1)  # the slot leaves the steered KV behind

        pieces: list[str] = []
        stream = oa(d).chat.completions.create(
            model="ds4d", messages=messages(long), max_tokens=LONG_TOKENS,
            temperature=0, stream=True,
        )  # fmt: skip
        busy_when_set = None
        for chunk in stream:
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
            if busy_when_set is None and "".join(pieces):
                call(socket_of(tmp_path), "steer.set", {"files": [[str(vector), 1.0]]})
                busy_when_set = call(socket_of(tmp_path), "slots")[0]["state"] == "busy"
        assert busy_when_set  # it was still generating when the steering changed
        assert "".join(pieces) == reference
        # and the next request runs steered
        assert ask(d, prompt=long, max_tokens=LONG_TOKENS)[0] == steered_ref


def test_per_request_steering_does_not_leak_into_a_concurrent_request(tmp_path, vector):
    """A steered and an unsteered request decoding in the same batched steps each give what
    they give alone; the same name through Anthropic's and Ollama's clients."""
    with running_daemon(tmp_path, "--slots", "2", "--ctx", "1024",
                        "--steering-vector", f"up={vector}:1") as d:  # fmt: skip
        shown = ds4ctl(tmp_path, "steer", "show")
        assert [(m["steering"], m["vectors"]) for m in shown] == [(None, ["up"])]
        plain, _ = ask(d)
        steered, _ = ask(d, "up")
        assert steered != plain
        assert ask(d, {"name": "up", "scale": 0})[0] == plain
        assert ask(d, "off")[0] == plain

        before = d.metrics()
        together = run_together([lambda: ask(d)[0], lambda: ask(d, "up")[0]])
        after = d.metrics()
        assert together == [plain, steered]
        steps = after["ds4d_decode_steps_total"] - before["ds4d_decode_steps_total"]
        slots = after["ds4d_decode_step_slots_total"] - before["ds4d_decode_step_slots_total"]
        assert slots > steps  # the two decoded in shared steps

        a = anthropic.Anthropic(base_url=d.url, api_key="none", max_retries=0, timeout=300)
        m = a.messages.create(
            model="ds4d", max_tokens=MAX_TOKENS, system=SYSTEM,
            messages=[{"role": "user", "content": PROMPT}],
            extra_body={"temperature": 0, "steering": "up"},  # this SDK sends no temperature
        )  # fmt: skip
        assert m.content[0].text == steered  # type: ignore[union-attr]
        o = ollama.Client(host=d.url, timeout=300).chat(
            model="ds4d", messages=messages(PROMPT),
            options={"temperature": 0, "num_predict": MAX_TOKENS, "steering": "up"},
        )  # fmt: skip
        assert o.message.content == steered


def test_bad_steering_fields_get_each_protocols_400(tmp_path, vector):
    with running_daemon(tmp_path, "--slots", "1", "--ctx", "1024",
                        "--steering-vector", f"up={vector}") as d:  # fmt: skip
        for steering, param in (
            ("nope", "steering"),
            ({"name": "up", "scale": "big"}, "steering.scale"),
            ({"name": "up", "layers": [5, 2]}, "steering.layers"),
            ({"name": "up", "colour": 1}, "steering.colour"),
            (3, "steering"),
        ):
            with pytest.raises(openai.BadRequestError) as e:
                ask(d, steering)
            assert e.value.status_code == 400 and e.value.param == param, e.value.body
        a = anthropic.Anthropic(base_url=d.url, api_key="none", max_retries=0, timeout=60)
        with pytest.raises(anthropic.BadRequestError) as ae:
            a.messages.create(model="ds4d", max_tokens=4, extra_body={"steering": "nope"},
                              messages=[{"role": "user", "content": "hi"}])  # fmt: skip
        assert ae.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
        assert "unknown steering vector 'nope'" in ae.value.body["error"]["message"]  # type: ignore[index]
        with pytest.raises(ollama.ResponseError) as oe:
            ollama.Client(host=d.url, timeout=60).chat(
                model="ds4d", messages=[{"role": "user", "content": "hi"}],
                options={"num_predict": 4, "steering": {"name": "up", "ffn": 1e9}},
            )  # fmt: skip
        assert oe.value.status_code == 400 and "steering.ffn" in oe.value.error
        assert ask(d, "up", max_tokens=2)[0]  # the daemon still serves


@pytest.mark.slow
def test_disk_checkpoints_never_cross_steering_across_restarts(tmp_path, vector, data_dir):
    """Checkpoints written unsteered are never restored into a steered request, and
    checkpoints written under the daemon's start steering never into an unsteered one,
    across restarts; each steering still finds its own."""
    kv, trace = tmp_path / "kv", tmp_path / "trace.jsonl"
    book = (data_dir / "text" / "promessi_sposi.txt").read_text()[:1500]
    prompt = "Summarise this text:\n" + book

    def start(*args: str) -> Any:
        return running_daemon(tmp_path, "--slots", "1", "--ctx", "1024", "--kv-disk",
                              "--kv-disk-dir", str(kv), "--trace", str(trace),
                              "--steering-vector", f"up={vector}", *args)  # fmt: skip

    def asked(d: Daemon, steering: Any = None) -> tuple[str, str]:
        """The answer, and where its prompt's KV came from (its trace record, written as
        the request ends: it may land just after the response)."""
        seen = len(traces(trace))
        text, _ = ask(d, steering, prompt, max_tokens=16)
        records = wait_until(lambda: traces(trace)[seen:], 10, "no trace record")
        return text, records[-1]["cache_source"]

    def steered_files() -> list[Path]:
        return sorted(p for p in kv.glob("steer-*/*.kv"))

    with start() as d:
        steered, src = asked(d, "up")
        assert src == "none"
        plain, src = asked(d)  # the slot's steered KV is dropped, not reused
        assert src == "none" and plain != steered
    plain_files = sorted(kv.glob("*.kv"))
    assert plain_files and not steered_files()  # the steered request wrote nothing

    with start() as d:
        assert asked(d, "up") == (steered, "none")  # the unsteered checkpoint is not its
        assert asked(d) == (plain, "disk-text")  # ... and is still there for the unsteered

    with start("--control-vector-scaled", f"{vector}:1") as d:  # steered from the start
        assert asked(d) == (steered, "none")
        assert asked(d, "off") == (plain, "none")  # never from the steered cache
    assert steered_files()

    with start("--control-vector-scaled", f"{vector}:1") as d:
        assert asked(d) == (steered, "disk-text")

    with start() as d:
        assert asked(d, "up") == (steered, "none")
        assert asked(d) == (plain, "disk-text")
    assert not (kv / "quarantine").exists() or not any((kv / "quarantine").iterdir())
