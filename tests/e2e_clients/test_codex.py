"""Codex CLI (`codex exec`) against ds4d's /v1/responses, configured as docs/clients.md says
(a `ds4d` model provider in CODEX_HOME/config.toml, `wire_api = "responses"`).

One plain run (clean exit, text out); a run with the live `force_tool_choice` set to
`exec_command` (a function tool): Codex runs the command and sends its output back; a
run forced into `resume_agent`, a function of Codex's `multi_agent_v1` namespace tool:
the call item must name its namespace for Codex to route it to that tool's handler,
whose answer (whatever it says about the made-up agent id) comes back as the call's
output rather than Codex's "unsupported call"."""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e_clients.conftest import (
    Run,
    Served,
    assert_no_markup,
    assert_reused,
    base_env,
    client_bin,
    main_request,
    report,
    run_client,
    tool_round_trip,
)

CONFIG = """\
model = "local"
model_provider = "ds4d"
check_for_update_on_startup = false

[model_providers.ds4d]
name = "ds4d"
base_url = "{url}/v1"
wire_api = "responses"
"""


SHOWN = ("agent_message", "reasoning")  # the item types that carry the model's words


def codex(served: Served, tmp: Path, prompt: str) -> Run:
    home = tmp / "home"
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(CONFIG.format(url=served.url))
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    env = base_env(home)
    env["CODEX_HOME"] = str(codex_home)
    argv = [str(client_bin("codex")), "exec", "--json", "--skip-git-repo-check", prompt]
    return run_client(served, argv, env, work)


def items(run: Run) -> list[dict]:
    """The finished items of `codex exec --json`'s event lines."""
    out = []
    for line in run.stdout.splitlines():
        if line.startswith("{"):
            ev = json.loads(line)
            if ev.get("type") == "item.completed":
                out.append(ev["item"])
    return out


def assert_clean(run: Run) -> None:
    """Exit 0 and no failed turn or stream error (an `error` item is a warning, such as
    the harmless "Model metadata for `local` not found"), and no tool markup in the
    messages and reasoning Codex shows."""
    assert run.returncode == 0, run.explain()
    kinds = [
        json.loads(line).get("type") for line in run.stdout.splitlines() if line.startswith("{")
    ]
    assert "turn.completed" in kinds, run.explain()
    assert "turn.failed" not in kinds and "error" not in kinds, run.explain()
    shown = [i.get("text") or "" for i in items(run) if i.get("type") in SHOWN]
    assert_no_markup(shown, run)


def test_codex_exec(served: Served, tmp_path: Path) -> None:
    served.force_tool_choice("")
    first = codex(served, tmp_path, "Reply with one short sentence: hello.")
    assert_clean(first)
    messages = [i for i in items(first) if i.get("type") == "agent_message"]
    assert messages and messages[-1].get("text", "").strip(), first.explain()
    head = main_request(first.records, "responses")

    served.force_tool_choice("exec_command")
    second = codex(served, tmp_path, "Run the shell command: echo ds4d-e2e")
    assert_clean(second)
    call, after = tool_round_trip(second.records, "responses", "exec_command")
    assert_reused(head, call)
    commands = [i for i in items(second) if i.get("type") == "command_execution"]
    assert commands, second.explain()
    report("codex exec", head, call, first.seconds)


def test_codex_namespaced_tool(served: Served, tmp_path: Path) -> None:
    served.force_tool_choice("resume_agent")
    run = codex(served, tmp_path, "Resume the agent with id 7.")
    assert_clean(run)
    call, after = tool_round_trip(run.records, "responses", "resume_agent")
    assert "unsupported call" not in after.get("prompt", ""), after.get("prompt", "")[-2000:]
    assert "unsupported call" not in run.stdout + run.stderr, run.explain()
