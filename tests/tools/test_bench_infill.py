"""The editing session `ds4d bench infill` replays (ds4d.tools.bench_infill.session): what it
sends, as llama.vim would, from a real source file of this repo."""

from __future__ import annotations

import argparse

from ds4d.tools import bench_infill


def make_session() -> list[bench_infill.Request]:
    p = argparse.ArgumentParser()
    bench_infill.add_arguments(p)
    return bench_infill.session(p.parse_args(["--server", "x=http://127.0.0.1:1"]), "round 0")


def test_the_session_is_llama_vims_pattern():
    reqs = make_session()
    kinds = [r.kind for r in reqs]
    assert kinds[0] == "warm" and kinds.count("warm") == 3  # start, then two chunk arrivals
    assert kinds.count("back") == 1
    assert sum(k != "warm" for k in kinds) == 100
    # chunks only ever arrive at the end of the list: every earlier chunk's KV stays valid
    extras = [r.body["input_extra"] for r in reqs]
    for a, b in zip(extras, extras[1:], strict=False):
        assert b[: len(a)] == a
    assert len(extras[-1]) == 8
    keys = [r.body for r in reqs if r.kind == "key"]
    # typing: the prompt grows by one character, a backspace shortens it by one
    steps = {len(b["prompt"]) - len(a["prompt"]) for a, b in zip(keys, keys[1:], strict=False)
             if a["input_prefix"] == b["input_prefix"]}  # fmt: skip
    assert steps == {1, -1}
    assert all(b["n_predict"] == 8 and b["stream"] for b in keys)
    back = next(r.body for r in reqs if r.kind == "back")
    assert back["prompt"] == "" and keys[0]["input_prefix"].startswith(back["input_prefix"])


def test_the_prefix_is_about_the_requested_size_and_the_file_is_real():
    first = next(r.body for r in make_session() if r.kind == "key")
    assert 4096 * 3 < len(first["input_prefix"]) < 4096 * 5
    assert first["input_suffix"].count("\n") == 64 + 1
    assert first["input_prefix"] in bench_infill.DEFAULT_FILE.read_text()


def test_each_round_starts_cold():
    """The round's tag leads the first chunk: no server holds any of a new round's KV."""
    p = argparse.ArgumentParser()
    bench_infill.add_arguments(p)
    args = p.parse_args(["--server", "x=http://127.0.0.1:1"])
    r0, r1 = bench_infill.session(args, "round 0"), bench_infill.session(args, "round 1")
    first0, first1 = r0[0].body["input_extra"][0]["text"], r1[0].body["input_extra"][0]["text"]
    assert first0.startswith("# round 0\n") and first1.startswith("# round 1\n")
    assert first0.split("\n", 1)[1] == first1.split("\n", 1)[1]
