"""What a growing session writes to disk: bytes per checkpoint against the KV rows it adds.

One conversation on a one-slot ds4d (`--ctx 32768` by default, disk KV in a temporary
directory) grows turn by turn — each turn resends the history (with the model's own
answers) plus a new passage of the test text (`--turn-tokens`) — until its prompt holds
`--tokens` tokens. After each turn, once the background writer is idle, it reads
`ds4d_kv_disk_bytes_written_total` and `ds4d_kv_disk_files_written_total` from /metrics
and the checkpoint files from `ds4ctl cache ls --json`. Every file is then printed with
its tokens, the rows it adds (its tokens minus its base's; a full file adds all of them),
its size, those rows' KV bytes (rows x the model's bytes per token in the KV type) and
the rest (header, the key text, the new tokens' ids, the last logits, the tool map). The
last line sums it up: bytes written over the session against its rows' KV bytes (1.00
would be every row written exactly once).

Usage: .venv/bin/python scripts/figures/continued_checkpoint_figure.py [--tokens 20000]
       [--turn-tokens 2000] [--ctx 32768] [--kv-type f16] [-- extra ds4d serve flags]
A measuring tool, not a test: it prints figures with the load average.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from figure_daemon import load, passage, split_serve_flags, started  # noqa: E402


def row_bytes(kv_type: str) -> int:
    """The embedded model's KV bytes per token in `kv_type` (what one row costs)."""
    from ds4d.engine.default_model import default_model_path
    from ds4d.engine.engine import Engine

    engine = Engine.open(default_model_path(), threads=1)
    return int(engine.model.kv_token_bytes(kv_type))


def main() -> None:
    argv, extra = split_serve_flags(sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=20000)
    ap.add_argument("--turn-tokens", type=int, default=2000)
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--kv-type", default="f16")
    ap.add_argument("--answer-tokens", type=int, default=32)
    args = ap.parse_args(argv)
    row = row_bytes(args.kv_type)
    flags = ["--slots", "1", "--threads", "2", "--ctx", str(args.ctx),
             "--kv-type", args.kv_type, *extra]  # fmt: skip
    print(f"# ds4d serve {' '.join(flags)}; {row} KV bytes per token; load {load()}")
    messages: list[dict] = []
    words = args.turn_tokens // 2  # about two tokens a word in this text
    print("turn,prompt_tokens,cached_tokens,files_written,bytes_written,load1")
    with started(*flags) as d:
        turn, prompt = 0, 0
        while prompt < args.tokens:
            content = passage(words, 5000 * turn + 17) + "\n\nWhat happens in this part?"
            messages.append({"role": "user", "content": content})
            r = httpx.post(
                f"{d.url}/v1/chat/completions",
                json={
                    "model": "m",
                    "messages": messages,
                    "temperature": 0,
                    "max_tokens": args.answer_tokens,
                },  # fmt: skip
                timeout=3600,
            )
            r.raise_for_status()
            body = r.json()
            messages.append(
                {"role": "assistant", "content": body["choices"][0]["message"]["content"]}
            )
            prompt = body["usage"]["prompt_tokens"]
            cached = (body["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            m = d.idle_writer()
            print(f"{turn},{prompt},{cached},{int(m['ds4d_kv_disk_files_written_total'])},"
                  f"{int(m['ds4d_kv_disk_bytes_written_total'])},{load()}", flush=True)  # fmt: skip
            turn += 1
        m = d.idle_writer()
        files = list(d.ds4ctl("cache", "ls"))  # type: ignore[call-overload]
    by_name = {f["name"]: f for f in files}
    print("file_tokens,base_tokens,new_rows,file_bytes,new_rows_kv_bytes,rest_bytes,"
          "text_bytes,reason")  # fmt: skip
    rows_total = 0
    for f in sorted(files, key=lambda f: f["tokens"]):
        base = by_name.get(f["base"]) if f["base"] else None
        base_tokens = base["tokens"] if base else 0
        new = f["tokens"] - base_tokens
        rows_total += new
        print(f"{f['tokens']},{base_tokens},{new},{f['bytes']},{new * row},"
              f"{f['bytes'] - new * row},{f['text_bytes']},{f['reason']}")  # fmt: skip
    written = int(m["ds4d_kv_disk_bytes_written_total"])
    print(f"# {len(files)} checkpoints of a {prompt}-token session: {written} bytes written "
          f"for {rows_total} rows ({rows_total * row} KV bytes): "
          f"{written / max(1, rows_total * row):.3f}x; load {load()}")  # fmt: skip


if __name__ == "__main__":
    main()
