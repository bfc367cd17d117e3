"""Several models in one real daemon: requests interleaved between two kit models are
served by the model they name, each with its own slots and prefix reuse; a memory budget
that holds two evicts the least recently used idle one when a third loads (logged,
counted in /metrics), and a later request reloads it. `ds4ctl models` lists, loads and
unloads them."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from tests.e2e.daemon_process import Daemon, running_daemon, runtime_dir
from tests.helpers.kit import kit_model

FAMILIES = {"chat": "qwen3", "coder": "qwen2", "third": "llama"}
CONVERSATION = "The lighthouse keeper kept a ledger of every ship that passed the point. "


def _budget_mb_for_two() -> int:
    """A budget holding `chat` and `coder` (weights and their one small KV slot) but not
    `third` beside them."""
    size = {n: kit_model(f).stat().st_size for n, f in FAMILIES.items()}
    two = size["chat"] + size["coder"]
    budget = math.ceil(two / 2**20) + 4  # 4 MiB for the KV slots of ctx 512 and margins
    assert two + size["third"] > budget * 2**20, size
    assert budget * 2**20 - two < min(size.values())  # no third model fits in the slack
    return budget


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("ds4d-models")
    args = ["--model", str(kit_model(FAMILIES["chat"])), "--model-aliases",
            f"chat={kit_model(FAMILIES['chat']).stem}"]  # fmt: skip
    for name in ("coder", "third"):
        args += ["--add-model", f"{name}={kit_model(FAMILIES[name])}"]
    args += ["--slots", "1", "--ctx", "512", "--temperature", "0"]
    args += ["--memory-budget", str(_budget_mb_for_two())]
    with running_daemon(tmp, *args) as d:
        d.tmp = tmp  # type: ignore[attr-defined]
        yield d
        assert "Traceback" not in d.log(), d.log()[-4000:]


def _chat(client: ollama.Client, model: str, turns: int) -> ollama.ChatResponse:
    messages = [{"role": "user", "content": CONVERSATION * 4}]
    for n in range(turns):
        messages += [{"role": "assistant", "content": f"noted {n}"},
                     {"role": "user", "content": f"and then {n}?"}]  # fmt: skip
    return client.chat(model=model, messages=messages, options={"num_predict": 2}, think=False)


def _metric(d: Daemon, name: str, model: str) -> float:
    return d.metrics().get(f'{name}{{model="{model}"}}', 0.0)


def _ctl(d: Daemon, *args: str) -> Any:
    env = dict(os.environ, XDG_RUNTIME_DIR=str(runtime_dir(d.tmp)))  # type: ignore[attr-defined]
    out = subprocess.run(
        [str(Path(sys.executable).parent / "ds4ctl"), *args, "--json"],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def test_interleaved_requests_each_reuse_their_models_prefix(daemon: Daemon) -> None:
    c = ollama.Client(host=daemon.url, timeout=120)
    first = {m: _chat(c, m, 0) for m in ("chat", "coder")}
    again = {m: _chat(c, m, 1) for m in ("chat", "coder")}  # interleaved: chat, coder, ...
    for m in ("chat", "coder"):
        assert first[m].model == m and again[m].model == m
        cold, warm = first[m].prompt_eval_count, again[m].prompt_eval_count
        assert cold and warm is not None
        # the longer second turn evaluates only what follows the cached first turn
        assert warm < cold // 3, (m, cold, warm)
    log = daemon.log()
    assert "loading model coder" in log
    # each model's own family served it: their templates' prompts differ in length
    assert first["chat"].prompt_eval_count != first["coder"].prompt_eval_count


def test_third_model_evicts_the_least_recently_used_and_comes_back(daemon: Daemon) -> None:
    c = ollama.Client(host=daemon.url, timeout=120)
    _chat(c, "coder", 0)
    _chat(c, "chat", 0)  # chat is now the most recently used: coder goes first
    chat_loads = _metric(daemon, "ds4d_model_loads", FAMILIES_NAME["chat"])
    r = _chat(c, "third", 0)
    assert r.done and r.load_duration and r.load_duration > 0
    running = {m.model for m in c.ps().models}
    assert "third" in running and "coder" not in running and FAMILIES_NAME["chat"] in running
    assert "unloading coder (least recently used) to make room for third" in daemon.log()
    assert _metric(daemon, "ds4d_model_unloads", "coder") >= 1
    assert _metric(daemon, "ds4d_model_loads", FAMILIES_NAME["chat"]) == chat_loads
    budget = daemon.metrics()["ds4d_model_memory_budget_bytes"]
    held = sum(_metric(daemon, "ds4d_model_memory_bytes", m) for m in running)
    assert held <= budget
    # the evicted model is loaded again by the next request for it
    coder_loads = _metric(daemon, "ds4d_model_loads", "coder")
    back = _chat(c, "coder", 0)
    assert back.done and back.load_duration
    assert _metric(daemon, "ds4d_model_loads", "coder") == coder_loads + 1
    # room for it is made by unloading the least recently used idle model first
    assert f"unloading {FAMILIES_NAME['chat']} (least recently used) to make room for coder" in (
        daemon.log()
    )
    tags = {m["name"]: m["state"] for m in httpx.get(f"{daemon.url}/api/tags").json()["models"]}
    assert tags["coder"] == "loaded" and tags[FAMILIES_NAME["chat"]] == "unloaded"
    held = sum(_metric(daemon, "ds4d_model_memory_bytes", m) for m in tags)
    assert held <= daemon.metrics()["ds4d_model_memory_budget_bytes"]


def test_ds4ctl_models_ls_load_unload(daemon: Daemon) -> None:
    listed = {m["name"]: m for m in _ctl(daemon, "models", "ls")}
    assert set(listed) == {FAMILIES_NAME["chat"], "coder", "third"}
    assert listed[FAMILIES_NAME["chat"]]["aliases"] == ["chat"]
    assert _ctl(daemon, "models", "unload", "third")["state"] == "unloaded"
    assert _ctl(daemon, "models", "load", "third")["state"] == "loaded"
    status = _ctl(daemon, "status")
    assert {m["name"] for m in status["models"]} == set(listed)


FAMILIES_NAME = {"chat": kit_model(FAMILIES["chat"]).stem}
