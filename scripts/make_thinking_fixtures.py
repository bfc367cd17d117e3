"""Render the kit families' own chat templates with transformers, thinking switched off and
on, and store the prompts as test fixtures (tests/data/templates/thinking.json).

Run with a Python that has transformers (not needed by the test suite):

    PYTHONPATH=. /path/to/venv-with-transformers/bin/python scripts/make_thinking_fixtures.py

For every kit family whose template reads a thinking switch (`enable_thinking`: Qwen3 and
Qwen3-MoE; `reasoning_effort`: gpt-oss), the template is read from the kit's GGUF and
rendered by transformers' own jinja renderer with the switch as the template's keyword,
exactly what `apply_chat_template(..., enable_thinking=False)` passes it.
tests/chat/test_thinking_switch.py sends each protocol's way of saying "no thinking"
(chat_template_kwargs, reasoning_effort, Anthropic's thinking.type, Ollama's think)
through ds4d's parsers and renderer and expects the same bytes.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
import transformers
import transformers.utils.chat_template_utils as ctu

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gguf import GGUFReader  # noqa: E402

from tests.kit import kit_families, kit_model  # noqa: E402

OUT = REPO / "tests" / "data" / "templates" / "thinking.json"
NOW = datetime(2024, 7, 26, 12, 0, 0)  # strftime_now sees this on both sides

MESSAGES = [
    {"role": "system", "content": "Answer with a number."},
    {"role": "user", "content": "What is 2+2?"},
]


class _FixedClock(datetime):
    @classmethod
    def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
        return NOW


def _field(reader: GGUFReader, key: str) -> Any:
    f = reader.get_field(key)
    return None if f is None else f.contents()


def _token(reader: GGUFReader, key: str) -> str:
    token_id = _field(reader, key)
    if token_id is None:
        return ""
    tokens = reader.get_field("tokenizer.ggml.tokens")
    assert tokens is not None
    return bytes(tokens.parts[tokens.data[int(token_id)]]).decode()


def _switches(source: str) -> dict[str, dict[str, Any]]:
    """The template's own keywords for thinking off and on (what a transformers user
    passes); none when it reads no switch."""
    names = jinja2.meta.find_undeclared_variables(jinja2.Environment().parse(source))
    if "enable_thinking" in names:
        return {"off": {"enable_thinking": False}, "on": {"enable_thinking": True}}
    if "reasoning_effort" in names:
        return {"off": {"reasoning_effort": "low"}, "on": {"reasoning_effort": "high"}}
    return {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    ctu.datetime = _FixedClock  # transformers' strftime_now reads the module's datetime
    families: dict[str, Any] = {}
    for family in kit_families():
        gf = GGUFReader(kit_model(family))
        source = _field(gf, "tokenizer.chat_template")
        if not source:
            continue
        switches = _switches(source)
        if not switches:
            continue
        bos = _token(gf, "tokenizer.ggml.bos_token_id")
        eos = _token(gf, "tokenizer.ggml.eos_token_id")
        renders = {}
        for name, kwargs in switches.items():
            rendered, _ = ctu.render_jinja_template(
                conversations=[MESSAGES],
                chat_template=source,
                add_generation_prompt=True,
                bos_token=bos,
                eos_token=eos,
                **kwargs,
            )
            renders[name] = rendered[0]
        families[family] = {"bos": bos, "eos": eos, "kwargs": switches, "renders": renders}
    out = {
        "generated_by": f"scripts/make_thinking_fixtures.py, transformers {transformers.__version__}",
        "now": NOW.isoformat(),
        "messages": MESSAGES,
        "families": families,
    }
    args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}: {', '.join(families)}")


if __name__ == "__main__":
    main()
