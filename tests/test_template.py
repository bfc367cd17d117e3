"""Chat templates: the GGUF's own template reproduces llama.cpp's reference prompts, and
transformers' rendering rules hold (helpers, whitespace, errors)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import gguf
import pytest

from ds4d.chat.template import ChatTemplate, TemplateError


@pytest.fixture(scope="module")
def smollm_template(model_path: Path) -> ChatTemplate:
    reader = gguf.GGUFReader(model_path)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()

    def token(key: str) -> str:
        return tokens[reader.fields[f"tokenizer.ggml.{key}_token_id"].contents()]

    return ChatTemplate(
        reader.fields["tokenizer.chat_template"].contents(), token("bos"), token("eos")
    )


USER_TURN = "<|im_start|>user\n"


def test_reproduces_reference_chat_prompts(smollm_template: ChatTemplate, shared_dir: Path) -> None:
    chats = []
    for path in sorted((shared_dir / "vectors" / "smollm2").glob("*.json")):
        case = json.loads(path.read_text())
        if path.name.endswith(".exact.json") or not case.get("chat"):
            continue
        prompt = case["prompt"]
        start = prompt.index(USER_TURN) + len(USER_TURN)
        user_text = prompt[start : prompt.index("<|im_end|>", start)]
        chats.append(path.name)
        rendered = smollm_template.render([{"role": "user", "content": user_text}])
        assert rendered == prompt, path.name
    assert len(chats) >= 3


def test_conversation_with_system_and_assistant(smollm_template: ChatTemplate) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    expected = (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
    )
    assert smollm_template.render(messages, add_generation_prompt=False) == expected
    assert smollm_template.render(messages) == expected + "<|im_start|>assistant\n"


def test_transformers_context_and_helpers() -> None:
    source = (
        "{{ bos_token }}\n"
        "{% for m in messages %}\n"
        "    {{ m.role }}: {{ m.content }}\n"
        "{% endfor %}\n"
        "{% if tools %}{{ tools | tojson }}|{{ tools[0] | tojson(indent=2) }}{% endif %}\n"
        "{{ strftime_now('%Y') }}|{{ flag }}|{{ eos_token }}"
    )
    template = ChatTemplate(source, "<s>", "</s>")
    tools = [{"name": "città", "parameters": {"b": 1, "a": "<x>"}}]
    out = template.render([{"role": "user", "content": "hi"}], tools=tools, flag="on")
    dumped = json.dumps(tools[0], ensure_ascii=False, indent=2)
    # trim_blocks + lstrip_blocks: a block tag takes its line's indentation and newline
    # with it (hence no newline after {% endif %}), expressions keep theirs;
    # tojson keeps non-ASCII text, key order and "<" (no HTML escaping).
    assert out == (
        "<s>\n    user: hi\n"
        f'[{{"name": "città", "parameters": {{"b": 1, "a": "<x>"}}}}]|{dumped}'
        f"{datetime.now():%Y}|on|</s>"
    )


def test_loop_controls_and_generation_tag() -> None:
    source = (
        "{% for m in messages %}{% if m.role == 'tool' %}{% continue %}{% endif %}"
        "{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"
    )
    messages = [
        {"role": "user", "content": "a"},
        {"role": "tool", "content": "x"},
        {"role": "assistant", "content": "b"},
    ]
    assert ChatTemplate(source).render(messages) == "ab"


def test_raise_exception_becomes_template_error() -> None:
    template = ChatTemplate(
        "{% if messages[0].role != 'user' %}"
        "{{ raise_exception('Conversations must start with a user message') }}"
        "{% endif %}ok"
    )
    assert template.render([{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(TemplateError, match="must start with a user message") as info:
        template.render([{"role": "assistant", "content": "x"}])
    assert isinstance(info.value, ValueError)


def test_broken_and_unsafe_templates_are_template_errors() -> None:
    with pytest.raises(TemplateError, match="does not compile"):
        ChatTemplate("{% for m in messages %}{{ m }}")
    with pytest.raises(TemplateError, match="failed"):
        ChatTemplate("{{ messages.append(1) }}").render([])  # immutable sandbox
    with pytest.raises(TemplateError, match="failed"):
        ChatTemplate("{{ ''.__class__.__mro__ }}").render([])
    with pytest.raises(TemplateError, match="failed"):
        ChatTemplate("{{ messages[0]['content'] + 1 }}").render([{"content": "x"}])
