"""Running a model past its trained context by stretching its RoPE positions.

A model attends sensibly only over the positions it was trained on: past them, rotary
embeddings turn at angles it never saw, and a small model's output falls apart within a
few thousand tokens (SmolLM2-135M, trained on 8192, writes junk behind Claude Code's
20k-token prompt). Linear position interpolation or YaRN (llama.cpp's `--rope-scaling
linear|yarn` with `--rope-scale <ctx / trained>`) map the longer context onto the trained
range instead. A file that declares no scaling of its own gets the requested one as
metadata overrides, read by the family like the file's own keys; a file that declares
one keeps it."""

from __future__ import annotations

from ds4d.engine.errors import ModelLoadError
from ds4d.engine.gguf_file import GGUFFile

KINDS = ("linear", "yarn")


def stretch_rope(gf: GGUFFile, kind: str, n_ctx: int) -> str:
    """Overrides `gf`'s RoPE scaling so that `n_ctx` positions fit its trained context;
    returns what was done in words ("" when nothing: no kind, a context within the
    trained one, or a file with its own scaling)."""
    if not kind:
        return ""
    if kind not in KINDS:
        raise ModelLoadError(f"rope scaling {kind!r} is not one of {', '.join(KINDS)}")
    arch = gf.architecture
    trained = gf.get(f"{arch}.context_length")
    if not isinstance(trained, int) or isinstance(trained, bool) or trained <= 0:
        return ""  # the family refuses the file with its own message
    if n_ctx <= trained:
        return ""
    own_kind = gf.get(f"{arch}.rope.scaling.type", "none")
    own_factor = gf.get(f"{arch}.rope.scaling.factor", 0.0)
    if own_kind != "none" or own_factor:
        return ""
    factor = n_ctx / trained
    gf.override({
        f"{arch}.rope.scaling.type": kind,
        f"{arch}.rope.scaling.factor": factor,
        f"{arch}.rope.scaling.original_context_length": trained,
    })  # fmt: skip
    return f"{kind} x{factor:g} from the trained {trained} tokens to {n_ctx}"
