"""`ds4d steer build`: a steering direction from two prompt sets, in llama.cpp's
control-vector format; `ds4d steer show FILE`: what a control-vector file holds.

build: each prompt (one per line; blank lines and `#` comments skipped) is rendered as a
one-shot chat question and evaluated in its own session of the engine itself, with the
residual stream captured after every layer at the prompt's last token (where the answer
starts). The direction of layer N is mean(positive) - mean(negative) of those rows,
written as `direction.N` for N in --layers A:B. Applied with `--control-vector FILE`
(scale > 0) it pushes the model toward the positive prompts' behaviour, with a negative
scale toward the negative ones'. See docs/steering.md.

The steering flags of `generate`, `eval` and `chat` (`add_steering_flags`) are llama.cpp's
plus antirez/ds4's separate attention/FFN scales.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ds4d.daemon.exitcodes import CliError


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="steer_command", metavar="build|show", required=True)
    b = sub.add_parser("build", help="a direction from --positive and --negative prompts")
    b.add_argument("--positive", required=True, type=Path, help="prompts, one per line")
    b.add_argument("--negative", required=True, type=Path, help="contrast prompts")
    b.add_argument(
        "--layers",
        default="",
        metavar="A:B",
        help="layers to write directions for (default: 1 to the last)",
    )
    b.add_argument("-o", "--output", required=True, type=Path, help="control-vector GGUF")
    b.add_argument("-m", "--model", help="GGUF file (default: the embedded model)")
    b.add_argument("-s", "--system", help="a system message for every prompt")
    b.add_argument("--threads", type=int, default=None)
    b.add_argument("--ctx", type=int, default=2048)
    s = sub.add_parser("show", help="the layers and norms of a control-vector file")
    s.add_argument("file", type=Path)


def run(args: argparse.Namespace) -> int:
    if args.steer_command == "show":
        return _show(args.file)
    return _build(args)


def _show(path: Path) -> int:
    from ds4d.engine.steering import SteeringError, read_control_vector

    try:
        dirs = read_control_vector(path)
    except SteeringError as e:
        raise CliError(str(e)) from None
    for layer, vec in sorted(dirs.items()):
        print(f"direction.{layer}: {len(vec)} values, norm {float(np.linalg.norm(vec)):.4g}")
    return 0


def read_prompts(path: Path) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise CliError(f"cannot read {path}: {e}", 2) from None
    prompts = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    if not prompts:
        raise CliError(f"{path}: no prompts", 2)
    return prompts


def last_token_residuals(engine: Any, prompts: list[str], system: str | None,
                         n_ctx: int) -> np.ndarray:  # fmt: skip
    """Per prompt, the residual stream after every layer at the last prompt token
    (prompts x n_layer x n_embd), each prompt in its own unsteered session."""
    from ds4d.chat.oneshot import one_shot_prompt

    rows = []
    for text in prompts:
        _, ids = one_shot_prompt(engine, text, system)
        with engine.new_session(max(n_ctx, len(ids))) as session:
            rows.append(session.eval_capturing(ids))
    return np.stack(rows)


def _build(args: argparse.Namespace) -> int:
    from ds4d.engine import Engine, EngineError
    from ds4d.engine.default_model import resolve_model_path
    from ds4d.engine.steering import parse_layer_range, write_control_vector

    positive, negative = read_prompts(args.positive), read_prompts(args.negative)
    try:
        engine = Engine.open(resolve_model_path(args.model), threads=args.threads, kv_type="f32")
    except (EngineError, FileNotFoundError) as e:
        raise CliError(str(e)) from None
    with engine:
        n_layer = engine.info.n_layer
        try:
            start, end = parse_layer_range(args.layers) or (1, n_layer - 1)
        except EngineError as e:
            raise CliError(str(e), 2) from None
        if not 1 <= start <= end < n_layer:
            raise CliError(f"--layers must be within 1:{n_layer - 1}, got {start}:{end}", 2)
        pos = last_token_residuals(engine, positive, args.system, args.ctx)
        neg = last_token_residuals(engine, negative, args.system, args.ctx)
        diff = pos.mean(axis=0) - neg.mean(axis=0)
        write_control_vector(
            args.output, {il: diff[il] for il in range(start, end + 1)}, engine.info.architecture
        )
    norms = np.linalg.norm(diff[start : end + 1], axis=1)
    print(f"wrote {args.output}: direction.{start}..{end} from {len(positive)} positive and "
          f"{len(negative)} negative prompts (norms {norms.min():.3g}..{norms.max():.3g})",
          file=sys.stderr)  # fmt: skip
    return 0


# ---- the steering flags of generate, eval and chat ---------------------------------------


def add_steering_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("directional steering (docs/steering.md)")
    g.add_argument(
        "--control-vector",
        action="append",
        default=[],
        metavar="FILE",
        help="add a control vector (llama.cpp GGUF of direction.N tensors)",
    )
    g.add_argument(
        "--control-vector-scaled",
        action="append",
        nargs=2,
        default=[],
        metavar=("FILE", "SCALE"),
        help="add a control vector times SCALE",
    )
    g.add_argument(
        "--control-vector-layer-range",
        nargs=2,
        type=int,
        metavar=("START", "END"),
        help="layers to apply the control vectors to, inclusive",
    )
    g.add_argument(
        "--directional-steering-attn",
        type=float,
        default=0.0,
        metavar="F",
        help="scale added after each layer's attention output (default 0)",
    )
    g.add_argument("--directional-steering-ffn", type=float, default=1.0, metavar="F",
                   help="scale added after each layer's FFN output (default 1)")  # fmt: skip


def steering_from_args(args: argparse.Namespace, engine: Any) -> None:
    """Sets the engine's steering from add_steering_flags' flags (nothing without files)."""
    from ds4d.engine.steering import SteeringError, load_control_vectors

    files: list[tuple[str, float]] = [(f, 1.0) for f in args.control_vector]
    for f, scale in args.control_vector_scaled:
        try:
            files.append((f, float(scale)))
        except ValueError:
            raise CliError(f"--control-vector-scaled {f} {scale}: not a number", 2) from None
    if not files:
        return
    rng = tuple(args.control_vector_layer_range) if args.control_vector_layer_range else None
    try:
        engine.set_steering(load_control_vectors(
            files, engine.info.n_layer, engine.info.n_embd, rng,
            attn_scale=args.directional_steering_attn, ffn_scale=args.directional_steering_ffn,
        ))  # fmt: skip
    except SteeringError as e:
        raise CliError(str(e), 2) from None
