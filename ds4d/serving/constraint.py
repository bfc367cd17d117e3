"""The tool-call constraint of one generation: a forced call (tool_choice required or
named) or the rest of a call the model opened itself, written as a valid call of a
declared tool. A state machine over ds4d.chat.constrain's steps: each step either forces
text (`Force`: markup, tokenized as the prompt is) or allows a set of token ids
(`Allow`), and is advanced by the text of what was sampled."""

from __future__ import annotations

from ds4d.chat.constrain import Allow, Force, Step


class CallConstraint:
    def __init__(self, steps: Step) -> None:
        self._steps = steps
        self.current: Force | Allow | None = next(steps)

    @property
    def done(self) -> bool:
        return self.current is None

    def advance(self, text: str | None) -> None:
        """The text the last step produced (a forced text, a sampled token's text, None
        for a special token); the next step, or done."""
        try:
            self.current = self._steps.send(text or "")
        except StopIteration:
            self.current = None
