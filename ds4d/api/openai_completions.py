"""POST /v1/completions: legacy text completion; the prompt is used as is (no template)."""

from __future__ import annotations

import time
from typing import Any

from ds4d.api.common import (
    KEEPALIVE,
    ApiError,
    Completion,
    bad,
    field_of,
    max_tokens_of,
    random_id,
    request_object,
    sampling_of,
    sse,
    steering_of,
    stop_list,
)
from ds4d.api.openai_chat import error_body, usage_json
from ds4d.chat.fim import InfillInput, supersede_key
from ds4d.chat.types import ChatRequest, Event, Finish, Sampling, TextDelta, Usage

__all__ = ["error_body", "parse", "response", "Stream"]

DEFAULT_MAX_TOKENS = 16  # OpenAI's documented default for this endpoint


def parse(body: Any, defaults: Sampling) -> ChatRequest:
    body = request_object(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if prompt is None:
        raise bad("'prompt' is required", "prompt")
    if not isinstance(prompt, str):
        raise bad("'prompt' must be a string (or an array holding one string)", "prompt")
    if field_of(body, "n", int, 1) != 1:
        raise bad("only n=1 is supported", "n")
    stream_options = field_of(body, "stream_options", dict, {})
    echo = field_of(body, "echo", bool, False)
    if echo:
        raise bad("'echo' is not supported", "echo")
    # OpenAI's insertion form: the prompt is the text before the cursor, `suffix` the
    # text after it; the model fills in the middle (a 400 when it cannot, never a drop).
    suffix = field_of(body, "suffix", str, "")
    fim = InfillInput(prompt, suffix) if suffix else None
    return ChatRequest(
        messages=[],
        sampling=sampling_of(body, defaults),
        max_tokens=max_tokens_of(body, "max_tokens") or DEFAULT_MAX_TOKENS,
        stop=stop_list(body.get("stop")),
        model=field_of(body, "model", str, ""),
        stream=field_of(body, "stream", bool, False),
        include_usage=field_of(
            stream_options, "include_usage", bool, False, where="stream_options"
        ),
        raw_prompt=prompt,
        fim=fim,
        priority="completion" if fim is not None else "chat",
        supersede_key=supersede_key(prompt) if fim is not None else None,
        steering=steering_of(body.get("steering")),
    )


def response(req: ChatRequest, c: Completion, model: str) -> dict[str, Any]:
    return {
        "id": random_id("cmpl-"),
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "text": c.reasoning + c.text,
                "index": 0,
                "logprobs": None,
                "finish_reason": c.finish.reason,
            }
        ],
        "usage": usage_json(c.usage),
    }


class Stream:
    def __init__(self, req: ChatRequest, model: str) -> None:
        self.req = req
        self.id = random_id("cmpl-")
        self.created = int(time.time())
        self.model = model
        self.usage: Usage | None = None

    def _chunk(self, text: str, finish: str | None = None) -> str:
        return sse(
            {
                "id": self.id,
                "object": "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}],
            }
        )

    def open(self) -> list[str]:
        return []

    def keepalive(self) -> str:
        return KEEPALIVE

    def feed(self, ev: Event) -> list[str]:
        if isinstance(ev, TextDelta):
            return [self._chunk(ev.text)]
        if isinstance(ev, Usage):
            self.usage = ev
        if isinstance(ev, Finish):
            out = [self._chunk("", ev.reason)]
            if self.req.include_usage and self.usage is not None:
                out.append(
                    sse(
                        {
                            "id": self.id,
                            "object": "text_completion",
                            "created": self.created,
                            "model": self.model,
                            "choices": [],
                            "usage": usage_json(self.usage),
                        }
                    )
                )
            return [*out, sse("[DONE]")]
        return []

    def error(self, err: ApiError) -> list[str]:
        return [sse(error_body(err), "error"), sse("[DONE]")]
