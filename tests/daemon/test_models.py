"""The model registry: names, load on first use, keep_alive, LRU unload under a memory
budget, pins by role, no unload under a request, a request waiting out an unload. The
loaded "models" here are plain records of their size (the registry only asks a loaded
model its memory and to unload); the real thing runs in tests/e2e/test_e2e_models.py.
Time is trio's MockClock: no wall-clock sleeps."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
import trio.testing

from ds4d.chat.errors import Unavailable, UnknownModel
from ds4d.daemon.config import Config, ConfigError
from ds4d.daemon.models import ModelRegistry, ModelSpec, model_specs

MB = 1 << 20


@dataclass
class Loaded:
    name: str
    size: int
    events: list[str]
    unload_gate: trio.Event | None = None
    closed: bool = field(default=False)

    def memory_bytes(self) -> int:
        return self.size

    async def unload(self) -> None:
        if self.unload_gate is not None:
            await self.unload_gate.wait()
        self.closed = True
        self.events.append(f"unload {self.name}")


def registry(
    sizes: dict[str, int],
    budget: int,
    keep_alive_s: float = -1.0,
    roles: dict[str, tuple] | None = None,
) -> tuple[ModelRegistry[Loaded], list[str]]:
    events: list[str] = []
    specs = [
        ModelSpec(n, Path(f"/m/{n}.gguf"), aliases=(f"{n}-alias",), roles=(roles or {}).get(n, ()))
        for n in sizes
    ]

    async def load(spec: ModelSpec) -> Loaded:
        events.append(f"load {spec.name}")
        await trio.sleep(1)  # virtual time
        return Loaded(spec.name, sizes[spec.name], events)

    reg = ModelRegistry(
        specs, load, budget_bytes=budget, keep_alive_s=keep_alive_s, size_of=lambda p: sizes[p.stem]
    )
    return reg, events


def run(fn, clock: trio.testing.MockClock | None = None) -> None:
    trio.run(fn, clock=clock or trio.testing.MockClock(autojump_threshold=0))


def test_names_aliases_placeholders_and_unknown_names() -> None:
    reg, _ = registry({"a": MB, "b": MB}, 10 * MB)
    assert reg.resolve("b").name == "b"
    assert reg.resolve("b-alias").name == "b"
    assert reg.resolve("b:latest").name == "b"
    assert reg.resolve("").name == "a" and reg.resolve("default").name == "a"
    with pytest.raises(UnknownModel) as e:
        reg.resolve("gpt-4o")
    assert "gpt-4o" in e.value.message and "a, b" in e.value.message
    single, _ = registry({"only": MB}, 10 * MB)
    assert single.resolve("gpt-4o").name == "only"  # one model: any name is an alias


def test_loads_on_first_use_once_even_when_asked_twice_at_once() -> None:
    reg, events = registry({"a": MB, "b": MB}, 10 * MB)

    async def main() -> None:
        leases = []

        async def use() -> None:
            leases.append(await reg.acquire("b"))

        async with trio.open_nursery() as n:
            n.start_soon(use)
            n.start_soon(use)
        assert events == ["load b"] and leases[0].model is leases[1].model
        assert reg.entry("b").users == 2 and reg.loads["b"] == 1

    run(main)


def test_lru_idle_model_is_unloaded_to_fit_the_budget() -> None:
    reg, events = registry({"a": 4 * MB, "b": 4 * MB, "c": 4 * MB}, 9 * MB)

    async def main() -> None:
        for name in ("a", "b"):
            (await reg.acquire(name)).release()
            await trio.sleep(1)  # virtual time
        (await reg.acquire("a")).release()  # a is now more recent than b
        (await reg.acquire("c")).release()
        assert events == ["load a", "load b", "unload b", "load c"]
        assert reg.unloads[("b", "budget")] == 1
        assert reg.resident("b") is None and reg.resident("a") and reg.resident("c")

    run(main)


def test_a_model_in_use_or_pinned_is_never_unloaded_for_room() -> None:
    reg, events = registry(
        {"chat": 4 * MB, "fim": 4 * MB, "other": 4 * MB}, 9 * MB, roles={"chat": ("chat",)}
    )

    async def main() -> None:
        (await reg.acquire("chat")).release()
        held = await reg.acquire("fim")
        (await reg.acquire("other")).release()  # over budget: everything else busy/pinned
        assert "unload chat" not in events and "unload fim" not in events
        assert reg.memory_bytes() == 12 * MB
        held.release()
        (await reg.acquire("fim")).release()
        assert reg.resident("chat") is not None  # the pinned one stays through it all

    run(main)


def test_keep_alive_unloads_an_idle_model_when_it_expires() -> None:
    reg, events = registry({"a": MB, "b": MB}, 10 * MB, keep_alive_s=300)

    async def main() -> None:
        async with trio.open_nursery() as n:
            await n.start(reg.run)
            lease = await reg.acquire("b")
            await trio.sleep(1000)  # virtual time
            assert reg.resident("b") is not None
            lease.release(keep_alive_s=60)  # the request's own keep_alive wins
            await trio.sleep(59)  # virtual time
            assert reg.resident("b") is not None
            await trio.sleep(2)  # virtual time
            assert reg.resident("b") is None and reg.unloads[("b", "keep_alive")] == 1
            (await reg.acquire("b")).release(keep_alive_s=-1)  # negative: forever
            await trio.sleep(10**6)  # virtual time
            assert reg.resident("b") is not None
            (await reg.acquire("b")).release(keep_alive_s=0)  # zero: at once
            await trio.sleep(0.001)  # virtual time
            assert reg.resident("b") is None
            n.cancel_scope.cancel()
        assert events.count("load b") == 2

    run(main)


def test_a_request_during_an_unload_waits_then_reloads() -> None:
    reg, events = registry({"a": MB, "b": MB}, 10 * MB)

    async def main() -> None:
        (await reg.acquire("b")).release()
        model = reg.resident("b")
        assert model is not None
        model.unload_gate = trio.Event()
        async with trio.open_nursery() as n:
            n.start_soon(reg.unload, "b")
            await trio.sleep(0.1)  # virtual time
            assert reg.entry("b").state == "unloading"
            got: list[Loaded] = []

            async def request() -> None:
                got.append((await reg.acquire("b")).model)

            n.start_soon(request)
            await trio.sleep(5)  # virtual time
            assert not got  # waits for the unload, never gets the model going away
            model.unload_gate.set()
        assert got and got[0] is not model and model.closed
        assert events == ["load b", "unload b", "load b"]

    run(main)


def test_unload_of_a_busy_model_waits_for_its_request() -> None:
    reg, events = registry({"a": MB}, 10 * MB)

    async def main() -> None:
        async with trio.open_nursery() as n:
            await n.start(reg.run)
            lease = await reg.acquire("a")
            assert await reg.unload("a") is True
            await trio.sleep(10)  # virtual time
            assert reg.resident("a") is not None  # still serving its request
            lease.release()
            await trio.sleep(0.001)  # virtual time
            assert reg.resident("a") is None
            n.cancel_scope.cancel()

    run(main)


def test_a_failed_load_is_unavailable_and_the_next_request_tries_again() -> None:
    attempts: list[int] = []

    async def load(spec: ModelSpec) -> Loaded:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("disk on fire")
        return Loaded(spec.name, MB, [])

    reg = ModelRegistry([ModelSpec("a", Path("/m/a.gguf"))], load, budget_bytes=MB * 10,
                        size_of=lambda p: MB)  # fmt: skip

    async def main() -> None:
        with pytest.raises(Unavailable) as e:
            await reg.acquire("a")
        assert "disk on fire" not in e.value.message  # details go to the log only
        assert reg.entry("a").failure == "disk on fire"
        (await reg.acquire("a")).release()
        assert reg.resident("a") is not None

    run(main)


def test_model_specs_from_the_config(tmp_path: Path) -> None:
    for name in ("b", "c"):
        (tmp_path / f"{name}.gguf").write_bytes(b"")
    cfg = Config(
        model=str(tmp_path / "a.gguf"),
        models=[f"coder={tmp_path / 'x.gguf'}"],
        models_dir=str(tmp_path),
        model_aliases=["qwen:7b=coder"],
        model_roles=["completion=coder", "chat=a"],
        preload=["c"],
    )
    specs = {s.name: s for s in model_specs(cfg)}
    assert list(specs) == ["a", "coder", "b", "c"]
    assert specs["coder"].aliases == ("qwen:7b",) and specs["coder"].roles == ("completion",)
    assert specs["a"].preload and specs["c"].preload and not specs["b"].preload
    assert specs["a"].pinned and not specs["b"].pinned
    for bad in (
        {"model_roles": ["editor=a"]},
        {"model_roles": ["chat=nope"]},
        {"model_aliases": ["x"]},
        {"preload": ["nope"]},
        {"models_dir": str(tmp_path / "missing")},
    ):
        with pytest.raises(ConfigError):
            model_specs(Config(model=str(tmp_path / "a.gguf"), **bad))


def test_budget_counts_what_the_loaded_models_hold() -> None:
    reg, _ = registry({"a": 3 * MB, "b": 5 * MB}, 100 * MB)

    async def main() -> None:
        (await reg.acquire("a")).release()
        (await reg.acquire("b")).release()
        assert reg.memory_bytes() == 8 * MB
        assert all(math.isinf(e.expires_at) for e in reg.entries())  # keep_alive -1

    run(main)
