"""Kill figures: `kill -9` a real ds4d while it writes a disk KV checkpoint, N times, and
check after every restart that nothing corrupt is accepted and the cache is still reused.

Each round, on one daemon with a persistent --kv-disk-dir:
 1. conversation A_i is sent and answered (its checkpoint completes);
 2. conversation B_i is sent, and the daemon gets SIGKILL as soon as a checkpoint's
    temporary file appears in the directory (a write under way);
 3. the daemon is restarted on the same directory: the unfinished write must be removed,
    every remaining checkpoint must pass its checks (header, sizes, checksums), and
    A_i sent again plus one user turn must be served from disk (cache_source disk-text,
    cached tokens > 0 in the trace and in usage) - the replay.
The restarted daemon carries on with the next round, so N rounds cost N + 1 starts.

Printed: kills landed during a write, restarts, unfinished writes removed, files checked
and corrupt ones accepted (must be 0), replays and those that reused the cache (must be
all), per round and in total.

Usage: .venv/bin/python scripts/ops/kill_during_checkpoint.py [--rounds 50]
A measuring tool, not a test: loopback only, every wait bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from ds4d.state import kvfile
from ds4d.tools.serve_process import ServeProcess, ServeProcessError, private_env, start_serve

WORDS = ("river stone lantern harbor meadow copper violin orchard glacier pepper canyon "
         "saddle beacon tundra marble falcon").split()  # fmt: skip


def prompt(tag: str, words: int) -> str:
    body = " ".join(WORDS[(i * 7 + len(tag)) % len(WORDS)] for i in range(words))
    return f"Conversation {tag}. Summarise this list in one word: {body}"


class Daemon:
    def __init__(self, state: Path, args: argparse.Namespace) -> None:
        self.state = state
        self.args = args
        self.kv = state / "kv"
        self.trace = state / "trace.jsonl"
        self.log_path = state / "ds4d.log"
        self.daemon: ServeProcess | None = None
        self.url = ""

    def start(self) -> None:
        runtime = Path(tempfile.mkdtemp(prefix="ds4d-kill-rt-"))
        env = private_env({"XDG_RUNTIME_DIR": runtime, "XDG_CONFIG_HOME": self.state / "config",
                           "XDG_STATE_HOME": self.state / "xstate"})  # fmt: skip
        args = ["--slots", "1", "--ctx", str(self.args.ctx), "--kv-disk", "--kv-disk-dir",
                str(self.kv), "--trace", str(self.trace), "--max-tokens", "4",
                "--temperature", "0"]  # fmt: skip
        self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        try:
            self.daemon = start_serve(args, env=env, log_path=self.log_path, start_timeout=300,
                                      append=True)  # fmt: skip
        except ServeProcessError as e:
            raise SystemExit(f"{e}\nsee {self.log_path}") from None
        self.url = self.daemon.url

    def log_since_start(self) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(self.log_offset)
            return f.read().decode(errors="replace")

    def chat(self, messages: list[dict], timeout: float = 600) -> dict:
        r = httpx.post(f"{self.url}/v1/chat/completions", timeout=timeout,
                       json={"model": "ds4d", "messages": messages, "max_tokens": 4,
                             "temperature": 0})  # fmt: skip
        r.raise_for_status()
        return r.json()

    def kill(self) -> None:
        assert self.daemon is not None
        self.daemon.proc.send_signal(signal.SIGKILL)
        self.daemon.proc.wait()

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.stop(timeout=60)


def tmp_files(kv: Path) -> list[str]:
    return [n for n in os.listdir(kv) if kvfile.TMP_MARKER in n] if kv.is_dir() else []


def check_files(kv: Path) -> tuple[int, int]:
    """(files checked, files that fail their checks) among the live checkpoints."""
    checked = bad = 0
    for p in kv.glob(f"*{kvfile.SUFFIX}"):
        checked += 1
        try:
            kvfile.read_body(p, kvfile.read_header(p))
        except (kvfile.KVFileError, OSError):
            bad += 1
    return checked, bad


def last_trace(path: Path, after: int) -> dict | None:
    lines = [ln for ln in path.read_text().split("\n") if ln] if path.exists() else []
    return json.loads(lines[-1]) if len(lines) > after else None


def trace_count(path: Path) -> int:
    return len([ln for ln in path.read_text().split("\n") if ln]) if path.exists() else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--words", type=int, default=220, help="words in each conversation")
    ap.add_argument("--state-dir", type=Path, default=None)
    args = ap.parse_args()
    state = args.state_dir or Path(tempfile.mkdtemp(prefix="ds4d-kill-"))
    state.mkdir(parents=True, exist_ok=True)
    d = Daemon(state, args)
    totals = dict(kills=0, missed=0, restarts=0, removed=0, checked=0, corrupt=0,
                  replays=0, reused=0)  # fmt: skip
    t0 = time.monotonic()
    d.start()
    try:
        for i in range(args.rounds):
            a = [{"role": "user", "content": prompt(f"A{i}", args.words)}]
            reply_a = d.chat(a)["choices"][0]["message"]["content"]
            # B_i: killed while its checkpoint is written (another B if a write was missed)
            caught = False
            for attempt in range(5):
                b = [{"role": "user", "content": prompt(f"B{i}.{attempt}", args.words)}]
                done = threading.Event()

                def send(b: list[dict] = b, done: threading.Event = done) -> None:
                    try:
                        d.chat(b)
                    except httpx.HTTPError:
                        pass  # killed under it
                    done.set()

                threading.Thread(target=send, daemon=True).start()
                deadline = time.monotonic() + 600
                while not done.is_set() and time.monotonic() < deadline:
                    if tmp_files(d.kv):
                        d.kill()
                        caught = True
                        break
                    time.sleep(0.001)  # polling another process's files, bounded
                done.wait(30)
                if caught:
                    break
                totals["missed"] += 1
            if not caught:
                print(f"round {i}: no checkpoint write caught in 5 tries", flush=True)
                continue
            totals["kills"] += 1
            left = tmp_files(d.kv)
            n_traces = trace_count(d.trace)
            d.start()
            totals["restarts"] += 1
            log = d.log_since_start()
            removed = len(left) > 0 and not tmp_files(d.kv) and "unfinished write" in log
            totals["removed"] += int(removed)
            checked, bad = check_files(d.kv)
            totals["checked"] += checked
            # A corrupt file left in the live directory would be one the daemon may load.
            totals["corrupt"] += bad
            replay = [*a, {"role": "assistant", "content": reply_a},
                      {"role": "user", "content": "And in two words?"}]  # fmt: skip
            r = d.chat(replay)
            cached = r["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
            tr = last_trace(d.trace, n_traces) or {}
            reused = cached > 0 and tr.get("cache_source") == "disk-text"
            totals["replays"] += 1
            totals["reused"] += int(reused)
            print(f"round {i}: killed with {len(left)} unfinished write(s); restart removed"
                  f" them: {removed}; {checked} files checked, {bad} corrupt; replay cached"
                  f" {cached}/{r['usage']['prompt_tokens']} from {tr.get('cache_source')}"
                  f" ({time.monotonic() - t0:.0f} s)", flush=True)  # fmt: skip
    finally:
        d.stop()
    print(f"kill_during_checkpoint: {totals['kills']} kills during a write "
          f"({totals['missed']} writes missed and retried), {totals['restarts']} restarts, "
          f"{totals['removed']} unfinished writes removed, {totals['checked']} files checked, "
          f"{totals['corrupt']} corrupt accepted, {totals['reused']}/{totals['replays']} "
          f"replays reused the cache, {time.monotonic() - t0:.0f} s; state in {state}")  # fmt: skip
    ok = totals["corrupt"] == 0 and totals["reused"] == totals["replays"] and totals["kills"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
