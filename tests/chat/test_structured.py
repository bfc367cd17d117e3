"""Structured output (ds4d.chat.structured): whatever the model picks among the allowed
tokens, the answer parses and validates against its schema (checked with `jsonschema`),
and what the constraint cannot honour is refused by name.

Three kinds of "model": a random picker over a small vocabulary made to hold the awkward
tokens (quotes and backslashes inside tokens, escapes, multi-digit tokens, literal
fragments), and two real models sampled at temperature 1 with seeds, so their own
choices vary: the embedded SmolLM2 and the Qwen3 kit model (another tokenizer)."""

from __future__ import annotations

import json
import random
from collections.abc import Generator, Iterator
from typing import Any

import jsonschema
import numpy as np
import pytest

from ds4d.chat.constrain import Allow, Force, VocabIndex
from ds4d.chat.structured import MAX_STRING_TOKENS, JsonVocab, json_output, unsupported
from ds4d.chat.types import OutputFormat
from ds4d.engine import Engine
from ds4d.engine.sampler import SamplingParams, make_rng, sample
from tests.helpers.forced_calls import run_constraint
from tests.helpers.kit import kit_model

ADDRESS = {
    "type": "object",
    "properties": {
        "street": {"type": "string"},
        "city": {"type": "string"},
        "zip": {"type": "integer"},
    },
    "required": ["street", "city"],
}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "email": {"type": "string"},
        "score": {"type": "number"},
        "active": {"type": "boolean"},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
        "address": ADDRESS,
        "nickname": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    },
    "required": ["name", "age", "role", "tags", "address"],
}
# What pydantic's model_json_schema() writes for nested models: $defs and $ref, titles,
# defaults, Optional as anyOf with null, Literal as enum.
PYDANTIC = {
    "$defs": {"Address": {**ADDRESS, "title": "Address"}},
    "properties": {
        "name": {"title": "Name", "type": "string"},
        "home": {"$ref": "#/$defs/Address"},
        "others": {"items": {"$ref": "#/$defs/Address"}, "title": "Others", "type": "array"},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        "kind": {"enum": ["a", "b"], "title": "Kind", "type": "string"},
    },
    "required": ["name", "home", "others", "kind"],
    "title": "Person",
    "type": "object",
}
SCHEMAS: dict[str, dict[str, Any] | None] = {
    "any_object": None,
    "person": PERSON,
    "pydantic": PYDANTIC,
    "numbers": {"type": "array", "items": {"type": "number"}, "maxItems": 4},
    "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
    "integer_alone": {"type": "integer"},
    "number_or_null_alone": {"type": ["number", "null"]},
    "empty_object": {"type": "object", "additionalProperties": False},
    "mixed": {
        "type": "object",
        "properties": {
            "v": {"type": ["integer", "string", "boolean", "null"]},
            "e": {"enum": [1, "one", None, True]},
            "c": {"const": "fixed"},
            "nested": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
            "free": {},
        },
        "required": ["v", "e", "c", "nested", "free"],
    },
}

# A byte-BPE-like vocabulary: single characters, tokens holding quotes and backslashes,
# whole escapes (alone and inside text), a lone backslash, multi-digit tokens, literal
# fragments, separators, and tokens that are None (specials / partial UTF-8).
VOCAB: list[str | None] = (
    [chr(c) for c in range(32, 127)]
    + ["\n", "\t", '",', '":', '"}', "\\n", '\\"', "\\\\", "a\\tb", "\\u00e9", "\\u12", "\\"]
    + ["tr", "ue", "fa", "lse", "nu", "ll", "00", "12", "0", "007", "-1", "é", "ab", ", "]
    + ['"a', '{"', "[1", "1,", "}]", "\ufffd", None, None]
)  # fmt: skip


def check(text: str, schema: dict[str, Any] | None) -> Any:
    value = json.loads(text)
    if schema is None:
        assert isinstance(value, dict), text
    else:
        jsonschema.validate(value, schema)
    return value


def strings_in(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from strings_in(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings_in(v)


@pytest.mark.parametrize("name", SCHEMAS)
def test_random_picks_always_parse_and_validate(name: str) -> None:
    schema = SCHEMAS[name]
    assert schema is None or unsupported(schema) is None
    jv = JsonVocab(VocabIndex(VOCAB))
    for seed in range(200):
        text = run_constraint(json_output(jv, OutputFormat(schema)), VOCAB, random.Random(seed))
        check(text, schema)


def test_strings_carry_escapes_as_whole_tokens_never_a_lone_backslash() -> None:
    jv = JsonVocab(VocabIndex(VOCAB))
    body = {VOCAB[i] for i in jv.string_body}
    assert {"\\n", '\\"', "\\\\", "a\\tb", "\\u00e9", "é"} <= body
    assert not {"\\", "\\u12", '"', '",', "\n", "\t"} & body
    seen = ""
    for seed in range(100):
        text = run_constraint(
            json_output(jv, OutputFormat({"type": "string"})), VOCAB, random.Random(seed)
        )
        seen += check(text, {"type": "string"})
    assert {"\n", '"', "\\", "\t", "é"} <= set(seen)  # the escapes were written and read


def test_optional_properties_enums_branches_and_array_lengths_all_vary() -> None:
    """The model's picks decide what is optional; the schema what is not."""
    jv = JsonVocab(VocabIndex(VOCAB))
    keys: set[str] = set()
    roles, lengths, nick_kinds = set(), set(), set()
    for seed in range(200):
        text = run_constraint(json_output(jv, OutputFormat(PERSON)), VOCAB, random.Random(seed))
        v = check(text, PERSON)
        keys |= set(v)
        roles.add(v["role"])
        lengths.add(len(v["tags"]))
        if "nickname" in v:
            nick_kinds.add(type(v["nickname"]))
    assert keys == set(PERSON["properties"])
    assert roles == {"admin", "user", "guest"}
    assert lengths == {1, 2, 3}
    assert nick_kinds == {str, type(None)}


@pytest.mark.parametrize(
    ("schema", "word"),
    [
        ({"type": "string", "pattern": "^a"}, "pattern"),
        ({"type": "string", "format": "date-time"}, "format"),
        ({"type": "string", "maxLength": 3}, "maxLength"),
        ({"type": "integer", "minimum": 0}, "minimum"),
        ({"type": "object", "properties": {"a": {"not": {}}}}, "not"),
        ({"type": "object", "patternProperties": {"^a": {}}}, "patternProperties"),
        ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "allOf"),
        ({"anyOf": [{"type": "string"}, {"enum": ["a"]}]}, "two branches allow a string"),
        ({"$ref": "https://example.com/s.json"}, "local"),
        ({"$ref": "#/$defs/Nope"}, "does not resolve"),
        (
            {
                "$defs": {"N": {"type": "object", "properties": {"n": {"$ref": "#/$defs/N"}}}},
                "$ref": "#/$defs/N",
            },
            "recursive",
        ),  # fmt: skip
        ({"type": "array", "items": [{"type": "string"}]}, "items"),
        ({"type": "array", "minItems": 3, "maxItems": 2}, "minItems"),
        ({"type": "text"}, "not a JSON schema type"),
        ({"enum": []}, "enum"),
        ({"const": float("nan")}, "const"),
        ([1], "JSON schema object"),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(schema: Any, word: str) -> None:
    why = unsupported(schema)
    assert why is not None and word in why and "\n" not in why


# ---- real models, sampled ----------------------------------------------------------------


def generate(engine: Any, vocab: VocabIndex, jv: JsonVocab, schema: Any, seed: int) -> str:
    """The answer a real model writes under the constraint: temperature 1, seeded."""
    tok = engine.tokenizer
    params = SamplingParams(temperature=1.0, seed=seed)
    rng = make_rng(seed)
    prompt = "Reply with a JSON object describing a person: name, age, city.\n"
    steps: Generator[Force | Allow, str, None] = json_output(jv, OutputFormat(schema))
    text = ""
    with engine.new_session(8192) as session:
        session.eval(tok.encode(prompt, special=False))
        step = next(steps)
        try:
            while True:
                if isinstance(step, Force):
                    session.eval(tok.encode_continuation(step.text, special=True))
                    text += step.text
                    step = steps.send("")
                else:
                    token = sample(session.compute_logits(), params, rng, step.ids)
                    assert token in step.ids
                    piece = vocab.texts[token]
                    assert piece is not None
                    session.eval([token])
                    text += piece
                    step = steps.send(piece)
        except StopIteration:
            pass
    return text


@pytest.fixture(scope="module")
def kit_engine() -> Iterator[Any]:
    with Engine.open(kit_model("qwen3"), threads=2) as e:
        yield e


MODEL_SCHEMAS = ["any_object", "person", "pydantic", "mixed"]
SEEDS = (0, 1)  # seconds each; the embedded model rambles for tens of seconds on some


@pytest.mark.parametrize("which", ["embedded", "kit-qwen3"])
def test_real_models_at_temperature_1_write_valid_json(which: str, request: Any) -> None:
    engine = request.getfixturevalue("engine" if which == "embedded" else "kit_engine")
    vocab = VocabIndex.from_tokenizer(engine.tokenizer, engine.info.n_vocab)
    jv = JsonVocab(vocab)
    texts = set()
    for name in MODEL_SCHEMAS:
        for seed in SEEDS:
            text = generate(engine, vocab, jv, SCHEMAS[name], seed)
            check(text, SCHEMAS[name])
            texts.add(text)
    assert len(texts) == len(MODEL_SCHEMAS) * len(SEEDS)  # the seeds' picks differ


def test_string_bound_closes_a_string_a_model_never_ends() -> None:
    """A picker that never picks the closing quote still gets a closed string."""
    jv = JsonVocab(VocabIndex(VOCAB))
    steps = json_output(jv, OutputFormat({"type": "string"}))
    text, step = "", next(steps)
    try:
        while True:
            if isinstance(step, Force):
                text += step.text
                step = steps.send("")
            else:
                ids = [i for i in step.ids.tolist() if VOCAB[i] != '"']
                piece = VOCAB[int(np.random.default_rng(0).choice(ids))]
                assert piece is not None
                text += piece
                step = steps.send(piece)
    except StopIteration:
        pass
    assert isinstance(json.loads(text), str)
    assert text.count('"') - text.count('\\"') == 2 or len(text) >= MAX_STRING_TOKENS
