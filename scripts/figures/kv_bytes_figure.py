"""Resident and disk bytes per token of each `--kv-type`, measured on real ds4d processes.

Per KV type, a two-slot ds4d (`--ctx 8192`, disk KV in a temporary directory) prefills a
first ~`--tokens`-token prompt (paging the weights in), then another on the other slot
(passages of the test text). Printed per type:

- reserved: the engine's KV memory for the slot's context (Session.kv_bytes, in this
  process with the same model and type) per context position;
- resident: the daemon's resident set (VmRSS) after the second prompt (and its
  checkpoint's write) minus before it, per prompt token (the KV rows it wrote);
- disk: the bytes of the checkpoint files both prompts left per KV row they hold (a
  delta holds the rows after its base's; header, key text, ids and logits included);
- the ratio of each to f32.

Usage: .venv/bin/python scripts/figures/kv_bytes_figure.py [--tokens 4000] [--types f32,f16,q8_0]
A measuring tool, not a test: bytes do not depend on the load, but it is printed anyway.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fair_prefill_figure import long_prompt  # noqa: E402
from figure_daemon import Daemon, load, started  # noqa: E402

CTX = 8192


def rss(d: Daemon) -> int:
    for line in Path(f"/proc/{d.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def ask(d: Daemon, prompt: str) -> int:
    """Prefill `prompt` (one token of answer); its token count."""
    body = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": prompt}]}
    r = httpx.post(f"{d.url}/v1/chat/completions", json=body, timeout=3600)
    r.raise_for_status()
    return int(r.json()["usage"]["prompt_tokens"])


def disk_per_row(d: Daemon) -> tuple[float, int]:
    """Bytes of all checkpoint files per KV row they hold (a delta holds the rows after
    its base's), and the rows: header, key text, token ids and logits included."""
    d.idle_writer()
    files: list[dict] = d.ds4ctl("cache", "ls")  # type: ignore[assignment]
    tokens = {f["name"]: f["tokens"] for f in files}
    rows = sum(f["tokens"] - (tokens[f["base"]] if f["base"] else 0) for f in files)
    return sum(f["bytes"] for f in files) / rows, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--types", default="f32,f16,q8_0")
    args = ap.parse_args()
    from ds4d.engine.default_model import default_model_path
    from ds4d.engine.engine import Engine

    print(f"# ds4d serve --slots 2 --threads 2 --ctx {CTX} --kv-type T; load {load()}")
    print("kv_type,reserved_per_position,resident_per_token,disk_per_row,prompt_tokens,"
          "rows_on_disk,load1")  # fmt: skip
    rows: dict[str, tuple[float, float, float]] = {}
    for kv_type in args.types.split(","):
        engine = Engine.open(default_model_path(), threads=1, kv_type=kv_type)
        with engine.new_session(CTX) as s:
            reserved = s.kv_bytes / CTX
        engine.close()
        with started("--slots", "2", "--threads", "2", "--ctx", str(CTX),
                     "--kv-type", kv_type) as d:  # fmt: skip
            # The first prompt pages the weights in and sizes the prefill's buffers; the
            # second goes to the other slot (it shares only the template with the first),
            # whose KV rows are then the resident set's only growth.
            ask(d, long_prompt(d.url, args.tokens, 200000))
            d.idle_writer()
            prompt = long_prompt(d.url, args.tokens, 3000)
            before = rss(d)
            n = ask(d, prompt)
            d.idle_writer()  # the checkpoint's copy of the rows is written and freed
            resident = (rss(d) - before) / n
            disk, held = disk_per_row(d)
        rows[kv_type] = (reserved, resident, disk)
        print(f"{kv_type},{reserved:.0f},{resident:.0f},{disk:.0f},{n},{held},{load()}",
              flush=True)  # fmt: skip
    if "f32" in rows:
        base = rows["f32"]
        for kv_type, values in rows.items():
            ratios = ", ".join(f"{v / b:.3f}" for v, b in zip(values, base, strict=True))
            print(f"# {kv_type} / f32 (reserved, resident, disk): {ratios}")


if __name__ == "__main__":
    main()
