"""Several models in one daemon: names to files, loaded on first use (or at start), kept
while their keep_alive says, unloaded least-recently-used when a memory budget would be
exceeded, never while a request uses them.

    registry = ModelRegistry(specs, load, budget_bytes=..., keep_alive_s=300)
    nursery.start_soon(registry.run)          # expiry and background unloads
    lease = await registry.acquire("qwen3")   # loads it if needed; pins it
    ... lease.model ...                       # whatever `load` returned
    lease.release(keep_alive_s=None)          # None: the default; < 0 forever; 0 now

The registry does not know what a loaded model is: `load(spec)` returns any `Resident`
(the daemon's engine, slots and state for that model), which tells its memory and how to
unload itself. Loads run one at a time; a request for a model being unloaded waits for
the unload to finish and then loads it again.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, Literal, Protocol, TypeVar

import trio

from ds4d.chat.errors import Unavailable, UnknownModel
from ds4d.daemon.config import Config, ConfigError, model_path

log = logging.getLogger("ds4d")

Role = Literal["completion", "chat", "embedding"]
ROLES: tuple[Role, ...] = ("completion", "chat", "embedding")

# Names clients send when they have no model to choose (OpenAI SDK examples, editors'
# defaults): they mean the default model.
PLACEHOLDER_NAMES = frozenset({"", "default", "ds4d"})


@dataclass(frozen=True)
class ModelSpec:
    """A model the daemon can serve: its name, its file, other names it answers to, and
    the roles that keep it resident."""

    name: str
    path: Path
    aliases: tuple[str, ...] = ()
    roles: tuple[Role, ...] = ()
    preload: bool = False

    @property
    def pinned(self) -> bool:
        """A model with a role stays resident: neither the budget nor keep_alive unloads it."""
        return bool(self.roles)


class Resident(Protocol):
    """A loaded model as the registry sees it."""

    def memory_bytes(self) -> int:
        """What it holds now: weights as mapped, KV slots, checkpoints waiting to be written."""
        ...

    async def unload(self) -> None:
        """Release it (blocking work on a worker thread)."""
        ...


M = TypeVar("M", bound=Resident)

State = Literal["unloaded", "loading", "loaded", "unloading"]


@dataclass
class Entry(Generic[M]):
    spec: ModelSpec
    model: M | None = None
    users: int = 0
    last_used: float = 0.0
    expires_at: float = math.inf  # trio time; inf: stays
    loading: bool = False
    unloading: trio.Event | None = None  # set when the unload has finished
    load_s: float = 0.0
    failure: str | None = None  # why its last load failed
    unload_requested: bool = False  # unload once its requests end (keep_alive 0, admin)

    @property
    def state(self) -> State:
        if self.unloading is not None:
            return "unloading"
        if self.loading:
            return "loading"
        return "loaded" if self.model is not None else "unloaded"


@dataclass
class Lease(Generic[M]):
    """One request's hold on a loaded model: it cannot be unloaded until released."""

    registry: ModelRegistry[M]
    entry: Entry[M]
    model: M
    load_s: float = 0.0  # time this request waited for the model to load
    released: bool = field(default=False)

    @property
    def name(self) -> str:
        return self.entry.spec.name

    def release(self, keep_alive_s: float | None = None) -> None:
        if not self.released:
            self.released = True
            self.registry._release(self.entry, keep_alive_s)


class ModelRegistry(Generic[M]):
    def __init__(
        self,
        specs: list[ModelSpec],
        load: Callable[[ModelSpec], Awaitable[M]],
        *,
        budget_bytes: int,
        keep_alive_s: float = 300.0,
        size_of: Callable[[Path], int] | None = None,
    ) -> None:
        if not specs:
            raise ValueError("no models to serve")
        self.specs = list(specs)
        self._load_fn = load
        self.budget_bytes = budget_bytes
        self.keep_alive_s = keep_alive_s
        self._size_of = size_of or (lambda p: p.stat().st_size)
        self._entries = {s.name: Entry[M](s) for s in specs}
        self._names: dict[str, str] = {}
        for s in specs:
            for n in (s.name, *s.aliases):
                self._names.setdefault(n, s.name)
        self._loading = trio.Lock()  # one load at a time: each is memory- and disk-heavy
        self._changed = trio.Event()  # an expiry moved: the expiry task looks again
        self._nursery: trio.Nursery | None = None
        self.loads: Counter[str] = Counter()
        self.unloads: Counter[tuple[str, str]] = Counter()  # (model, reason)

    # -- names ---------------------------------------------------------------------------

    @property
    def default(self) -> ModelSpec:
        return self.specs[0]

    def resolve(self, name: str) -> ModelSpec:
        """The model a request's `model` names: a model's name or alias (an Ollama-style
        `:latest` tag is ignored), a placeholder for the default, or with a single model
        any name (as before there were several). Else UnknownModel naming the known ones."""
        key = self._names.get(name) or self._names.get(name.removesuffix(":latest"))
        if key is not None:
            return self._entries[key].spec
        if name in PLACEHOLDER_NAMES or len(self.specs) == 1:
            return self.default
        raise UnknownModel(name, [s.name for s in self.specs])

    def entry(self, name: str) -> Entry[M]:
        return self._entries[self.resolve(name).name]

    def entries(self) -> list[Entry[M]]:
        return [self._entries[s.name] for s in self.specs]

    def resident(self, name: str) -> M | None:
        return self.entry(name).model

    def memory_bytes(self) -> int:
        return sum(e.model.memory_bytes() for e in self._entries.values() if e.model is not None)

    # -- acquire / release -----------------------------------------------------------------

    async def acquire(self, name: str) -> Lease[M]:
        """The model named, loaded if it is not (waiting for its unload to finish first
        when one is under way), held for the caller until `release`."""
        entry = self.entry(name)
        waited = 0.0
        while True:
            if entry.unloading is not None:
                await entry.unloading.wait()
                continue
            if entry.model is not None:
                return self._lease(entry, waited)
            async with self._loading:
                if entry.model is None and entry.unloading is None:
                    t0 = trio.current_time()
                    await self._load(entry)
                    waited += trio.current_time() - t0
                if entry.model is not None and entry.unloading is None:
                    return self._lease(entry, waited)

    def _lease(self, entry: Entry[M], waited: float) -> Lease[M]:
        assert entry.model is not None
        entry.users += 1
        entry.last_used = trio.current_time()
        return Lease(self, entry, entry.model, waited)

    def _release(self, entry: Entry[M], keep_alive_s: float | None) -> None:
        entry.users -= 1
        now = trio.current_time()
        entry.last_used = now
        keep = self.keep_alive_s if keep_alive_s is None else keep_alive_s
        if entry.unload_requested:
            entry.expires_at = now
        elif entry.spec.pinned and keep_alive_s is None:
            entry.expires_at = math.inf
        else:
            entry.expires_at = math.inf if keep < 0 else now + keep
        self._changed.set()

    # -- loading and unloading -------------------------------------------------------------

    async def _load(self, entry: Entry[M]) -> None:
        spec = entry.spec
        log.info("loading model %s from %s", spec.name, spec.path)
        try:
            need = await trio.to_thread.run_sync(self._size_of, spec.path)
        except OSError as e:
            entry.failure = f"cannot read {spec.path}: {e.strerror or e}"
            log.error("model %s: %s", spec.name, entry.failure)
            raise Unavailable(
                f"the model {spec.name} cannot be loaded: its file is missing"
            ) from None
        await self._make_room(need, keep=entry)
        entry.loading = True
        t0 = trio.current_time()
        try:
            model = await self._load_fn(spec)
        except Exception as e:
            entry.failure = str(e)
            log.error("model %s failed to load: %s", spec.name, e)
            raise Unavailable(
                f"the model {spec.name} failed to load (details are in the server log)"
            ) from None
        finally:
            entry.loading = False
        entry.model = model
        entry.failure = None
        entry.load_s = trio.current_time() - t0
        entry.last_used = trio.current_time()
        entry.expires_at = math.inf  # set by the first release
        self.loads[spec.name] += 1
        log.info(
            "model %s loaded in %.1fs (%.0f MiB); %.0f of %.0f MiB in use",
            spec.name,
            entry.load_s,
            model.memory_bytes() / 2**20,
            self.memory_bytes() / 2**20,
            self.budget_bytes / 2**20,
        )
        await self._make_room(0, keep=entry)

    async def _make_room(self, need: int, keep: Entry[M]) -> None:
        """Unload idle models, least recently used first, until `need` more bytes fit the
        budget. Models in use and pinned ones stay; if that is not enough the load goes
        ahead over budget, with a warning (refusing would fail requests a moment later
        that the machine can serve)."""
        while self.memory_bytes() + need > self.budget_bytes:
            idle = [
                e
                for e in self._entries.values()
                if e is not keep and e.model is not None and e.users == 0 and not e.spec.pinned
                and e.unloading is None
            ]  # fmt: skip
            if not idle:
                log.warning(
                    "memory budget %.0f MiB exceeded (%.0f MiB in use, %.0f MiB more for %s): "
                    "every other model is in use or pinned by a role",
                    self.budget_bytes / 2**20,
                    self.memory_bytes() / 2**20,
                    need / 2**20,
                    keep.spec.name,
                )
                return
            victim = min(idle, key=lambda e: e.last_used)
            log.info(
                "unloading %s (least recently used) to make room for %s",
                victim.spec.name,
                keep.spec.name,
            )
            await self._unload(victim, "budget")

    async def _unload(self, entry: Entry[M], reason: str) -> None:
        """Detach the model at once (no new request gets it), then release it."""
        model = entry.model
        if model is None or entry.users or entry.unloading is not None:
            return
        entry.model = None
        entry.expires_at = math.inf
        entry.unload_requested = False
        done = entry.unloading = trio.Event()
        try:
            with trio.CancelScope(shield=True):  # half an unload would leak the model
                await model.unload()
        finally:
            entry.unloading = None
            done.set()
        self.unloads[(entry.spec.name, reason)] += 1
        log.info("model %s unloaded (%s)", entry.spec.name, reason)

    async def load(self, name: str) -> Entry[M]:
        """Load a model now (admin, preload) without holding it."""
        lease = await self.acquire(name)
        lease.release()
        return lease.entry

    async def unload(self, name: str, reason: str = "request") -> bool:
        """Unload a model as soon as no request holds it (keep_alive 0, admin). Returns
        whether it was loaded."""
        entry = self.entry(name)
        if entry.model is None:
            return False
        if entry.users:
            entry.unload_requested = True  # the expiry task unloads it once idle
            self._changed.set()
            return True
        await self._unload(entry, reason)
        return True

    # -- the background task -----------------------------------------------------------------

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Preload, then unload models whose keep_alive has passed, until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            for spec in self.specs:
                if spec.preload or spec.pinned:
                    nursery.start_soon(self._preload, spec.name)
            while True:
                self._changed = trio.Event()
                now = trio.current_time()
                due = [
                    e
                    for e in self._entries.values()
                    if e.model is not None and e.users == 0 and e.expires_at <= now
                ]
                for e in due:
                    nursery.start_soon(self._unload, e, "keep_alive")
                waiting = [
                    e.expires_at
                    for e in self._entries.values()
                    if e.model is not None and e.expires_at > now
                ]
                with trio.move_on_at(min(waiting, default=math.inf)):
                    await self._changed.wait()

    async def _preload(self, name: str) -> None:
        try:
            await self.load(name)
        except Exception as e:  # noqa: BLE001 - reported; a request will try again
            log.error("preloading %s failed: %s", name, e)


def _pairs(items: list[str], key: str, what: str) -> list[tuple[str, str]]:
    out = []
    for item in items:
        left, sep, right = item.partition("=")
        if not sep or not left.strip() or not right.strip():
            raise ConfigError(f"{key}: {item!r} must be {what}")
        out.append((left.strip(), right.strip()))
    return out


def model_specs(config: Config) -> list[ModelSpec]:
    """The models the config names (blocking: it lists `models_dir`): `model` first (the
    default), then `models`, then the GGUFs of `models_dir` by name; with their aliases,
    roles and preload flags. A name given twice, or an alias or role naming no model, is
    a ConfigError."""
    found: list[tuple[str, Path]] = [(model_path(config).stem, model_path(config))]
    for item in config.models:
        name, sep, file = item.partition("=")
        path = Path(file if sep else item).expanduser()
        found.append((name.strip() if sep else path.stem, path))
    if config.models_dir:
        directory = Path(config.models_dir).expanduser()
        if not directory.is_dir():
            raise ConfigError(f"models_dir: {directory} is not a directory")
        found += [(p.stem, p) for p in sorted(directory.glob("*.gguf"))]
    paths: dict[str, Path] = {}
    for name, path in found:
        if name in paths and paths[name] != path:
            raise ConfigError(f"models: two models are named {name!r} ({paths[name]}, {path})")
        paths.setdefault(name, path)
    aliases: dict[str, list[str]] = {n: [] for n in paths}
    for alias, name in _pairs(config.model_aliases, "model_aliases", "ALIAS=NAME"):
        if name not in paths:
            raise ConfigError(f"model_aliases: {alias}={name} names no model ({', '.join(paths)})")
        aliases[name].append(alias)
    roles: dict[str, list[Role]] = {n: [] for n in paths}
    for role, name in _pairs(config.model_roles, "model_roles", "ROLE=NAME"):
        if role not in ROLES:
            raise ConfigError(f"model_roles: {role!r} is not one of {', '.join(ROLES)}")
        if name not in paths:
            raise ConfigError(f"model_roles: {role}={name} names no model ({', '.join(paths)})")
        roles[name].append(role)  # checked against ROLES above
    for name in config.preload:
        if name not in paths:
            raise ConfigError(f"preload: {name!r} names no model ({', '.join(paths)})")
    first = next(iter(paths))
    return [
        ModelSpec(
            name,
            path,
            tuple(aliases[name]),
            tuple(roles[name]),
            preload=name == first or name in config.preload,
        )
        for name, path in paths.items()
    ]


def default_budget_bytes() -> int:
    """Three quarters of the machine's RAM."""
    import os

    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 16 << 30
    return total * 3 // 4
