"""The slot pool of one model: which idle slot a prompt goes to, and the slot classes.

A prompt goes to the idle slot whose tokens share the longest prefix with it, else to the
least recently used one; only a slot whose KV was computed under the prompt's steering
shares anything with it (another steering's KV is dropped when the slot is taken). Slots
come in two classes: completion-priority requests (an editor's inline completions) use
their own few slots (`completion_slots`) and everything else the rest, so a completion
never throws away an agent's KV and an agent never throws away the completion's. With no
completion slots, every request uses every slot."""

from __future__ import annotations

import time
from collections.abc import Sequence

from ds4d.chat.types import Priority
from ds4d.state.matching import common_prefix
from ds4d.state.slots import Slot

# a completion goes on from a slot it shares at least this much with (see best_idle)
COMPLETION_SHARED_TOKENS = 256


class SlotPool:
    def __init__(self, slots: list[Slot], completion_slots: int = 0) -> None:
        if not 0 <= completion_slots < len(slots):
            raise ValueError(
                f"completion_slots must leave at least one slot for the rest: "
                f"{completion_slots} of {len(slots)}"
            )
        self.slots = slots
        # the last `completion_slots` slots are the completions'
        self.completion = {s.index for s in slots[len(slots) - completion_slots :]}

    @property
    def busy(self) -> int:
        return sum(s.busy for s in self.slots)

    def slot_class(self, priority: Priority) -> list[Slot]:
        """The slots a request of this priority may use."""
        if not self.completion:
            return self.slots
        mine = priority == "completion"
        return [s for s in self.slots if (s.index in self.completion) == mine]

    def idle(self, priority: Priority) -> int:
        return sum(not s.busy for s in self.slot_class(priority))

    def best_idle(self, prompt: Sequence[int], priority: Priority = "chat",
                  steering_key: str = "") -> Slot | None:  # fmt: skip
        idle = [s for s in self.slot_class(priority) if not s.busy]
        if not idle:
            return None
        shared = [
            (common_prefix(s.tokens, prompt) if s.session.steering_key == steering_key else 0, s)
            for s in idle
        ]
        best_len, best = max(shared, key=lambda p: p[0])
        # Every prompt of a chat template shares its fixed preamble with every slot, so a
        # short shared head would send unrelated conversations onto one slot, destroying
        # each other's state while other slots sit idle. Reuse a slot only when the match
        # keeps at least half of what it holds; else take the least recently used one.
        if best_len > 0 and 2 * best_len >= len(best.tokens):
            return best
        # An editor's completion whose context chunks are another's (a chunk arrived:
        # the file after them is read again anyway) goes on from them: the FIM markers
        # every completion shares are far fewer tokens than a chunk of a file.
        if priority == "completion" and best_len >= COMPLETION_SHARED_TOKENS:
            return best
        return min(idle, key=lambda s: s.last_used)

    def take(self, prompt: Sequence[int], priority: Priority = "chat",
             steering_key: str = "") -> Slot | None:  # fmt: skip
        """The idle slot for this prompt run under the steering of `steering_key` ('':
        none), now busy; None when its class has none idle."""
        slot = self.best_idle(prompt, priority, steering_key)
        if slot is not None:
            slot.busy = True
            slot.requests += 1
        return slot

    def release(self, slot: Slot) -> None:
        slot.last_used = time.monotonic()
        slot.busy = False
