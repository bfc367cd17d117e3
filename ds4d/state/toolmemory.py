"""Exact tool-call replay: tool-call id -> the exact text the model sampled for that call.

Clients send earlier tool calls back as JSON they have re-serialized (other key order,
other spacing). Rendering that JSON would change the prompt bytes and defeat prefix
reuse, so history rendering asks this map for the sampled text first. Bounded LRU;
entries travel in the tool-map section of disk KV files so replay survives restarts.
Thread-safe: the worker threads remember, the request handlers look up.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping

DEFAULT_MAX_IDS = 100_000


class ToolMemory:
    def __init__(self, max_ids: int = DEFAULT_MAX_IDS) -> None:
        if max_ids < 0:
            raise ValueError("max_ids must be >= 0")
        self.max_ids = max_ids
        self._map: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._map)

    def __contains__(self, call_id: object) -> bool:
        return call_id in self._map

    def remember(self, call_id: str, text: str) -> None:
        """Record (or refresh) the sampled text of one call; evicts the least recently used."""
        if self.max_ids == 0 or not call_id:
            return
        with self._lock:
            self._map[call_id] = text
            self._map.move_to_end(call_id)
            while len(self._map) > self.max_ids:
                self._map.popitem(last=False)

    def update(self, entries: Mapping[str, str]) -> None:
        """Merge entries (e.g. loaded from a KV file); existing ids keep their text."""
        for call_id, text in entries.items():
            if call_id not in self._map:
                self.remember(call_id, text)

    def get(self, call_id: str) -> str | None:
        """The sampled text for `call_id`, or None; a hit makes it most recently used."""
        with self._lock:
            text = self._map.get(call_id)
            if text is None:
                self.misses += 1
                return None
            self._map.move_to_end(call_id)
            self.hits += 1
            return text

    def select(self, call_ids: Iterable[str]) -> dict[str, str]:
        """The known subset of `call_ids` (no LRU touch) — what a KV file should carry."""
        with self._lock:
            return {i: self._map[i] for i in call_ids if i in self._map}

    def snapshot(self) -> dict[str, str]:
        with self._lock:
            return dict(self._map)
