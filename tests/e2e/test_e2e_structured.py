"""Structured output against a real ds4d process, through the real clients: Ollama's
`format` ("json" and a pydantic model's JSON schema, as Ollama's docs show) with the
`ollama` package, OpenAI's `response_format` and the SDK's `parse` helpers (chat and
Responses) with the `openai` package.

The default model is the embedded SmolLM2 (it writes plausible values); two kit models
with random weights check the families whose answer starts elsewhere: QwQ's template
(its prompt opens the thinking block; with thinking off it closes it) and gpt-oss
(harmony: the JSON goes in the final channel). Sampling is at temperature 1 with seeds,
so the model's own choices vary; every answer must parse and validate all the same.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import httpx
import jsonschema
import ollama
import openai
import pytest
from pydantic import BaseModel

from tests.e2e.daemon_process import Daemon, running_daemon
from tests.e2e.kit_gguf import with_metadata
from tests.helpers.kit import kit_model

E2E_TEMPLATES = Path(__file__).resolve().parent / "templates"
SEEDS = (1, 2, 3)
ASK = [{"role": "user", "content": "Describe a person as JSON: name, age, city, pets."}]


class Pet(BaseModel):
    name: str
    kind: Literal["cat", "dog", "fish"]


class Person(BaseModel):
    name: str
    age: int
    city: str
    pets: list[Pet]
    nickname: str | None = None


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("ds4d-structured")
    qwq = with_metadata(
        kit_model("qwen2"), tmp / "qwq.gguf", (E2E_TEMPLATES / "Qwen-QwQ-32B.jinja").read_text()
    )
    with running_daemon(
        tmp,
        "--add-model",
        f"qwq={qwq}",
        "--add-model",
        f"harmony={kit_model('gpt-oss')}",
        "--slots",
        "1",
        "--ctx",
        "4096",
    ) as d:
        yield d
        assert "Traceback" not in d.log(), d.log()[-4000:]


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> ollama.Client:
    return ollama.Client(host=daemon.url, timeout=300)


@pytest.fixture(scope="module")
def oai(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="x", timeout=300)


@pytest.fixture(scope="module")
def default(client: ollama.Client) -> str:
    return str(client.list().models[0].model)


def options(seed: int, **more: Any) -> dict[str, Any]:
    return {"temperature": 1.0, "seed": seed, **more}


# ---- Ollama ------------------------------------------------------------------------------


def test_ollama_format_json_is_a_json_object(client: ollama.Client, default: str) -> None:
    answers = set()
    for seed in SEEDS:
        r = client.chat(model=default, messages=ASK, format="json", options=options(seed))
        assert r.done_reason == "stop"
        assert isinstance(json.loads(r.message.content), dict), r.message.content
        answers.add(r.message.content)
        g = client.generate(model=default, prompt=ASK[0]["content"], format="json",
                            options=options(seed))  # fmt: skip
        assert isinstance(json.loads(g.response), dict) and g.done_reason == "stop"
    assert len(answers) == len(SEEDS)


def test_ollama_format_schema_from_pydantic(client: ollama.Client, default: str) -> None:
    """Ollama's documented use: format=Model.model_json_schema(), then validate."""
    schema = Person.model_json_schema()
    for seed in SEEDS:
        r = client.chat(model=default, messages=ASK, format=schema, options=options(seed))
        Person.model_validate_json(r.message.content)
        jsonschema.validate(json.loads(r.message.content), schema)
    chunks = client.chat(model=default, messages=ASK, format=schema, stream=True,
                         options=options(7))  # fmt: skip
    parts = list(chunks)
    assert parts[-1].done and parts[-1].done_reason == "stop"
    Person.model_validate_json("".join(p.message.content for p in parts))


def test_ollama_refuses_what_it_cannot_honour(
    daemon: Daemon, client: ollama.Client, default: str
) -> None:
    bad = {"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}}
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model=default, messages=ASK, format=bad)
    assert e.value.status_code == 400 and "pattern" in e.value.error
    # what the client itself would not send
    r = httpx.post(f"{daemon.url}/api/generate",
                   json={"model": default, "prompt": "x", "format": "yaml"})  # fmt: skip
    assert r.status_code == 400 and "format" in r.json()["error"]


def test_num_predict_cuts_the_json_short_with_length(client: ollama.Client, default: str) -> None:
    r = client.chat(model=default, messages=ASK, format=Person.model_json_schema(),
                    options=options(1, num_predict=4))  # fmt: skip
    assert r.done_reason == "length" and r.eval_count == 4
    with pytest.raises(ValueError):
        json.loads(r.message.content)


def test_kit_families_whose_answer_starts_elsewhere(client: ollama.Client) -> None:
    """QwQ with thinking off (its prompt closes the block) and gpt-oss (harmony's final
    channel): the content is the JSON, nothing leaks from the markup."""
    schema = Person.model_json_schema()
    for model, think in (("qwq", False), ("harmony", None)):
        for seed in SEEDS[:2]:
            r = client.chat(model=model, messages=ASK, format=schema, think=think,
                            options=options(seed))  # fmt: skip
            assert r.done_reason == "stop", (model, r)
            Person.model_validate_json(r.message.content)


# ---- OpenAI ------------------------------------------------------------------------------


def test_openai_response_format_json_schema_and_json_object(oai: openai.OpenAI) -> None:
    schema = Person.model_json_schema()
    for seed in SEEDS:
        r = oai.chat.completions.create(
            model="default", messages=ASK, seed=seed, temperature=1.0,  # type: ignore[arg-type]
            response_format={"type": "json_schema",
                             "json_schema": {"name": "person", "schema": schema, "strict": True}},
        )  # fmt: skip
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content or ""), schema)
        o = oai.chat.completions.create(
            model="default",
            messages=ASK,
            seed=seed,
            temperature=1.0,  # type: ignore[arg-type]
            response_format={"type": "json_object"},
        )
        assert isinstance(json.loads(o.choices[0].message.content or ""), dict)


def test_openai_sdk_parse_helpers(oai: openai.OpenAI) -> None:
    """The SDK's own strict schema (additionalProperties false, every key required), read
    back into the model by the SDK: chat, beta chat, and Responses."""
    r = oai.chat.completions.parse(model="default", messages=ASK, response_format=Person,  # type: ignore[arg-type]
                                   seed=1, temperature=1.0)  # fmt: skip
    assert isinstance(r.choices[0].message.parsed, Person)
    b = oai.beta.chat.completions.parse(model="default", messages=ASK,  # type: ignore[arg-type]
                                        response_format=Person, seed=2, temperature=1.0)  # fmt: skip
    assert isinstance(b.choices[0].message.parsed, Person)
    resp = oai.responses.parse(model="default", input=ASK[0]["content"], text_format=Person,
                               temperature=1.0)  # fmt: skip
    assert isinstance(resp.output_parsed, Person)
    streamed = ""
    with oai.chat.completions.stream(model="default", messages=ASK, response_format=Person,  # type: ignore[arg-type]
                                     seed=3, temperature=1.0) as s:  # fmt: skip
        for ev in s:
            if ev.type == "content.delta":
                streamed += ev.delta
        final = s.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Person)
    Person.model_validate_json(streamed)


def test_openai_cut_short_and_refusals(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.LengthFinishReasonError):
        oai.chat.completions.parse(model="default", messages=ASK, response_format=Person,  # type: ignore[arg-type]
                                   max_tokens=3)  # fmt: skip
    bad = {"type": "object", "properties": {"d": {"type": "string", "format": "date"}}}
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(
            model="default", messages=ASK,  # type: ignore[arg-type]
            response_format={"type": "json_schema", "json_schema": {"name": "d", "schema": bad}},
        )  # fmt: skip
    assert e.value.status_code == 400 and "format" in str(e.value.message)
    assert e.value.body["param"] == "response_format.json_schema.schema"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(model="default", input="hi",
                             text={"format": {"type": "json_schema", "name": "d", "schema": bad}})  # fmt: skip
    assert e.value.status_code == 400 and "format" in str(e.value.message)
