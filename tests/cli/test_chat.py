"""`ds4d chat` through a pseudo-terminal, as a user types into it (pexpect: keys in, screen
out): two turns where the second reuses the first's KV, /read, Ctrl+C in the middle of a
reply, /save and /load, /quit — in-process (--local) and against a running daemon."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest

from tests.conftest import REPO

STATUS = re.compile(rb"\[(\d+) prompt tokens, (\d+) cached; (\d+) generated")
PROMPT = "\r\n> "


def spawn(tmp_path: Path, *args: str) -> pexpect.spawn:
    env = dict(os.environ, PYTHONUNBUFFERED="1", NO_COLOR="1", TERM="dumb")
    child = pexpect.spawn(
        sys.executable,
        ["-m", "ds4d", "chat", "--threads", "2", "--temperature", "0",
         "--history-file", str(tmp_path / "history"), *args],
        cwd=str(REPO), env=env, timeout=180,
    )  # fmt: skip
    child.expect("ds4d chat: ")
    child.expect_exact("> ")
    return child


def say(child: pexpect.spawn, line: str) -> tuple[int, int, int]:
    """Sends a line, waits for the reply's status line and the next prompt."""
    child.sendline(line)
    child.expect(STATUS)
    status = tuple(int(g) for g in child.match.groups())
    child.expect_exact(PROMPT)
    return status  # type: ignore[return-value]


def quit_cleanly(child: pexpect.spawn) -> None:
    child.sendline("/quit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def conversation(child: pexpect.spawn, tmp_path: Path) -> None:
    """What both backends must do."""
    p1, cached1, n1 = say(child, "What is the capital of France?")
    assert cached1 == 0 and n1 > 0
    p2, cached2, _ = say(child, "And of Italy?")
    # the second turn's prompt starts with the whole first exchange: all of it reused
    assert cached2 >= p1 and p2 > p1
    # /read puts the file into the next message
    note = tmp_path / "note.txt"
    note.write_text("The secret password is BLUE-HARBOUR-77.\n" * 8)
    child.sendline(f"/read {note}")
    child.expect_exact("added to your next message")
    child.expect_exact(PROMPT)
    p3, cached3, _ = say(child, "What is the secret password?")
    assert p3 - p2 > 80 and cached3 >= p2  # the file's ~100 tokens are in the prompt
    # Ctrl+C in the middle of a long reply: back at the prompt, the session still works
    child.sendline("Write a very long story about a dragon who learns to cook.")
    child.expect_exact("cook.\r\n")  # the echo of the line typed
    child.expect(r"\w+ \w+ \w+")  # the reply is streaming
    child.sendintr()
    child.expect(r"\[(\d+) prompt tokens.*interrupted\]|\[interrupted\]")
    child.expect_exact(PROMPT)
    _, _, n5 = say(child, "Say hello.")
    assert n5 > 0


@pytest.mark.timeout(600)
def test_local_chat_in_a_terminal(tmp_path: Path) -> None:
    child = spawn(tmp_path, "--local", "-n", "120", "--ctx", "2048")
    child.sendline("/help")
    child.expect_exact("/read FILE")
    child.expect_exact(PROMPT)
    child.sendline("/model")
    child.expect_exact("in-process")
    child.expect_exact(PROMPT)
    conversation(child, tmp_path)
    # /save writes the conversation and its KV; a new process /loads them and continues
    # with the whole conversation already cached
    saved = tmp_path / "conv.json"
    child.sendline(f"/save {saved}")
    child.expect_exact("saved")
    child.expect_exact(PROMPT)
    quit_cleanly(child)
    assert saved.is_file() and (tmp_path / "conv.json.kv").is_file()
    child = spawn(tmp_path, "--local", "-n", "16", "--ctx", "2048")
    child.sendline(f"/load {saved}")
    child.expect_exact("loaded")
    child.expect_exact(PROMPT)
    p, cached, _ = say(child, "Thanks!")
    assert cached > 100 and p > cached
    quit_cleanly(child)
    assert "Thanks!" in (tmp_path / "history").read_text()  # readline history kept


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[str]:
    import tempfile

    from ds4d.tools.serve_process import private_env, serve_process

    with tempfile.TemporaryDirectory(prefix="ds4c") as short:  # the admin socket's path
        dirs = {
            var: Path(short) / var.lower()
            for var in ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME", "XDG_RUNTIME_DIR")
        }
        with serve_process(
            ["--threads", "2", "--ctx", "2048", "--slots", "1", "--no-kv-disk"],
            env=private_env(dirs), log_path=tmp_path / "serve.log", start_timeout=120,
        ) as server:  # fmt: skip
            yield server.url


@pytest.mark.timeout(600)
def test_chat_against_a_running_daemon(tmp_path: Path, daemon: str) -> None:
    child = spawn(tmp_path, "--url", daemon, "-n", "120")
    child.sendline("/model")
    child.expect_exact("on the daemon at")
    child.expect_exact(PROMPT)
    conversation(child, tmp_path)
    quit_cleanly(child)


def test_no_daemon_is_a_clear_error(tmp_path: Path) -> None:
    child = pexpect.spawn(sys.executable, ["-m", "ds4d", "chat", "--url", "http://127.0.0.1:9"],
                          cwd=str(REPO), timeout=60)  # fmt: skip
    child.expect_exact("no ds4d daemon at http://127.0.0.1:9")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus != 0
