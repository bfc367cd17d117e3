"""Where an inline code completion stops, besides stop sequences: llama.cpp's `n_indent`
and `t_max_predict_ms` rules (server-context.cpp), applied to the text as it streams.

- `n_indent`: every line after the first must start with at least that many spaces or
  tabs; the first line that does not (an empty line included) ends the completion, cut
  at its first other character. The editor asked for the body of a block, not what
  follows it.
- `t_max_predict_ms`: once that long has passed since the first generated text, the next
  newline ends the completion (after it): a slow model still gives whole lines.
"""

from __future__ import annotations

import time
from collections.abc import Callable

_INDENT = " \t"


class EditLimits:
    def __init__(
        self,
        n_indent: int = 0,
        t_max_predict_ms: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.n_indent = n_indent
        self.t_max_s = t_max_predict_ms / 1000
        self.clock = clock
        self.started: float | None = None
        self.hit: str | None = None  # "indent" or "time" once a rule ended the text
        self.buf = ""  # the start of a line whose indentation is not known yet
        self.at_line_start = False  # after a newline, before the line's first other char

    @property
    def active(self) -> bool:
        return self.n_indent > 0 or self.t_max_s > 0

    def feed(self, text: str) -> str:
        """The part of `text` to emit; after a hit, nothing more."""
        if self.hit is not None or not text:
            return ""
        if self.started is None:
            self.started = self.clock()
        out = self._indent(text) if self.n_indent > 0 else text
        if (
            self.hit is None
            and self.t_max_s > 0
            and "\n" in text
            and self.clock() - self.started > self.t_max_s
        ):
            self.hit = "time"
            out += self.buf  # the line just ended is complete: emit what was held
            self.buf = ""
        return out

    def flush(self) -> str:
        held, self.buf = self.buf, ""
        return held if self.hit is None else ""

    def _indent(self, text: str) -> str:
        out: list[str] = []
        for ch in text:
            if self.at_line_start:  # a line after the first: is it indented enough?
                if ch in _INDENT:
                    self.buf += ch
                    continue
                out.append(self.buf)  # llama.cpp keeps the indentation it cuts after
                self.buf = ""
                if len(out[-1]) < self.n_indent:
                    self.hit = "indent"
                    break
                self.at_line_start = False
            out.append(ch)
            self.at_line_start = ch == "\n"
        return "".join(out)
