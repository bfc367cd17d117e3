"""Writes tests/data/fim/<variant>.json: llama-server's fill-in-the-middle prompts, as token
ids, for the inputs of tests/chat/fim_variants.py on each variant vocabulary.

llama-server does not return the prompt it assembled as ids; its slot save does (the
session file starts with the slot's tokens). So each case is sent to /infill with
`n_predict: 0` (the prompt is evaluated, nothing generated), the slot is saved, and the
file's token list is read back and checked against the reply's `tokens_evaluated`.

    .venv/bin/python scripts/make_fim_fixtures.py [--server /work/peer/build/bin/llama-server]

Development only: tests read the JSON files, never llama.cpp."""

from __future__ import annotations

import argparse
import json
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.chat.fim_variants import CASES, FIXTURES, SERVERS, VARIANTS, variant_gguf  # noqa: E402

SEQ_MAGIC = 0x67677371  # 'ggsq', llama.cpp's LLAMA_STATE_SEQ_MAGIC


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def saved_tokens(path: Path) -> list[int]:
    """The slot's tokens in a saved sequence state: magic, version, a count of 32-bit
    words, then llama-server's packed tokens (LLAMA_TOKEN_NULL, a format version, the
    token count and the tokens, then its media chunks: none here)."""
    raw = path.read_bytes()
    magic, _version, n = struct.unpack_from("<III", raw, 0)
    if magic != SEQ_MAGIC:
        raise ValueError(f"{path}: not a llama.cpp sequence state file")
    packed = list(struct.unpack_from(f"<{n}i", raw, 12))
    if not packed or packed[0] != -1:  # an older server: the plain token list
        return packed
    count = packed[2]
    if packed[3 + count :] != [0]:
        raise ValueError(f"{path}: media chunks or an unknown layout: {packed[:3]}")
    return packed[3 : 3 + count]


def run_server(server: str, gguf: Path, cfg: dict, save_dir: Path, log: Path):
    port = free_port()
    args = [server, "-m", str(gguf), "--port", str(port), "-c", str(cfg["n_ctx"]),
            "-b", str(cfg["n_batch"]), "-ub", str(cfg["n_batch"]), "-np", "1",
            "-n", str(cfg["n_predict"]), "-t", "2", "--slot-save-path", str(save_dir)]  # fmt: skip
    if cfg["spm"]:
        args.append("--spm-infill")
    proc = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited: see {log}")
        time.sleep(0.2)
    proc.terminate()
    raise RuntimeError("llama-server did not come up")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--server", default="/work/peer/build/bin/llama-server")
    ap.add_argument("--only", nargs="*", help="variants to write (default: all)")
    opts = ap.parse_args()
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name in opts.only or list(VARIANTS):
        gguf = variant_gguf(name)
        out: dict = {"variant": name, "what": VARIANTS[name].what, "servers": {}}
        for server_name, cfg in SERVERS.items():
            with tempfile.TemporaryDirectory() as tmp:
                save = Path(tmp)
                proc, url = run_server(opts.server, gguf, cfg, save, save / "server.log")
                try:
                    cases = {}
                    for case, fields in CASES:
                        body = {**fields, "n_predict": 0, "cache_prompt": False}
                        r = httpx.post(f"{url}/infill", json=body, timeout=120)
                        r.raise_for_status()
                        n_eval = r.json()["tokens_evaluated"]
                        s = httpx.post(f"{url}/slots/0?action=save",
                                       json={"filename": f"{case}.bin"}, timeout=60)  # fmt: skip
                        s.raise_for_status()
                        ids = saved_tokens(save / f"{case}.bin")
                        if len(ids) != n_eval:
                            raise RuntimeError(
                                f"{name}/{case}: {len(ids)} saved, {n_eval} evaluated"
                            )
                        cases[case] = ids
                finally:
                    proc.terminate()
                    proc.wait(30)
            out["servers"][server_name] = {"config": cfg, "cases": cases}
        (FIXTURES / f"{name}.json").write_text(json.dumps(out) + "\n")
        print(f"{name}: {sum(len(s['cases']) for s in out['servers'].values())} prompts")


if __name__ == "__main__":
    main()
