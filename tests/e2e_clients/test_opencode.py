"""opencode (`opencode run`) against ds4d's /v1/chat/completions through the
`@ai-sdk/openai-compatible` provider, configured in the project's opencode.json as the
docs/clients.md shows (plus the model's output limit, and updates and sharing off).

One plain run (clean exit, text out; opencode also sends a short title request, which
the second slot takes), then a run with the live `force_tool_choice` set to `bash`:
opencode runs the command and sends its output back."""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e_clients.conftest import (
    CLIENTS_DIR,
    MAX_OUTPUT,
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


def config(served: Served) -> dict:
    return {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "permission": {"bash": "allow"},
        "provider": {
            "ds4d": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "ds4d (local)",
                "options": {"baseURL": f"{served.url}/v1", "apiKey": "local"},
                "models": {
                    "local": {
                        "name": "local model",
                        "limit": {"context": 32768, "output": MAX_OUTPUT},
                    }
                },
            }
        },
        "model": "ds4d/local",
    }


def opencode(served: Served, tmp: Path, prompt: str) -> Run:
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    (work / "opencode.json").write_text(json.dumps(config(served), indent=2))
    env = base_env(tmp / "home")
    # The provider package, installed beforehand by scripts/setup/install-e2e-clients.sh:
    # opencode would otherwise fetch it from npm on first use.
    env["XDG_CACHE_HOME"] = str(CLIENTS_DIR / "opencode-cache")
    env.update(
        OPENCODE_DISABLE_AUTOUPDATE="1",
        OPENCODE_DISABLE_MODELS_FETCH="1",
        OPENCODE_DISABLE_LSP_DOWNLOAD="1",
    )
    argv = [str(client_bin("opencode")), "run", "--format", "json", prompt]
    return run_client(served, argv, env, work)


def parts(run: Run) -> list[dict]:
    out = []
    for line in run.stdout.splitlines():
        if line.startswith("{"):
            part = json.loads(line).get("part")
            if isinstance(part, dict):
                out.append(part)
    return out


def test_opencode_run(served: Served, tmp_path: Path) -> None:
    served.force_tool_choice("")
    first = opencode(served, tmp_path, "Reply with one short sentence: hello.")
    assert first.returncode == 0, first.explain()
    texts = [p.get("text", "") for p in parts(first) if p.get("type") == "text"]
    assert "".join(texts).strip(), first.explain()
    head = main_request(first.records, "chat")

    served.force_tool_choice("bash")
    second = opencode(served, tmp_path, "Run the shell command: echo ds4d-e2e")
    assert second.returncode == 0, second.explain()
    for run in (first, second):
        shown = [p.get("text", "") for p in parts(run) if p.get("type") in ("text", "reasoning")]
        assert_no_markup(shown, run)
    call, after = tool_round_trip(second.records, "chat", "bash")
    assert_reused(head, call)
    ran = [p for p in parts(second) if p.get("type") == "tool" and p.get("tool") == "bash"]
    assert ran and ran[0]["state"]["status"] in ("completed", "error"), second.explain()
    report("opencode run", head, call, first.seconds)
