"""The embedding routes end to end: real `ds4d serve` processes on the kit's tiny models,
spoken to by the real `openai` SDK (embeddings.create) and the `ollama` package (embed,
embeddings), and by plain HTTP for the error shapes.

  embed-qwen3  an embedding model (Qwen3-Embedding-style: last-token pooling, EOS
               appended): vectors against the sentence-transformers reference, every input
               form, base64, dimensions, truncation, concurrent requests; refused on chat.
  qwen3        a generation model: refused on the embedding routes without --pooling; with
               --pooling mean it embeds while a chat slot keeps its prefix.
  embed-*      every embedding family of the kit (BERT, EmbeddingGemma, ...) served: each
               input's vector against its reference through both SDKs, and /api/show
               saying `embedding`.
"""

from __future__ import annotations

import base64
import concurrent.futures
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import ollama
import openai
import pytest

from tests.e2e.daemon_process import Daemon, running_daemon
from tests.engine.test_embedding import MAX_COSINE_DISTANCE, cosine_distance, references
from tests.helpers.kit import embed_kit_families, kit_model

CTX = 192  # the embedding daemon's context: the kit's longest input (273 tokens) exceeds it


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("embed")
    with running_daemon(tmp, "--model", str(kit_model("embed-qwen3")), "--ctx", str(CTX),
                        "--slots", "1", "--threads", "2") as d:  # fmt: skip
        yield d


def oai(d: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{d.url}/v1", api_key="local", max_retries=0)


def short_refs() -> dict[str, tuple[str, np.ndarray, np.ndarray]]:
    """The kit inputs that fit CTX."""
    return {k: v for k, v in references("embed-qwen3").items() if len(v[1]) <= CTX}


def test_openai_sdk_vectors_are_the_reference(embedder: Daemon) -> None:
    refs = short_refs()
    assert len(refs) >= 3
    texts = [t for t, _ids, _v in refs.values()]
    # The SDK asks for base64 by default and decodes it itself.
    got = oai(embedder).embeddings.create(model="anything", input=texts)
    assert [e.index for e in got.data] == list(range(len(texts)))
    assert got.usage.prompt_tokens == sum(len(ids) for _t, ids, _v in refs.values())
    assert got.model == "anything"
    for (name, (_t, _ids, ref)), e in zip(refs.items(), got.data, strict=True):
        vec = np.asarray(e.embedding, np.float32)
        assert vec.shape == ref.shape
        assert cosine_distance(vec, ref) < MAX_COSINE_DISTANCE, name
    as_float = oai(embedder).embeddings.create(model="m", input=texts, encoding_format="float")
    for a, b in zip(as_float.data, got.data, strict=True):
        assert np.array_equal(
            np.asarray(a.embedding, np.float32), np.asarray(b.embedding, np.float32)
        )


def test_openai_token_inputs_and_dimensions(embedder: Daemon) -> None:
    refs = short_refs()
    ids = [r[1].tolist() for r in refs.values()]
    client = oai(embedder)
    one = client.embeddings.create(model="m", input=ids[0], encoding_format="float")
    many = client.embeddings.create(model="m", input=ids, encoding_format="float")
    assert len(one.data) == 1 and len(many.data) == len(ids)
    assert one.data[0].embedding == many.data[0].embedding
    assert one.usage.prompt_tokens == len(ids[0])
    cut = client.embeddings.create(model="m", input=ids, dimensions=16, encoding_format="float")
    for full, short in zip(many.data, cut.data, strict=True):
        v = np.asarray(short.embedding)
        assert v.shape == (16,)
        assert abs(np.linalg.norm(v) - 1.0) < 1e-6
        head = np.asarray(full.embedding[:16])
        assert np.allclose(v, head / np.linalg.norm(head), atol=1e-7)


def test_openai_raw_base64_is_little_endian_float32(embedder: Daemon) -> None:
    body = {"model": "m", "input": "hello", "encoding_format": "base64"}
    r = httpx.post(f"{embedder.url}/v1/embeddings", json=body, timeout=30)
    assert r.status_code == 200
    raw = base64.b64decode(r.json()["data"][0]["embedding"])
    vec = np.frombuffer(raw, "<f4")
    ref = references("embed-qwen3")["short"][2]
    assert vec.shape == ref.shape and cosine_distance(vec, ref) < MAX_COSINE_DISTANCE


def test_too_long_input_is_a_400_saying_by_how_much_unless_truncated(embedder: Daemon) -> None:
    text, ids, _ref = references("embed-qwen3")["plain"]
    assert len(ids) > CTX
    with pytest.raises(openai.BadRequestError) as err:
        oai(embedder).embeddings.create(model="m", input=[text])
    body = err.value.body
    assert isinstance(body, dict)
    assert f"{len(ids) - CTX} more than the context of {CTX}" in body["message"]
    assert body["code"] == "context_length_exceeded"
    # Ollama truncates by default, and refuses when asked not to.
    client = ollama.Client(host=embedder.url)
    got = client.embed(model="m", input=text)
    assert len(got.embeddings) == 1 and got.prompt_eval_count == CTX
    with pytest.raises(ollama.ResponseError) as oerr:
        client.embed(model="m", input=text, truncate=False)
    assert oerr.value.status_code == 400
    assert f"{len(ids) - CTX} more than the context" in oerr.value.error
    # ds4d's truncate extension on the OpenAI route gives the same vector.
    r = httpx.post(f"{embedder.url}/v1/embeddings", timeout=30,
                   json={"input": text, "truncate": True, "encoding_format": "float"})  # fmt: skip
    assert r.status_code == 200
    assert r.json()["data"][0]["embedding"] == got.embeddings[0]


def test_ollama_embed_is_normalised_and_renormalised_after_dimensions(embedder: Daemon) -> None:
    refs = short_refs()
    texts = [t for t, _ids, _v in refs.values()]
    client = ollama.Client(host=embedder.url)
    got = client.embed(model="qwen3-embedding", input=texts)
    assert got.model == "qwen3-embedding"
    assert got.prompt_eval_count == sum(len(ids) for _t, ids, _v in refs.values())
    for (name, (_t, _ids, ref)), e in zip(refs.items(), got.embeddings, strict=True):
        v = np.asarray(e)
        assert abs(np.linalg.norm(v) - 1.0) < 1e-6
        assert cosine_distance(v.astype(np.float32), ref) < MAX_COSINE_DISTANCE, name
    cut = client.embed(model="m", input=texts[0], dimensions=8, keep_alive="5m")
    v = np.asarray(cut.embeddings[0])
    assert v.shape == (8,) and abs(np.linalg.norm(v) - 1.0) < 1e-6
    head = np.asarray(got.embeddings[0][:8])
    assert np.allclose(v, head / np.linalg.norm(head), atol=1e-7)
    old = client.embeddings(model="m", prompt=texts[0])
    assert np.allclose(old.embedding, got.embeddings[0], atol=0)
    assert client.embed(model="m", input="").embeddings == []


def test_concurrent_requests_give_the_vectors_of_one_at_a_time(embedder: Daemon) -> None:
    refs = list(short_refs().values())
    inputs = [[t] for t, _i, _v in refs] * 4 + [[t for t, _i, _v in refs]] * 4
    client = oai(embedder)

    def one(texts: list[str]) -> list[list[float]]:
        got = client.embeddings.create(model="m", input=texts, encoding_format="float")
        return [e.embedding for e in got.data]

    alone = [one(texts) for texts in inputs]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        together = list(pool.map(one, inputs))
    assert together == alone


def test_errors_come_in_each_protocols_shape(embedder: Daemon) -> None:
    url = embedder.url
    cases = [
        ({"input": []}, "empty"),
        ({"input": ""}, "empty string"),
        ({"input": [1, "a"]}, "input[0]"),
        ({"input": 5}, "input must be"),
        ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
        ({"input": "x", "dimensions": 65}, "more than this model's 64"),
        ({"input": [[151936]]}, "outside the vocabulary"),
    ]
    for body, words in cases:
        r = httpx.post(f"{url}/v1/embeddings", json=body, timeout=30)
        assert r.status_code == 400, body
        err = r.json()["error"]
        assert words in err["message"] and err["type"] == "invalid_request_error", body
    for body, words in [({"input": 3}, "input must be"), ({"input": ["a", ""]}, "empty"),
                        ({"input": "a", "truncate": "no"}, "truncate")]:  # fmt: skip
        r = httpx.post(f"{url}/api/embed", json=body, timeout=30)
        assert r.status_code == 400
        assert set(r.json()) == {"error"} and words in r.json()["error"], body
    r = httpx.post(f"{url}/api/embed", content=b"{not json", timeout=30)
    assert r.status_code == 400 and set(r.json()) == {"error"}


def test_an_embedding_model_is_refused_on_the_generation_routes(embedder: Daemon) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        oai(embedder).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    assert "is an embedding model: use /v1/embeddings" in str(err.value)


def test_a_generation_model_without_pooling_is_refused_on_the_embedding_routes(
    tmp_path: Path,
) -> None:
    with running_daemon(tmp_path, "--model", str(kit_model("qwen3")), "--ctx", "256",
                        "--slots", "1", "--threads", "2") as d:  # fmt: skip
        with pytest.raises(openai.BadRequestError) as err:
            oai(d).embeddings.create(model="m", input="hello")
        assert "--pooling" in str(err.value)
        r = httpx.post(f"{d.url}/api/embed", json={"input": "hello"}, timeout=30)
        assert r.status_code == 400 and "--pooling" in r.json()["error"]


def test_a_chat_slot_keeps_its_prefix_while_embeddings_run(tmp_path: Path) -> None:
    with running_daemon(tmp_path, "--model", str(kit_model("qwen3")), "--ctx", "1024",
                        "--slots", "1", "--threads", "2", "--pooling", "mean") as d:  # fmt: skip
        client = oai(d)
        text = references("embed-qwen3")["code"][0]
        messages: list = [{"role": "user", "content": "Explain this code:\n" + text}]
        first = client.chat.completions.create(model="m", messages=messages, max_tokens=8,
                                               temperature=0)  # fmt: skip
        assert first.usage is not None
        got = client.embeddings.create(model="m", input=[text] * 40 + ["short"])
        assert len(got.data) == 41
        messages += [{"role": "assistant", "content": first.choices[0].message.content or ""},
                     {"role": "user", "content": "Thanks"}]  # fmt: skip
        second = client.chat.completions.create(model="m", messages=messages, max_tokens=4,
                                                temperature=0)  # fmt: skip
        assert second.usage is not None and second.usage.prompt_tokens_details is not None
        cached = second.usage.prompt_tokens_details.cached_tokens or 0
        assert cached >= first.usage.prompt_tokens - 1


@pytest.mark.parametrize("family", embed_kit_families())
def test_every_kit_embedding_family_is_served_end_to_end(tmp_path: Path, family: str) -> None:
    refs = references(family)
    texts = [t for t, _ids, _v in refs.values()]
    with running_daemon(tmp_path, "--model", str(kit_model(family)), "--ctx", "512",
                        "--slots", "1", "--threads", "2") as d:  # fmt: skip
        got = oai(d).embeddings.create(model=family, input=texts)
        assert got.usage.prompt_tokens == sum(len(ids) for _t, ids, _v in refs.values())
        client = ollama.Client(host=d.url)
        embedded = client.embed(model=family, input=texts)
        for (name, (_t, _ids, ref)), e, o in zip(refs.items(), got.data, embedded.embeddings,
                                                 strict=True):  # fmt: skip
            vec = np.asarray(e.embedding, np.float32)
            assert vec.shape == ref.shape
            assert cosine_distance(vec, ref) < MAX_COSINE_DISTANCE, f"{family} {name}"
            assert np.array_equal(np.asarray(o, np.float32), vec), f"{family} {name}"
        assert client.show(family).capabilities == ["embedding"]
