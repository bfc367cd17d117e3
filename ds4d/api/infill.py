"""POST /infill: llama.cpp's code-completion endpoint, which llama.vim and llama.vscode call
on every cursor move.

The request carries the text around the cursor (`input_prefix`, `input_suffix`, the
current line's typed text as `prompt`) and context from other files (`input_extra`); the
daemon assembles the model's fill-in-the-middle prompt from it (ds4d.chat.fim). The reply
has llama.cpp's fields, so the plugins' status lines (tokens reused, timings) work.
`n_predict: 0` only brings the prompt into the KV (the plugins' warm-up).

`n_cmpl` > 1 asks for several candidates: they are generated one after another from the
prompt's KV (evaluated once; ds4d.state.recent keeps its state for the next candidate),
each with its own seed (the request's `seed` plus its index, when it gives one), and
answered as llama-server answers several results: a JSON array of final objects, each
with its `index` (streamed: each candidate's pieces and final object carry its index).

Not implemented, accepted for compatibility: `t_max_prompt_ms` (llama.cpp does not
implement it either), `cache_prompt` (ds4d always keeps a prompt's KV; false is accepted
and changes nothing). Samplers run in ds4d's fixed order (top_k, top_p, min_p,
temperature); `samplers` is checked and its `infill` rule applied.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ds4d.api.common import (
    ApiError,
    Completion,
    bad,
    field_of,
    number,
    objects_of,
    request_object,
    sampling_of,
    sse,
    steering_of,
    stop_list,
)
from ds4d.chat.fim import ExtraChunk, InfillInput, supersede_key
from ds4d.chat.types import ChatRequest, Event, Finish, Sampling, TextDelta, Usage

__all__ = ["candidate", "error_body", "parse", "response", "Stream"]

# llama.cpp's sampler names (common/sampling.cpp), with their alternative spellings.
SAMPLER_NAMES = frozenset(
    {
        "dry", "top_k", "top-k", "typ_p", "typ-p", "typical_p", "typical", "top_p", "top-p",
        "nucleus", "min_p", "min-p", "top_n_sigma", "top-n-sigma", "xtc", "infill",
        "penalties", "temperature", "temp", "adaptive_p",
    }
)  # fmt: skip
# several candidates: at most this many (llama-server allows as many as it has slots; here
# they run one after another, so this only bounds one request's work)
N_CMPL_MAX = 16


def error_body(err: ApiError) -> dict[str, Any]:
    """llama.cpp's error shape."""
    return {"error": {"code": err.status, "message": err.message, "type": err.kind}}


def parse(body: Any, defaults: Sampling) -> ChatRequest:
    body = request_object(body)
    prefix = field_of(body, "input_prefix", str, required=True)
    suffix = field_of(body, "input_suffix", str, required=True)
    prompt = field_of(body, "prompt", str, "")
    extra = [
        ExtraChunk(
            field_of(chunk, "text", str, where=f"input_extra[{n}]", required=True),
            field_of(chunk, "filename", str, "tmp", where=f"input_extra[{n}]"),
        )
        for n, chunk in objects_of(body.get("input_extra"), "input_extra", param="input_extra")
    ]
    n_predict = number(body, "n_predict", -1, 1 << 30, -1, integer=True)
    samplers = body.get("samplers")
    if isinstance(samplers, str):  # llama.cpp accepts a string of one-letter names too
        raise bad("'samplers' must be an array of sampler names", "samplers")
    names = stop_list(samplers, "samplers") if samplers is not None else []
    unknown = [n for n in names if n not in SAMPLER_NAMES]
    if unknown:
        raise bad(f"unknown sampler {unknown[0]!r} in 'samplers'", "samplers")
    n_cmpl = number(body, "n_cmpl", 1, N_CMPL_MAX, 1, integer=True)
    fields = body.get("response_fields")
    response_fields = stop_list(fields, "response_fields") if fields is not None else []
    field_of(body, "cache_prompt", bool, True)
    number(body, "t_max_prompt_ms", -1, 1 << 31, 0, integer=True)
    id_slot = number(body, "id_slot", -1, 1 << 31, -1, integer=True)
    sampling = dataclasses.replace(sampling_of(body, defaults), infill="infill" in names)
    return ChatRequest(
        messages=[],
        sampling=sampling,
        max_tokens=None if n_predict < 0 else n_predict,
        stop=stop_list(body.get("stop")),
        model=field_of(body, "model", str, ""),
        stream=field_of(body, "stream", bool, False),
        raw_prompt="",  # no template, no thinking split: the FIM ids are the prompt
        fim=InfillInput(prefix, suffix, prompt, extra),
        priority="completion",
        supersede_key=supersede_key(prefix, id_slot),
        n_indent=number(body, "n_indent", 0, 1 << 16, 0, integer=True),
        t_max_predict_ms=number(body, "t_max_predict_ms", 0, 1 << 31, 0, integer=True),
        response_fields=response_fields,
        candidates=n_cmpl,
        steering=steering_of(body.get("steering")),
    )


def candidate(req: ChatRequest, index: int) -> ChatRequest:
    """The request for the `index`-th of several candidates: the same prompt and settings,
    its own seed (the request's plus the index) so that sampled candidates differ."""
    seed = req.sampling.seed
    sampling = dataclasses.replace(req.sampling, seed=None if seed is None else seed + index)
    return dataclasses.replace(req, sampling=sampling, candidates=1)


def _stop_type(finish: Finish) -> str:
    if finish.stop_sequence is not None:
        return "word"
    if finish.reason == "length":
        return "limit"
    if finish.reason == "stop":
        return "eos"
    return "none"


def _timings(usage: Usage, prompt_s: float, predict_s: float) -> dict[str, Any]:
    prompt_n = usage.prompt_tokens - usage.cached_tokens
    prompt_ms, predicted_ms = prompt_s * 1000, predict_s * 1000
    n_gen = usage.completion_tokens
    return {
        "cache_n": usage.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": 1e3 * prompt_n / prompt_ms if prompt_ms > 0 else 0.0,
        "predicted_n": n_gen,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / n_gen if n_gen else 0.0,
        "predicted_per_second": 1e3 * n_gen / predicted_ms if predicted_ms > 0 else 0.0,
    }


def _final(req: ChatRequest, text: str, usage: Usage, finish: Finish, model: str,
           prompt_s: float, predict_s: float, index: int) -> dict[str, Any]:  # fmt: skip
    cut = req.fim_prompt.cut if req.fim_prompt is not None else None
    s = req.sampling
    body: dict[str, Any] = {
        "index": index,
        "content": text,
        "tokens": [],
        "id_slot": -1,
        "stop": True,
        "model": model,
        "tokens_predicted": usage.completion_tokens,
        "tokens_evaluated": usage.prompt_tokens,
        "generation_settings": {
            "n_predict": req.max_tokens if req.max_tokens is not None else -1,
            "temperature": s.temperature,
            "top_k": s.top_k,
            "top_p": s.top_p,
            "min_p": s.min_p,
            "n_indent": req.n_indent,
            "t_max_predict_ms": req.t_max_predict_ms,
            "stop": req.stop,
        },
        "prompt": "",
        "has_new_line": "\n" in text,
        "truncated": bool(cut and cut.any),
        # ds4d's own: how many tokens of each part were cut to fit (llama.cpp only logs it)
        "truncated_tokens": {
            "prefix": cut.prefix if cut else 0,
            "suffix": cut.suffix if cut else 0,
            "extra": cut.extra if cut else 0,
        },
        "stop_type": _stop_type(finish),
        "stopping_word": finish.stop_sequence or "",
        # llama.cpp's meaning: the tokens the slot's KV holds now (prompt and generated);
        # how many of the prompt's were reused is timings.cache_n
        "tokens_cached": usage.prompt_tokens + usage.completion_tokens,
        "timings": _timings(usage, prompt_s, predict_s),
    }
    if finish.reason == "error":
        body["error"] = finish.error
    return _pick(req.response_fields, body) if req.response_fields else body


def _pick(paths: list[str], body: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp's response_fields: each path ("timings/prompt_n") that exists, under its
    own name."""
    out: dict[str, Any] = {}
    for path in paths:
        value: Any = body
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            out[path] = value
    return out


def response(req: ChatRequest, c: Completion, model: str, index: int = 0) -> dict[str, Any]:
    """The final object (of the `index`-th candidate)."""
    prompt_s, predict_s = c.phase_seconds()
    return _final(req, c.reasoning + c.text, c.usage, c.finish, model, prompt_s, predict_s,
                  index)  # fmt: skip


class Stream:
    """llama.cpp's non-OpenAI stream: one `data:` object per piece of text (`stop`:
    false), then the final object with every field (`stop`: true); no [DONE]."""

    def __init__(self, req: ChatRequest, model: str, index: int = 0) -> None:
        self.req = req
        self.model = model
        self.index = index  # of the candidate (n_cmpl)
        self.times = Completion()  # the phases' clock and the text so far

    def open(self) -> list[str]:
        return []

    def keepalive(self) -> str:
        return ": keepalive\n\n"

    def feed(self, ev: Event) -> list[str]:
        self.times.add(ev)
        if isinstance(ev, TextDelta) and ev.text:
            u = self.times.usage
            return [
                sse(
                    {
                        "index": self.index,
                        "content": ev.text,
                        "tokens": [],
                        "stop": False,
                        "id_slot": -1,
                        "tokens_predicted": u.completion_tokens,
                        "tokens_evaluated": u.prompt_tokens,
                    }
                )
            ]
        if isinstance(ev, Finish):
            final = response(self.req, self.times, self.model, self.index)
            return [sse(final | {"content": ""})]
        return []

    def error(self, err: ApiError) -> list[str]:
        return [sse(error_body(err))]
