"""Chat templates: the GGUF's own template reproduces llama.cpp's reference prompts, and
transformers' rendering rules hold (helpers, whitespace, errors)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from ds4d.chat.template import ChatTemplate, TemplateError
from ds4d.engine.gguf_file import GGUFFile


@pytest.fixture(scope="module")
def smollm_template(model_path: Path) -> ChatTemplate:
    # ds4d's own GGUF reader (tests/engine/test_gguf_reader.py: it reads what the gguf package
    # reads), which takes a tenth of the time over the vocabulary
    gf = GGUFFile(model_path)
    tokens = gf.get_array("tokenizer.ggml.tokens")
    assert tokens is not None and gf.chat_template is not None
    names = tokens.strings()

    def token(key: str) -> str:
        return names[gf.require(f"tokenizer.ggml.{key}_token_id")]

    return ChatTemplate(gf.chat_template, token("bos"), token("eos"))


USER_TURN = "<|im_start|>user\n"


def test_reproduces_reference_chat_prompts(smollm_template: ChatTemplate, data_dir: Path) -> None:
    chats = []
    for path in sorted((data_dir / "vectors" / "smollm2").glob("*.json")):
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


def test_jinja_features_family_templates_use() -> None:
    # Each line exercises what a real template does: namespace counters, dict(), .items()
    # and .get on mappings, string methods, slicing, loop.previtem/nextitem, the items /
    # selectattr / reject / join filters, type tests, tojson with transformers' options.
    source = (
        "{%- set ns = namespace(n=0, last=none) -%}"
        "{%- for m in messages[::-1] -%}{%- set ns.n = ns.n + 1 -%}{%- endfor -%}"
        "n={{ ns.n }};"
        "{%- set d = dict(b=2, a=1) -%}"
        "{%- for k, v in d.items() %}{{ k }}{{ v }}{% endfor %};"
        "{{ d.get('c', 'none') }};{{ d | items | list | length }};"
        "{%- for m in messages -%}"
        "{%- if loop.previtem %}<{{ loop.previtem.role }}{% endif -%}"
        "{%- if loop.nextitem %}>{{ loop.nextitem.role }}{% endif -%}|"
        "{%- endfor -%};"
        "{{ messages[0].content.startswith('  hi') }},{{ messages[0].content.strip() }},"
        "{{ messages[0].content.split('/')[-1] | trim }},{{ 'x\n'.rstrip('\n') }},"
        "{{ messages[0].content.lstrip().endswith('there') }},"
        "{{ messages[0].content.replace('hi', 'HI') | trim | upper }};"
        "{{ messages | selectattr('role', 'equalto', 'user') | list | length }};"
        "{{ ['a', 'code_interpreter', 'b'] | reject('equalto', 'code_interpreter') | join(', ') }};"
        "{{ 'x' is string }}{{ d is mapping }}{{ messages is iterable }}{{ 1 is string }};"
        "{{ d | tojson(sort_keys=true) }}|{{ 'é' | tojson(ensure_ascii=true) }}|"
        "{{ d | tojson(separators=(',', ':')) }}|{{ d | tojson(indent=1) }}"
    )
    messages = [{"role": "user", "content": "  hi / there"}, {"role": "assistant", "content": "b"}]
    out = ChatTemplate(source).render(messages)
    assert out == (
        "n=2;b2a1;none;2;>assistant|<user|;"
        "True,hi / there,there,x,True,HI / THERE;1;a, b;TrueTrueTrueFalse;"
        '{"a": 1, "b": 2}|"\\u00e9"|{"b":2,"a":1}|{\n "b": 2,\n "a": 1\n}'
    )


def test_date_string_default_and_strftime_now_use_the_clock() -> None:
    # Llama 3.x: a date_string the caller may pass, else today's date from strftime_now.
    source = (
        "{%- if not date_string is defined %}{% set date_string = strftime_now('%d %b %Y') %}"
        "{% endif %}{{ date_string }}"
    )
    fixed = ChatTemplate(source, clock=lambda: datetime(2025, 3, 9, 8, 0))
    assert fixed.render([]) == "09 Mar 2025"
    assert fixed.render([], date_string="1 Jan 2000") == "1 Jan 2000"
    assert ChatTemplate(source).render([]) == datetime.now().strftime("%d %b %Y")


def test_template_variables_name_the_options_it_reads() -> None:
    template = ChatTemplate(
        "{% set x = 1 %}{% for m in messages %}{{ m.content }}{% endfor %}"
        "{% if enable_thinking is defined %}{{ reasoning_effort }}{% endif %}"
    )
    assert template.variables == {"messages", "enable_thinking", "reasoning_effort"}


def test_namespace_refuses_underscore_names_and_errors_are_one_line() -> None:
    with pytest.raises(TemplateError, match="underscore") as info:
        ChatTemplate("{% set ns = namespace(_x=1) %}").render([])
    assert "\n" not in str(info.value)
    with pytest.raises(TemplateError, match="underscore"):
        ChatTemplate("{% set ns = namespace() %}{% set ns._y = 1 %}").render([])
    # the dict() helper exposes no type or function internals to the sandbox
    assert ChatTemplate("{{ dict.__class__ }}{{ dict.fromkeys.__globals__ }}").render([]) == ""
    with pytest.raises(TemplateError, match="does not compile: .*line 2") as info:
        ChatTemplate("ok\n{{ messages | no_such_filter }}")
    assert "\n" not in str(info.value)
    assert ChatTemplate("{{ dict.fromkeys(['a'], 0) | tojson }}").render([]) == '{"a": 0}'
