"""`ds4d chat`: an interactive terminal conversation.

Against a running daemon (`--url`, default http://127.0.0.1:8000: the same KV slots and
prefix reuse as any client, over its OpenAI chat route, streamed) or in-process with
`--local` (one engine session that keeps the conversation's KV, so each turn prefills only
what is new). Replies stream as they are sampled, reasoning dimmed; a status line after
each reply gives the prompt tokens, how many were already cached, and the speed. Ctrl+C
stops the current reply and returns to the prompt; at the prompt, Ctrl+D or /quit leaves.

Commands: /help, /think, /nothink, /ctx N, /read FILE, /model, /save FILE, /load FILE,
/clear, /quit. /save writes the conversation as JSON and, with --local, the session's KV
beside it (FILE.kv, the engine's checkpoint payload); /load reads them back, so a loaded
conversation continues without prefilling it again.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from ds4d.cli.steer import add_steering_flags, steering_from_args
from ds4d.daemon.exitcodes import CliError

DIM, RESET, BOLD = "\x1b[2m", "\x1b[0m", "\x1b[1m"
HELP = """commands:
  /help          this list
  /think         ask for reasoning (models that have it)   /nothink  ask for none
  /ctx N         local: a new session of N tokens (the conversation is kept)
  /read FILE     put FILE's text into your next message
  /model         the model and where it runs
  /save FILE     save the conversation (and, local, its KV as FILE.kv)
  /load FILE     load a saved conversation
  /clear         start a new conversation
  /quit          leave (also Ctrl+D); Ctrl+C stops a reply"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        default=os.environ.get("DS4D_URL", "http://127.0.0.1:8000"),
        help="the daemon (default http://127.0.0.1:8000 or $DS4D_URL)",
    )
    p.add_argument("--api-key", default=os.environ.get("DS4D_API_KEY"))
    p.add_argument("--local", action="store_true", help="run the model in this process")
    p.add_argument("-m", "--model", help="--local: GGUF file (default: the embedded model)")
    p.add_argument("--ctx", type=int, default=4096, help="--local: session context")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("-s", "--system", help="a system message")
    p.add_argument("-n", "--max-tokens", type=int, default=1024, help="per reply")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--history-file", type=Path,
                   default=Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local/state"))
                   / "ds4d" / "chat_history", help="readline history")  # fmt: skip
    add_steering_flags(p)


class Backend(Protocol):
    """Where replies come from: stream(messages, thinking, write(text, is_reasoning),
    interrupt) streams one reply and returns its status line."""

    def describe(self) -> str: ...

    def stream(self, messages: list[dict[str, str]], thinking: bool | None, write: Any,
               interrupt: threading.Event) -> str: ...  # fmt: skip


class LocalBackend:
    def __init__(self, args: argparse.Namespace) -> None:
        from ds4d.chat.local import LocalChat
        from ds4d.engine import Engine, EngineError
        from ds4d.engine.default_model import resolve_model_path

        try:
            self.engine = Engine.open(resolve_model_path(args.model), threads=args.threads)
        except (EngineError, FileNotFoundError) as e:
            raise CliError(str(e)) from None
        steering_from_args(args, self.engine)
        self.args = args
        self.chat = LocalChat(self.engine, args.ctx)

    def describe(self) -> str:
        i = self.engine.info
        return (f"{i.name} ({i.architecture}, {i.quant}) in-process, {self.engine.threads} "
                f"threads, context {self.chat.n_ctx}")  # fmt: skip

    def resize(self, n_ctx: int) -> None:
        from ds4d.chat.local import LocalChat

        self.chat.close()
        self.chat = LocalChat(self.engine, n_ctx)

    def stream(self, messages: list[dict[str, str]], thinking: bool | None, write: Any,
               interrupt: threading.Event) -> str:  # fmt: skip
        from ds4d.chat.types import ChatRequest, Message, ReasoningDelta, Sampling, TextDelta

        req = ChatRequest(
            messages=[Message(m["role"], m["content"]) for m in messages],  # type: ignore[arg-type]
            sampling=Sampling(temperature=self.args.temperature, seed=self.args.seed),
            max_tokens=self.args.max_tokens, thinking=thinking,
        )  # fmt: skip

        def on_event(ev: Any) -> None:
            if isinstance(ev, TextDelta):
                write(ev.text, False)
            elif isinstance(ev, ReasoningDelta):
                write(ev.text, True)

        t0 = time.perf_counter()
        out: dict[str, Any] = {}

        def work() -> None:
            try:
                out["reply"] = self.chat.generate(req, on_event, interrupt)
            except Exception as e:  # shown to the user; the session stays usable
                out["error"] = str(e)

        worker = threading.Thread(target=work, daemon=True)
        worker.start()
        worker.join()  # Ctrl+C sets `interrupt` (Repl.turn's handler); the worker sees it
        if "error" in out:
            raise RuntimeError(out["error"])
        r = out["reply"]
        dt = max(time.perf_counter() - t0, 1e-9)
        return (f"[{r.prompt_tokens} prompt tokens, {r.cached_tokens} cached; "
                f"{r.completion_tokens} generated, {r.completion_tokens / dt:.1f} t/s"
                f"{'; interrupted' if r.finish == 'interrupted' else ''}]")  # fmt: skip

    def save_kv(self, path: Path) -> None:
        with path.open("wb") as fp:
            self.chat.session.save(fp)

    def load_kv(self, path: Path) -> None:
        with path.open("rb") as fp:
            self.chat.session.load(fp)


class DaemonBackend:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.url = args.url.rstrip("/")
        try:
            models = self._get("/v1/models")
        except OSError as e:
            raise CliError(
                f"no ds4d daemon at {self.url} ({e}); start one or use --local"
            ) from None
        self.model = models["data"][0]["id"] if models.get("data") else ""

    def describe(self) -> str:
        return f"{self.model} on the daemon at {self.url}"

    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.args.api_key:
            h["Authorization"] = f"Bearer {self.args.api_key}"
        return h

    def _get(self, path: str) -> Any:
        import urllib.request

        with urllib.request.urlopen(
            urllib.request.Request(self.url + path, headers=self._headers()), timeout=10
        ) as r:
            return json.loads(r.read())

    def stream(self, messages: list[dict[str, str]], thinking: bool | None, write: Any,
               interrupt: threading.Event) -> str:  # fmt: skip
        import urllib.error
        import urllib.request

        body: dict[str, Any] = {
            "model": self.model, "messages": messages, "stream": True,
            "stream_options": {"include_usage": True}, "max_tokens": self.args.max_tokens,
            "temperature": self.args.temperature,
        }  # fmt: skip
        if self.args.seed is not None:
            body["seed"] = self.args.seed
        if thinking is not None:
            body["reasoning_effort"] = "high" if thinking else "none"
        req = urllib.request.Request(self.url + "/v1/chat/completions",
                                     data=json.dumps(body).encode(), headers=self._headers())  # fmt: skip
        t0 = time.perf_counter()
        usage: dict[str, Any] = {}
        interrupted = False
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                try:
                    for raw in r:
                        line = raw.decode("utf-8", "replace").strip()
                        if not line.startswith("data:") or line == "data: [DONE]":
                            continue
                        chunk = json.loads(line[5:])
                        usage = chunk.get("usage") or usage
                        for choice in chunk.get("choices", []):
                            delta = choice.get("delta", {})
                            if delta.get("reasoning_content"):
                                write(delta["reasoning_content"], True)
                            if delta.get("content"):
                                write(delta["content"], False)
                except KeyboardInterrupt:
                    interrupted = True  # closing the response cancels the generation
        except KeyboardInterrupt:
            interrupted = True
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"HTTP {e.code}: {e.read().decode('utf-8', 'replace')}") from None
        except OSError as e:
            raise RuntimeError(f"the daemon: {e}") from None
        if interrupted:
            return "[interrupted]"
        dt = max(time.perf_counter() - t0, 1e-9)
        done = usage.get("completion_tokens", 0)
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        return (f"[{usage.get('prompt_tokens', 0)} prompt tokens, {cached} cached; "
                f"{done} generated, {done / dt:.1f} t/s]")  # fmt: skip


class Repl:
    def __init__(self, backend: Backend, system: str | None, color: bool) -> None:
        self.backend = backend
        self.messages: list[dict[str, str]] = []
        if system:
            self.messages.append({"role": "system", "content": system})
        self.thinking: bool | None = None
        self.pending_files: list[str] = []
        self.color = color
        self._dim = False

    def write(self, text: str, reasoning: bool) -> None:
        if self.color and reasoning != self._dim:
            sys.stdout.write(DIM if reasoning else RESET)
            self._dim = reasoning
        sys.stdout.write(text)
        sys.stdout.flush()

    def note(self, text: str) -> None:
        sys.stdout.write((f"{DIM}{text}{RESET}" if self.color else text) + "\n")
        sys.stdout.flush()

    def command(self, line: str) -> bool:
        """Runs a /command; False to leave."""
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        if name in ("/quit", "/exit"):
            return False
        if name == "/help":
            self.note(HELP)
        elif name == "/think":
            self.thinking = True
            self.note("reasoning on")
        elif name == "/nothink":
            self.thinking = False
            self.note("reasoning off")
        elif name == "/model":
            self.note(self.backend.describe())
        elif name == "/clear":
            self.messages = [m for m in self.messages if m["role"] == "system"]
            self.note("new conversation")
        elif name == "/ctx":
            if not isinstance(self.backend, LocalBackend):
                self.note("/ctx sets the context of a --local session (the daemon has its own)")
            elif not arg.isdigit() or int(arg) < 16:
                self.note("usage: /ctx N (N >= 16)")
            else:
                self.backend.resize(int(arg))
                self.note(f"context {arg} tokens")
        elif name == "/read":
            try:
                text = Path(arg).expanduser().read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                self.note(f"cannot read {arg!r}: {e}")
            else:
                self.pending_files.append(f"{Path(arg).name}:\n```\n{text}\n```")
                self.note(f"{arg}: {len(text)} characters, added to your next message")
        elif name == "/save":
            self._save(Path(arg).expanduser()) if arg else self.note("usage: /save FILE")
        elif name == "/load":
            self._load(Path(arg).expanduser()) if arg else self.note("usage: /load FILE")
        else:
            self.note(f"unknown command {name}; /help lists them")
        return True

    def _save(self, path: Path) -> None:
        try:
            path.write_text(json.dumps({"messages": self.messages}, indent=1) + "\n")
            if isinstance(self.backend, LocalBackend):
                self.backend.save_kv(path.with_name(path.name + ".kv"))
        except OSError as e:
            self.note(f"cannot save: {e}")
            return
        self.note(f"saved {len(self.messages)} messages to {path}")

    def _load(self, path: Path) -> None:
        try:
            messages = json.loads(path.read_text())["messages"]
            if (
                isinstance(self.backend, LocalBackend)
                and path.with_name(path.name + ".kv").exists()
            ):
                self.backend.load_kv(path.with_name(path.name + ".kv"))
        except (OSError, ValueError, KeyError) as e:
            self.note(f"cannot load {path}: {e}")
            return
        self.messages = messages
        self.note(f"loaded {len(messages)} messages from {path}")

    def turn(self, text: str) -> None:
        content = "\n\n".join([*self.pending_files, text]) if self.pending_files else text
        self.pending_files = []
        self.messages.append({"role": "user", "content": content})
        interrupt = threading.Event()
        parts: list[str] = []

        def write(t: str, reasoning: bool) -> None:
            if not reasoning:
                parts.append(t)
            self.write(t, reasoning)

        def on_sigint(signum: int, frame: Any) -> None:
            interrupt.set()
            if isinstance(self.backend, DaemonBackend):  # unblocks the stream's read
                raise KeyboardInterrupt

        previous = signal.signal(signal.SIGINT, on_sigint)
        try:
            status = self.backend.stream(self.messages, self.thinking, write, interrupt)
        except RuntimeError as e:
            self.write("", False)
            self.messages.pop()
            self.note(f"\nerror: {e}")
            return
        finally:
            signal.signal(signal.SIGINT, previous)
        self.write("\n", False)
        self.messages.append({"role": "assistant", "content": "".join(parts)})
        self.note(status)


def run(args: argparse.Namespace) -> int:
    backend: Backend = LocalBackend(args) if args.local else DaemonBackend(args)
    repl = Repl(backend, args.system, color=sys.stdout.isatty() and "NO_COLOR" not in os.environ)
    try:
        import readline
    except ImportError:  # pragma: no cover - every supported platform has it
        readline = None  # type: ignore[assignment]
    if readline is not None:
        try:
            args.history_file.parent.mkdir(parents=True, exist_ok=True)
            readline.read_history_file(args.history_file)
        except OSError:
            pass
    repl.note(f"ds4d chat: {backend.describe()}. /help for commands, Ctrl+C stops a reply.")
    try:
        while True:
            try:
                line = input("> ")
            except KeyboardInterrupt:
                sys.stdout.write("\n")
                continue
            except EOFError:
                sys.stdout.write("\n")
                break
            line = line.strip()
            if not line:
                continue
            if line.startswith("/"):
                if not repl.command(line):
                    break
                continue
            repl.turn(line)
    finally:
        if readline is not None:
            try:
                readline.write_history_file(args.history_file)
            except OSError:
                pass
    return 0
