"""Mean |Δ logprob| of each matmul precision (exact, int2, int3) and KV type on the SmolLM2
exactness vectors (tests/data/vectors/smollm2, the embedded model) and on the verification
kit's families (tests/data/kit), as the tests measure them; one CSV row per (model, case,
precision, kv type). Used to choose the default precision (docs/integer-path.md).

    .venv/bin/python scripts/figures/precision_distance.py [--kit] [--cases a,b] > distances.csv

With --model M.gguf (a model of SmolLM2's vocabulary, e.g. the embedded model requantized to
Q4_K_M, whose matmuls take the K-quants' super-block format), each precision is measured
against M's own exact path (f32 KV) on the same cases' tokens instead of the vectors.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from ds4d.engine import Engine  # noqa: E402
from ds4d.engine.default_model import default_model_path  # noqa: E402


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max()
    return x - np.log(np.exp(x).sum())


def smollm2_distance(engine: Engine, exact: dict) -> float:
    """tests/engine/test_vectors.py's measure: teacher-forced decode, mean over the exact top-20s."""
    steps = exact["steps"]
    session = engine.new_session(len(exact["prompt_tokens"]) + len(steps))
    session.eval(exact["prompt_tokens"])
    diffs = []
    for step in steps:
        ours = log_softmax(session.compute_logits())
        ids = np.array([t for t, _ in step["top"]])
        want = np.array([lp for _, lp in step["top"]])
        diffs.append(np.abs(ours[ids] - want).mean())
        session.eval([step["token"]])
    session.close()
    return float(np.mean(diffs))


def exact_steps(model: Path, case: dict) -> dict:
    """The case's tokens teacher-forced through model's exact path (f32 KV): each step's
    top 20 (token, logprob), in the vectors' shape."""
    steps = []
    with Engine.open(model, threads=2, kv_type="f32", precision="exact") as e:
        session = e.new_session(len(case["prompt_tokens"]) + len(case["steps"]))
        session.eval(case["prompt_tokens"])
        for step in case["steps"]:
            lp = log_softmax(session.compute_logits())
            top = np.argsort(-lp)[:20]
            steps.append({"token": step["token"], "top": [[int(t), float(lp[t])] for t in top]})
            session.eval([step["token"]])
        session.close()
    return {"prompt_tokens": case["prompt_tokens"], "steps": steps}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kit", action="store_true", help="also every kit family")
    p.add_argument("--cases", default="", help="SmolLM2 cases (default: all)")
    p.add_argument("--precisions", default="exact,int2,int3")
    p.add_argument("--kv-types", default="f32,f16")
    p.add_argument("--model", type=Path, help="measure against this model's exact path")
    args = p.parse_args()
    out = csv.writer(sys.stdout)
    out.writerow(["model", "case", "precision", "kv_type", "mean_abs_dlogprob"])
    cases_dir = REPO / "tests/data/vectors/smollm2"
    cases = sorted(cases_dir.glob("*.exact.json"))
    if args.cases:
        cases = [c for c in cases if c.name.removesuffix(".exact.json") in args.cases.split(",")]
    model = args.model or default_model_path()
    refs = {c: json.loads(c.read_text()) for c in cases}
    if args.model:
        refs = {c: exact_steps(args.model, r) for c, r in refs.items()}
    for kv in args.kv_types.split(","):
        for prec in args.precisions.split(","):
            with Engine.open(model, threads=2, kv_type=kv, precision=prec) as e:
                for c in cases:
                    d = smollm2_distance(e, refs[c])
                    name = args.model.stem if args.model else "smollm2"
                    out.writerow([name, c.name.removesuffix(".exact.json"), prec, kv, f"{d:.6f}"])
                    sys.stdout.flush()
    if args.kit:
        from tests.helpers.kit import kit_families, kit_model, kit_reference, teacher_forced

        for fam in kit_families():
            for kv in args.kv_types.split(","):
                for prec in args.precisions.split(","):
                    with Engine.open(kit_model(fam), threads=2, kv_type=kv, precision=prec) as e:
                        for seq in kit_reference(fam):
                            c = teacher_forced(e, seq, 0.01)
                            out.writerow([fam, seq.name, prec, kv, f"{c.mean_abs:.6f}"])
                            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
