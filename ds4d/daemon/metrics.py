"""Prometheus text exposition of the daemon's counters (no client library needed for a
handful of series).

The daemon builds `Metrics` with everything it reports: its gauges (read at scrape time)
and the other parts' series (`MetricsSource`: the state layer's disk cache and tool
memory). Nothing is added to it later.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ds4d.state.trace import GenerationRecord

TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# Inline completions are worth something only within a keystroke or two.
COMPLETION_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out, acc = [], 0
        for bound, n in zip(self.buckets, self.counts, strict=False):
            acc += n
            out.append(f'{name}_bucket{{le="{bound:g}"}} {acc}')
        out.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        out.append(f"{name}_sum {self.sum:.6f}")
        out.append(f"{name}_count {self.count}")
        return out


class MetricsSource(Protocol):
    """A part with series of its own (ds4d.state.service.StateService)."""

    def metrics_lines(self) -> list[str]:
        """Exposition lines, HELP and TYPE included (blocking: it may read the disk)."""
        ...


GaugeValue = int | float | dict[str, int | float]  # a dict: one sample per label set


@dataclass(frozen=True)
class Gauge:
    name: str
    help_text: str
    read: Callable[[], GaugeValue]


class Metrics:
    """Counters updated by the engine loop and the routes (all on the trio loop,
    so no locking); gauges and sources are read at scrape time. `render` reads the
    sources, which may touch the disk: run it on a worker thread."""

    def __init__(self, gauges: Sequence[Gauge] = (), sources: Sequence[MetricsSource] = ()) -> None:
        self.requests: dict[tuple[str, str], int] = defaultdict(int)  # (api, status)
        self.prompt_tokens = 0
        self.cached_tokens: dict[str, int] = defaultdict(int)  # by cache source
        self.generated_tokens = 0
        self.drafted_tokens = 0  # speculative decoding: tokens drafted and verified
        self.accepted_tokens = 0
        self.prefilled_tokens = 0
        self.prefill_seconds = 0.0
        self.decode_seconds = 0.0
        self.finished: dict[str, int] = defaultdict(int)  # finish reason
        self.rejected: dict[str, int] = defaultdict(int)  # reason
        self.ttft = Histogram(TTFT_BUCKETS)
        self.gauges = tuple(gauges)
        self.sources = tuple(sources)
        # Batched decode: engine calls that advanced generating slots, and the slots they
        # advanced in all (their ratio is the mean batch size).
        self.decode_steps = 0
        self.decode_step_slots = 0
        self.prefill_chunks = 0  # prefill engine calls (chunks are sized by engine time)
        # Editors' inline completions (priority "completion"): served or cancelled
        # (superseded by a newer keystroke, or the client gone), and their TTFT.
        self.completions: dict[str, int] = defaultdict(int)
        self.completion_ttft = Histogram(COMPLETION_TTFT_BUCKETS)

    def account(self, record: GenerationRecord) -> None:
        """A request that had a slot, as its generation record says (completed, cut by
        the limit, failed or cancelled at any point)."""
        self.prompt_tokens += record.prompt_tokens
        if record.cached_tokens:
            self.cached_tokens[record.cache_source] += record.cached_tokens
        self.prefilled_tokens += record.prefilled_tokens
        self.generated_tokens += record.generated_tokens
        self.drafted_tokens += record.drafted_tokens
        self.accepted_tokens += record.accepted_tokens
        self.prefill_seconds += record.prefill_s
        self.decode_seconds += record.decode_s
        self.finished[record.finish] += 1

    def count_completion(self, record: GenerationRecord, *, cancelled: bool) -> None:
        """An inline completion is over (`account` has its tokens already)."""
        cancelled = cancelled or record.finish == "cancelled"
        self.completions["cancelled" if cancelled else "served"] += 1
        if record.ttft_s is not None:
            self.completion_ttft.observe(record.ttft_s)

    def count_decode_batch(self, size: int) -> None:
        self.decode_steps += 1
        self.decode_step_slots += size

    def count_prefill_chunk(self) -> None:
        self.prefill_chunks += 1

    def observe_ttft(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def count_rejected(self, reason: str) -> None:
        self.rejected[reason] += 1

    def decode_batching(self) -> dict[str, int | float | None]:
        """What `ds4ctl status` shows of batched decode."""
        steps, slots = self.decode_steps, self.decode_step_slots
        return {
            "steps": steps,
            "slot_steps": slots,
            "mean_batch": round(slots / steps, 2) if steps else None,
        }

    def render(self) -> str:
        """The whole exposition (blocking: see source_lines)."""
        return "\n".join(self.own_lines() + self.source_lines()) + "\n"

    def source_lines(self) -> list[str]:
        """The sources' series (blocking: they read the disk cache's directory)."""
        lines: list[str] = []
        for source in self.sources:
            lines += source.metrics_lines()
        return lines

    def own_lines(self) -> list[str]:
        """The daemon's counters and gauges (quick: read on the event loop, where they
        change)."""
        lines: list[str] = []

        def family(name: str, kind: str, help_text: str) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")

        for gauge in self.gauges:
            name, value = gauge.name, gauge.read()
            family(name, "gauge", gauge.help_text)
            if isinstance(value, dict):
                lines += [f"{name}{{{k}}} {v}" for k, v in value.items()]
            else:
                lines.append(f"{name} {value}")
        family("ds4d_requests_total", "counter", "HTTP generation requests by API and status")
        for (api, status), n in sorted(self.requests.items()):
            lines.append(f'ds4d_requests_total{{api="{api}",status="{status}"}} {n}')
        family("ds4d_requests_rejected_total", "counter", "requests refused before running")
        for reason, n in sorted(self.rejected.items()):
            lines.append(f'ds4d_requests_rejected_total{{reason="{reason}"}} {n}')
        family(
            "ds4d_requests_finished_total", "counter", "requests that had a slot, by how they ended"
        )
        for reason in sorted(
            {"stop", "length", "tool_calls", "error", "cancelled", *self.finished}
        ):
            lines.append(
                f'ds4d_requests_finished_total{{finish_reason="{reason}"}} {self.finished[reason]}'
            )
        family("ds4d_prompt_tokens_total", "counter", "prompt tokens of requests that had a slot")
        lines.append(f"ds4d_prompt_tokens_total {self.prompt_tokens}")
        family(
            "ds4d_prefilled_tokens_total",
            "counter",
            "prompt tokens evaluated (not reused), cancelled prefills included",
        )
        lines.append(f"ds4d_prefilled_tokens_total {self.prefilled_tokens}")
        family(
            "ds4d_cached_prompt_tokens_total",
            "counter",
            "prompt tokens reused instead of prefilled, by where they came from",
        )
        for source in ("memory-token", "memory-text", "disk-text"):
            lines.append(
                f'ds4d_cached_prompt_tokens_total{{source="{source}"}} {self.cached_tokens[source]}'
            )
        family("ds4d_generated_tokens_total", "counter", "tokens generated")
        lines.append(f"ds4d_generated_tokens_total {self.generated_tokens}")
        family("ds4d_speculative_drafted_tokens_total", "counter",
               "tokens drafted by speculative decoding and verified")  # fmt: skip
        lines.append(f"ds4d_speculative_drafted_tokens_total {self.drafted_tokens}")
        family("ds4d_speculative_accepted_tokens_total", "counter",
               "drafted tokens the model's own sampling kept")  # fmt: skip
        lines.append(f"ds4d_speculative_accepted_tokens_total {self.accepted_tokens}")
        family("ds4d_prefill_seconds_total", "counter", "time spent prefilling prompts")
        lines.append(f"ds4d_prefill_seconds_total {self.prefill_seconds:.6f}")
        family("ds4d_decode_seconds_total", "counter", "time spent generating tokens")
        lines.append(f"ds4d_decode_seconds_total {self.decode_seconds:.6f}")
        family(
            "ds4d_time_to_first_token_seconds",
            "histogram",
            "from request arrival to the first generated token",
        )
        lines += self.ttft.lines("ds4d_time_to_first_token_seconds")
        family(
            "ds4d_decode_steps_total",
            "counter",
            "decode engine calls, each advancing every generating slot by its step",
        )
        lines.append(f"ds4d_decode_steps_total {self.decode_steps}")
        family(
            "ds4d_decode_step_slots_total",
            "counter",
            "slots advanced by decode engine calls (/ steps = mean batch size)",
        )
        lines.append(f"ds4d_decode_step_slots_total {self.decode_step_slots}")
        family(
            "ds4d_prefill_chunks_total",
            "counter",
            "prefill engine calls (each one chunk of a prompt; others wait for it)",
        )
        lines.append(f"ds4d_prefill_chunks_total {self.prefill_chunks}")
        family(
            "ds4d_completions_total",
            "counter",
            "inline code completions (/infill, suffix) by outcome: served, or cancelled "
            "(superseded by a newer one, or the client gone)",
        )
        for outcome in ("served", "cancelled"):
            lines.append(
                f'ds4d_completions_total{{outcome="{outcome}"}} {self.completions[outcome]}'
            )
        family(
            "ds4d_completion_time_to_first_token_seconds",
            "histogram",
            "inline completions: from request arrival to the first generated token",
        )
        lines += self.completion_ttft.lines("ds4d_completion_time_to_first_token_seconds")
        return lines
