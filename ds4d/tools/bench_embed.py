"""`ds4d bench embed`: embedding throughput on a code corpus, ds4d against llama.cpp's
embedding path on the same GGUF in the same run.

The corpus is this package's own source, cut at line ends into chunks of 256-512 tokens
(counted with the model's tokenizer). Both servers are started here and spoken to alike,
through OpenAI's POST /v1/embeddings: ds4d (`ds4d serve`, its embedding batching) and,
with `--llama-server BIN`, llama.cpp's `llama-server --embeddings` with the same model,
threads and pooling. At each batch size (`--batches`, inputs per request) every chunk is
embedded once, requests one after another; inputs/s and tokens/s (each server's own
usage.prompt_tokens) are the best of `--rounds` rounds, the servers taking turns
(A B, then B A). Output: a table, `--csv FILE`, `--plot FILE.png`.
"""

from __future__ import annotations

import argparse
import csv
import http.client
import importlib.util
import json
import os
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ds4d.daemon.exitcodes import CliError
from ds4d.tools.serve_process import (
    ServeProcessError,
    free_port,
    other_server,
    private_daemon,
)

CSV_FIELDS = ("server", "batch", "inputs", "tokens", "seconds", "inputs_per_s", "tokens_per_s",
              "threads", "model")  # fmt: skip
MIN_TOKENS, MAX_TOKENS = 256, 512
START_TIMEOUT_S = 300.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, help="GGUF (default: the embedded model)")
    p.add_argument("--pooling", default="", choices=("", "mean", "cls", "last"),
                   help="for a model that declares none (default: mean then)")  # fmt: skip
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--batches", default="1,32", help="inputs per request, comma-separated")
    p.add_argument("--inputs", type=int, default=64, help="chunks of the corpus embedded")
    p.add_argument("--rounds", type=int, default=3, help="best of this many rounds")
    p.add_argument("--llama-server", type=Path, help="llama.cpp's llama-server binary")
    p.add_argument("--llama-server-args", default="",
                   help="extra llama-server flags (one string)")  # fmt: skip
    p.add_argument("--csv", type=Path, help="write the rows here")
    p.add_argument("--plot", type=Path, help="PNG of inputs/s by batch (needs matplotlib)")


@dataclass
class Row:
    server: str
    batch: int
    inputs: int
    tokens: int
    seconds: float
    threads: int
    model: str

    @property
    def inputs_per_s(self) -> float:
        return self.inputs / self.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def corpus(model: Path, n: int) -> list[str]:
    """n chunks of ds4d's own source, each 256-512 tokens of the model's tokenizer, cut at
    line ends, files in name order."""
    from ds4d.engine.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(model)
    root = Path(__file__).resolve().parents[1]  # the ds4d package
    chunks: list[str] = []
    for path in sorted(root.rglob("*.py")):
        lines: list[str] = []
        count = 0
        for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
            k = len(tok.encode(line))
            if count + k > MAX_TOKENS and count >= MIN_TOKENS:
                chunks.append("".join(lines))
                lines, count = [], 0
            if k > MAX_TOKENS:
                continue  # a line too long for any chunk
            lines.append(line)
            count += k
            if len(chunks) >= n:
                return chunks
        if count >= MIN_TOKENS:
            chunks.append("".join(lines))
    if len(chunks) < n:
        raise CliError(f"the corpus has only {len(chunks)} chunks of {MIN_TOKENS}+ tokens")
    return chunks[:n]


def embed_request(url: str, texts: list[str]) -> int:
    """One /v1/embeddings request; the server's prompt token count."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=600)
    try:
        body = json.dumps({"model": "bench", "input": texts, "encoding_format": "float"})
        conn.request("POST", "/v1/embeddings", body, {"content-type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    if resp.status != 200:
        raise CliError(f"{url}: HTTP {resp.status}: {data[:300]!r}")
    obj = json.loads(data)
    if len(obj["data"]) != len(texts):
        raise CliError(f"{url}: {len(obj['data'])} vectors for {len(texts)} inputs")
    return int(obj["usage"]["prompt_tokens"])


def one_pass(url: str, chunks: list[str], batch: int) -> tuple[int, float]:
    t0 = time.perf_counter()
    tokens = sum(embed_request(url, chunks[i : i + batch]) for i in range(0, len(chunks), batch))
    return tokens, time.perf_counter() - t0


@contextmanager
def ds4d_server(model: Path, threads: int, pooling: str) -> Iterator[str]:
    args = ["--model", str(model), "--threads", str(threads), "--slots", "1", "--no-kv-disk",
            "--ctx", str(2 * MAX_TOKENS)]  # fmt: skip
    if pooling:
        args += ["--pooling", pooling]
    try:
        with private_daemon(args, start_timeout=START_TIMEOUT_S) as url:
            yield url
    except ServeProcessError as e:
        raise CliError(str(e)) from None


@contextmanager
def llama_server(binary: Path, model: Path, threads: int, pooling: str,
                 extra: str) -> Iterator[str]:  # fmt: skip
    port = free_port()
    # Four inputs of up to 512 tokens in flight (a slot of 1024 tokens each), a physical
    # batch that holds a whole input (non-causal models need it); the rest of a request's
    # inputs wait for a slot. More slots make each batch attend over a longer cache.
    cmd = [str(binary), "-m", str(model), "--embeddings", "--host", "127.0.0.1",
           "--port", str(port), "-t", str(threads), "-tb", str(threads), "-np", "4",
           "-c", str(4 * 2 * MAX_TOKENS), "-b", "2048", "-ub", "2048", *extra.split()]  # fmt: skip
    if pooling:
        cmd += ["--pooling", pooling]
    try:
        with other_server(cmd, f"http://127.0.0.1:{port}", START_TIMEOUT_S) as url:
            yield url
    except ServeProcessError as e:
        raise CliError(str(e)) from None


def run(args: argparse.Namespace) -> int:
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise CliError("--plot needs matplotlib: pip install 'ds4d[plot]'", 2)
    model = args.model
    if model is None:
        from ds4d.engine.default_model import default_model_path

        model = default_model_path()
    from ds4d.engine.embedding import declared_pooling
    from ds4d.engine.gguf_file import GGUFFile

    pooling = args.pooling or ("" if declared_pooling(GGUFFile(model)) else "mean")
    batches = [int(b) for b in args.batches.split(",") if b]
    chunks = corpus(model, args.inputs)
    print(f"corpus: {len(chunks)} chunks of ds4d's source, {MIN_TOKENS}-{MAX_TOKENS} tokens each")
    servers = {"ds4d": lambda: ds4d_server(model, args.threads, pooling)}
    if args.llama_server:
        servers["llama.cpp"] = lambda: llama_server(
            args.llama_server, model, args.threads, pooling, args.llama_server_args
        )
    best: dict[tuple[str, int], Row] = {}
    names = list(servers)
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            with servers[name]() as url:
                embed_request(url, chunks[:2])  # warm: pages of the weights in, first call
                for batch in batches:
                    tokens, secs = one_pass(url, chunks, batch)
                    row = Row(name, batch, len(chunks), tokens, secs, args.threads, model.name)
                    print(f"round {r + 1} {name:9s} batch {batch:3d}: "
                          f"{row.inputs_per_s:7.2f} inputs/s {row.tokens_per_s:9.1f} tokens/s",
                          flush=True)  # fmt: skip
                    key = (name, batch)
                    if key not in best or row.seconds < best[key].seconds:
                        best[key] = row
    rows = [best[k] for k in sorted(best, key=lambda k: (k[1], names.index(k[0])))]
    print(f"\nbest of {args.rounds} ({model.name}, {args.threads} threads, pooling"
          f" {pooling or 'from the file'}):")  # fmt: skip
    for row in rows:
        print(f"  {row.server:9s} batch {row.batch:3d}: {row.inputs_per_s:7.2f} inputs/s"
              f" {row.tokens_per_s:9.1f} tokens/s")  # fmt: skip
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with args.csv.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(CSV_FIELDS)
            for row in rows:
                w.writerow([row.server, row.batch, row.inputs, row.tokens, f"{row.seconds:.4f}",
                            f"{row.inputs_per_s:.3f}", f"{row.tokens_per_s:.1f}", row.threads,
                            row.model])  # fmt: skip
    if args.plot:
        write_plot(args.plot, rows, model.name, args.threads)
    return 0


def write_plot(path: Path, rows: list[Row], model: str, threads: int) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    batches = sorted({r.batch for r in rows})
    servers = list(dict.fromkeys(r.server for r in rows))
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(servers)
    for i, server in enumerate(servers):
        values = [next((r.tokens_per_s for r in rows if r.server == server and r.batch == b), 0)
                  for b in batches]  # fmt: skip
        xs = [j + i * width for j in range(len(batches))]
        bars = ax.bar(xs, values, width, label=server)
        ax.bar_label(bars, fmt="%.0f")
    ax.set_xticks([j + width * (len(servers) - 1) / 2 for j in range(len(batches))])
    ax.set_xticklabels([f"batch {b}" for b in batches])
    ax.set_ylabel("tokens/s (best of the rounds)")
    ax.set_title(f"embeddings: {model}, {threads} threads", fontsize=10)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
