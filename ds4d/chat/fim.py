"""Fill-in-the-middle prompts: an editor's cursor context as the model's token ids.

Every completion API that sends the text around a cursor (llama.cpp's `/infill`,
OpenAI's `/v1/completions` with `suffix`, Ollama's `/api/generate` with `suffix`) comes
here with an `InfillInput` and gets the prompt's ids back, assembled as llama.cpp's
`format_prompt_infill` does, so that a model answers ds4d as it answers llama-server:

    [REP] "myproject\\n" [SEP] "file0\\n" chunk0 [SEP] "file1\\n" chunk1 ... [SEP] "filename\\n"
    [PRE] prefix prompt [SUF] suffix [MID]

(suffix-first order puts `[SUF] suffix` before `[PRE] prefix prompt`). A vocabulary with
no repository markers separates the chunks with a plain-text "--- snippet ---" line. The
extra context goes first, in the client's order, so a keystroke in the current file keeps
the KV of every chunk before it.

User text is tokenized as plain text: a file that contains "<|fim_prefix|>" is read as
those characters, never as the marker (llama.cpp parses markup in `prompt`; ds4d does not).

Budgets, as llama.cpp's with its batch size as the window: the prefix keeps its last
3/4 of the window, the suffix its first 1/4 less the prompt and two markers, and the extra
context what the context leaves past the window and twice the predicted tokens, dropping
its oldest tokens first. What was cut is reported in `FimPrompt.cut`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ds4d.chat.errors import PromptRefused
from ds4d.chat.types import ChatRequest
from ds4d.engine.fim import FimTokens

# llama-server's default batch size: its window for the prefix and the suffix.
DEFAULT_WINDOW = 2048
REPO_NAME = "myproject"  # llama.cpp's fixed repository name
CURRENT_FILE = "filename"  # and its fixed name for the file being edited
EXTRA_FILE = "tmp"  # a chunk sent without a filename
SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"  # between chunks without a file separator
SUPERSEDE_HEAD_CHARS = 256  # a file is told apart by its first characters


class FimVocab(Protocol):
    """What assembly asks of the tokenizer (ds4d.engine.tokenizer_api.ModelTokenizer)."""

    bos_id: int | None
    add_bos: bool

    def encode(self, text: str, special: bool = True) -> list[int]: ...


@dataclass(frozen=True)
class ExtraChunk:
    """Context from another file (or another part of this one)."""

    text: str
    filename: str = EXTRA_FILE


@dataclass(frozen=True)
class InfillInput:
    prefix: str  # the file before the cursor
    suffix: str  # the file after it
    prompt: str = ""  # text typed on the cursor's line, appended to the prefix
    extra: Sequence[ExtraChunk] = ()


@dataclass(frozen=True)
class Budget:
    """How much of each part fits: llama-server's n_batch, the slot's context and the
    tokens to predict (which the extra context leaves room for twice)."""

    n_ctx: int
    window: int = DEFAULT_WINDOW
    n_predict: int = -1  # llama.cpp's "unlimited"; the daemon passes the request's limit
    suffix_first: bool = False  # suffix-prefix-middle order (llama-server --spm-infill)


@dataclass(frozen=True)
class Cut:
    """Tokens dropped to fit: the prefix's oldest, the suffix's last, the extra
    context's oldest."""

    prefix: int = 0
    suffix: int = 0
    extra: int = 0

    @property
    def any(self) -> bool:
        return bool(self.prefix or self.suffix or self.extra)


@dataclass(frozen=True)
class FimPrompt:
    ids: list[int]
    cut: Cut = field(default_factory=Cut)
    extra_tokens: int = 0  # how many of `ids` are extra context (kept)


def refuse_unless_supported(fim: FimTokens, param: str) -> None:
    """PromptRefused (a 400) in one line when the model cannot fill in the middle."""
    if not fim.supported:
        missing = ", ".join(fim.missing)
        raise PromptRefused(
            f"this model has no fill-in-the-middle tokens ({missing} missing): "
            "infill needs a code model trained for it, such as Qwen2.5-Coder",
            param,
        )


def assemble(tok: FimVocab, fim: FimTokens, inp: InfillInput, budget: Budget) -> FimPrompt:
    """The prompt's token ids (blocking: tokenizes the whole file context)."""
    refuse_unless_supported(fim, "input_suffix")
    assert fim.pre is not None and fim.suf is not None and fim.mid is not None

    def plain(text: str) -> list[int]:
        return tok.encode(text, special=False)

    extra: list[int] = []
    if fim.rep is not None:
        extra += [fim.rep, *plain(REPO_NAME + "\n")]
    for chunk in inp.extra:
        if fim.sep is not None:
            extra += [fim.sep, *plain(chunk.filename + "\n")]
        else:
            extra += plain(SNIPPET_SEPARATOR)
        extra += plain(chunk.text)
    if fim.sep is not None:
        extra += [fim.sep, *plain(CURRENT_FILE + "\n")]

    prefix = plain(inp.prefix)
    suffix = plain(inp.suffix)
    prompt = plain(inp.prompt)
    window = budget.window
    n_prefix = min(len(prefix), 3 * (window // 4))
    n_suffix = min(len(suffix), max(0, window // 4 - (2 + len(prompt))))
    n_extra = min(max(0, budget.n_ctx - window - 2 * budget.n_predict), len(extra))
    cut = Cut(len(prefix) - n_prefix, len(suffix) - n_suffix, len(extra) - n_extra)

    pre_part = [fim.pre, *prefix[len(prefix) - n_prefix :], *prompt]
    suf_part = [fim.suf, *suffix[:n_suffix]]
    first, second = (suf_part, pre_part) if budget.suffix_first else (pre_part, suf_part)
    # llama.cpp puts BOS before the FIM part and the extra context before BOS; kept so
    # that a model sees exactly what llama-server gives it.
    bos = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
    kept_extra = extra[len(extra) - n_extra :]
    ids = [*kept_extra, *bos, *first, *second, fim.mid]
    return FimPrompt(ids, cut, len(kept_extra))


def assemble_request(
    req: ChatRequest, tok: FimVocab, fim: FimTokens, n_ctx: int, *, suffix_first: bool = False
) -> FimPrompt:
    """Sets `req.prompt_ids` from `req.fim` (blocking: run it on a worker): what every
    API's infill path calls once it has parsed its fields into an `InfillInput`. The
    extra context leaves room for twice the request's token limit, as llama.cpp's does
    for its configured one."""
    assert req.fim is not None
    n_predict = req.max_tokens if req.max_tokens is not None else -1
    # llama-server's window is its batch size (2048 by default); a small context halves it
    window = min(DEFAULT_WINDOW, n_ctx // 2)
    budget = Budget(n_ctx, window, n_predict, suffix_first)
    out = assemble(tok, fim, req.fim, budget)
    req.prompt_ids = out.ids
    req.fim_prompt = out
    return out


def supersede_key(prefix: str, slot: int = -1) -> str:
    """The ChatRequest.supersede_key of a completion: a newer one replaces an older one
    for the same editor, told by the slot id a client names (llama.cpp's id_slot), else
    by the file (its first characters, which typing at the cursor leaves alone)."""
    if slot >= 0:
        return f"infill-slot:{slot}"
    head = prefix[:SUPERSEDE_HEAD_CHARS].encode("utf-8", "surrogatepass")
    return "infill-file:" + hashlib.sha256(head).hexdigest()[:16]
