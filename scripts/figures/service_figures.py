"""Measure the service-level figures the issues name, on real ds4d processes:

- reuse:    a ~2500-token conversation sent again plus one user turn (cached share, TTFT);
- restart:  a ~6000-token chat cold, SIGTERM, restart, same conversation + one turn;
- eviction: three long conversations through two slots, then the first again;
- power:    process CPU time / wall time of a cold prefill at power 100 vs 50, and
            whether the output is identical.

Usage: .venv/bin/python scripts/figures/service_figures.py [PROMPT_TEXT_FILE]
(default tests/data/text/promessi_sposi.txt). Ports are ephemeral, state lives in a
temporary directory. A measuring tool, not a test: it prints figures, it asserts nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import openai

from ds4d.tools.serve_process import private_env, serve_process

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
START_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 600.0  # a long session's checkpoint written at shutdown


@contextmanager
def daemon(state: Path, *args: str) -> Iterator[tuple[openai.OpenAI, subprocess.Popen[bytes]]]:
    """`ds4d serve ARGS` with its cache and runtime directories in `state` (kept across
    restarts: the restart figure reads the checkpoints the previous daemon wrote), started
    by the shared helper (ds4d.tools.serve_process). SIGTERM at the end, and the shutdown
    checkpoints are waited for."""
    env = private_env({"XDG_CACHE_HOME": state / "cache", "XDG_RUNTIME_DIR": state / "run"})
    with serve_process(args, env=env, log_path=state / "ds4d.log", start_timeout=START_TIMEOUT_S,
                       stop_timeout=STOP_TIMEOUT_S) as child:  # fmt: skip
        yield openai.OpenAI(base_url=f"{child.url}/v1", api_key="x"), child.proc


def ask(client: openai.OpenAI, messages: list[dict], max_tokens: int = 1):
    t = time.perf_counter()
    r = client.chat.completions.create(
        model="local", messages=messages, max_tokens=max_tokens, temperature=0
    )
    return r, time.perf_counter() - t


def then(messages: list[dict], reply, user: str) -> list[dict]:
    return messages + [
        {"role": "assistant", "content": reply.choices[0].message.content},
        {"role": "user", "content": user},
    ]


def last_trace(path: Path) -> dict:
    return json.loads(path.read_text().splitlines()[-1])


def cached(r) -> int:
    return r.usage.prompt_tokens_details.cached_tokens


def main() -> None:
    text_file = (
        Path(sys.argv[1]) if len(sys.argv) > 1 else (REPO / "tests/data/text/promessi_sposi.txt")
    )
    text = text_file.read_text(encoding="utf-8")
    state = Path(tempfile.mkdtemp(prefix="ds4d-figures-"))
    trace = state / "trace.jsonl"

    with daemon(state, "--slots", "2", "--trace", str(trace)) as (client, _):
        conv = [{"role": "user", "content": text[50000:56000]}]
        r1, t1 = ask(client, conv)
        r2, t2 = ask(client, then(conv, r1, "Go on."))
        print(
            f"reuse: prompt {r1.usage.prompt_tokens}, next turn cached {cached(r2)} "
            f"({100 * cached(r2) / r1.usage.prompt_tokens:.1f}% of the old prompt), "
            f"TTFT {t1:.2f}s -> {t2:.2f}s ({100 * t2 / t1:.1f}%)"
        )

        convs = [
            [
                {
                    "role": "user",
                    "content": f"Conversation {i}.\n" + text[100000 + 9000 * i : 106000 + 9000 * i],
                }
            ]
            for i in range(3)
        ]
        firsts = [ask(client, c)[0] for c in convs]
        r, _ = ask(client, then(convs[0], firsts[0], "Again."))
        print(
            f"eviction: 3 conversations through 2 slots, the first again: cached "
            f"{cached(r)} of {firsts[0].usage.prompt_tokens} "
            f"({100 * cached(r) / firsts[0].usage.prompt_tokens:.1f}%), "
            f"source {last_trace(trace)['cache_source']}"
        )

        conv = [{"role": "user", "content": "Summarise:\n" + text[:15500]}]
        cold, _ = ask(client, conv, 8)
        cold_trace = last_trace(trace)
    with daemon(state, "--slots", "2", "--trace", str(trace)) as (client, _):
        warm, _ = ask(client, then(conv, cold, "Now in one line."), 8)
        warm_trace = last_trace(trace)
    print(
        f"restart: cold prompt {cold.usage.prompt_tokens} (TTFT {cold_trace['ttft_s']:.2f}s); "
        f"after SIGTERM + restart, prompt {warm.usage.prompt_tokens}: cached {cached(warm)} "
        f"from {warm_trace['cache_source']}, TTFT {warm_trace['ttft_s']:.2f}s "
        f"({100 * warm_trace['ttft_s'] / cold_trace['ttft_s']:.1f}% of cold)"
    )

    # One slot, no disk cache: every run of the same prompt is a cold prefill.
    sock = state / "run" / "ds4d" / "ds4d.sock"
    with daemon(state, "--slots", "1", "--no-kv-disk") as (client, proc):
        clock = os.sysconf("SC_CLK_TCK")

        def cpu_seconds() -> float:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().split()
            return (int(fields[13]) + int(fields[14])) / clock

        shares: dict[int, list[float]] = {100: [], 50: []}
        outputs = set()
        for level in (100, 50, 100, 50):
            subprocess.run(
                [str(BIN / "ds4ctl"), "--socket", str(sock), "power", str(level)],
                check=True,
                capture_output=True,
            )
            c0, w0 = cpu_seconds(), time.perf_counter()
            r, _ = ask(client, [{"role": "user", "content": text[200000:204000]}], 16)
            shares[level].append((cpu_seconds() - c0) / (time.perf_counter() - w0))
            outputs.add(r.choices[0].message.content)
            ask(client, [{"role": "user", "content": text[300000:303000]}])  # displace it
        mean = {lv: sum(v) / len(v) for lv, v in shares.items()}
        print(
            f"power: CPU/wall {mean[100]:.2f} at 100, {mean[50]:.2f} at 50 "
            f"(ratio {mean[50] / mean[100]:.2f}); identical output: {len(outputs) == 1}"
        )


if __name__ == "__main__":
    main()
