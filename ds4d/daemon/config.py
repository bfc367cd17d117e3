"""The daemon's configuration: every key, its default, where a value may come from.

Precedence, lowest first: built-in default < TOML config file < overrides file (written by
`ds4ctl config set`) < `DS4D_<KEY>` environment variables < command line. The config file
is `--config PATH` (or `DS4D_CONFIG`), else `$XDG_CONFIG_HOME/ds4d/ds4d.toml`, else
`/etc/ds4d/ds4d.toml`; a missing default file is simply skipped.

`Config` is immutable; a reload builds a new one (see `ds4d.daemon.reload`). Keys marked
reloadable take effect in the running daemon; any other changed key needs a restart.
Every key is documented with its default in `ds4d/daemon/ds4d.toml` (a test keeps the two in step).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ds4d.daemon.exitcodes import CliError

if TYPE_CHECKING:  # opened where used: a config read loads no native library
    from ds4d.engine import Engine

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

ENV_PREFIX = "DS4D_"
LOG_LEVELS = ("debug", "info", "warning", "error")
# The engine's KV element types (ds4d.engine.decoder.KV_TYPES; a test keeps them in step),
# named here so parsing a command line does not load the native library.
KV_TYPES = ("f32", "f16", "q8_0")
# "auto": the family's choice (ds4d.engine.engine.FAMILY_KV_TYPE), f16 for most.
KV_CHOICES = ("auto", *KV_TYPES)
# Where the weights live (ds4d.engine.weight_memory.WEIGHT_MODES; a test keeps them in step).
WEIGHT_MODES = ("auto", "mmap", "huge")
# Speculative decoding (ds4d.serving.speculation.MODES; a test keeps them in step).
SPECULATIVE_MODES = ("off", "lookup", "draft")
# Matmul precisions (ds4d.engine.engine.PRECISIONS; a test keeps them in step).
PRECISIONS = ("exact", "int2", "int3")


class ConfigError(Exception):
    """A bad configuration value or file; the message is one line naming key and source."""


def _key(
    default: Any,
    doc: str,
    *,
    flags: tuple[str, ...] = (),
    reloadable: bool = False,
    lo: float | None = None,
    hi: float | None = None,
    choices: tuple[str, ...] = (),
    metavar: str | None = None,
    fitted: str | None = None,
) -> Any:
    """A Config field with its documentation and validation rules in the metadata.
    `fitted`: how the value is chosen when left at its default (the kv-cache knobs are
    fitted to the context), shown by --help instead of the placeholder default."""
    meta = {
        "fitted": fitted,
        "doc": doc,
        "flags": flags,
        "reloadable": reloadable,
        "lo": lo,
        "hi": hi,
        "choices": choices,
        "metavar": metavar,
    }
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Config:
    # --- model and engine -------------------------------------------------------------
    model: str = _key(
        "",
        "GGUF model file; empty = the embedded SmolLM2-135M-Instruct Q4_1",
        flags=("-m", "--model"),
        metavar="FILE",
    )
    models: list[str] = _key(
        [],
        "more models served beside --model, each a GGUF file as [NAME=]FILE (the name "
        "defaults to the file's stem); a request's `model` picks one",
        flags=("--add-model",),
        metavar="[NAME=]FILE",
    )
    models_dir: str = _key(
        "",
        "serve every GGUF in this directory too, each named by its file stem",
        metavar="DIR",
    )
    model_aliases: list[str] = _key(
        [], "other names a model answers to, as ALIAS=NAME", metavar="ALIAS=NAME"
    )
    model_roles: list[str] = _key(
        [],
        "pin a model resident in a role, as ROLE=NAME (completion, chat or embedding): "
        "loaded at start, never unloaded by keep_alive or the memory budget",
        metavar="ROLE=NAME",
    )
    preload: list[str] = _key(
        [], "models loaded at start besides the first (which always is)", metavar="NAME"
    )
    keep_alive: float = _key(
        -1.0,
        "seconds an idle model stays loaded after its last request (a request's own "
        "keep_alive wins); negative = until the memory budget needs the room",
        metavar="S",
    )
    memory_budget_mb: int = _key(
        0,
        "memory the loaded models may hold together in MiB (weights as mapped, KV "
        "slots, checkpoints waiting to be written); past it idle models are unloaded, "
        "least recently used first; 0 = three quarters of the RAM",
        flags=("--memory-budget",),
        lo=0,
        metavar="MIB",
    )
    ctx: int = _key(
        0,
        "context size of each slot in tokens; 0 = the model's trained context",
        flags=("-c", "--ctx"),
        lo=0,
        metavar="N",
    )
    rope_scaling: str = _key(
        "",
        "run past the model's trained context: stretch its RoPE positions to --ctx "
        "with `yarn` or `linear` (llama.cpp's --rope-scaling), for a file that declares "
        "no scaling of its own; empty = as the file says",
        choices=("", "yarn", "linear"),
        metavar="yarn|linear",
    )
    pooling: str = _key(
        "",
        "how /v1/embeddings and /api/embed pool a sequence into one vector: mean, cls or "
        "last; empty = the GGUF's pooling_type (an embedding model's), and a generation "
        "model without one is refused on the embedding routes",
        choices=("", "mean", "cls", "last"),
        metavar="mean|cls|last",
    )
    slots: int = _key(2, "resident KV slots (concurrent sessions)", lo=1, hi=64, metavar="N")
    completion_slots: int = _key(
        0,
        "of the slots, how many only completion-priority requests (editors' inline "
        "completions) use; they then never evict a chat slot's KV, nor chat theirs. "
        "0 = every request uses every slot",
        lo=0,
        hi=63,
        metavar="N",
    )
    completion_states_mb: int = _key(
        256,
        "memory (MB) each slot keeps for recent completion states, so a state an editor "
        "returns to (a backspace, an undo, the cursor moving back) is never evaluated "
        "again; 0 = keep none",
        lo=0,
        hi=1 << 20,
        metavar="MB",
    )
    speculative: str = _key(
        "off",
        "speculative decoding: lookup drafts the tokens that followed the last few "
        "generated ones where they occurred before (the prompt, the output) and verifies "
        "them in one pass; greedy and seeded outputs stay token for token the same. draft: "
        "the draft model (--draft-model) proposes them; greedy outputs stay the same, "
        "sampled ones the same in distribution. off: "
        'one pass per token. A request opts out with "speculative": false',
        choices=SPECULATIVE_MODES,
        metavar="off|lookup|draft",
    )
    draft_model: str = _key(
        "",
        "GGUF file of a small model of the same vocabulary as the served models (checked "
        "at load), loaded beside each of them to draft tokens for --speculative draft",
        metavar="FILE",
    )
    threads: int = _key(
        0, "compute threads; 0 = one per core", flags=("-t", "--threads"), lo=0, metavar="N"
    )
    kv_type: str = _key(
        "auto",
        "KV cache precision, resident and on disk: f32 (exact), f16 (half of f32) or "
        "q8_0 (34/128 of f32; head dimension a multiple of 32); auto is f16, or f32 for the "
        "families where f16 costs more accuracy (gpt-oss, phi3, qwen3moe); DeepSeek V4 keeps "
        "its own KV format and ignores it",
        choices=KV_CHOICES,
    )
    precision: str = _key(
        "exact",
        "matmul precision: exact (float32 activations), int2 or int3 (activations quantized "
        "to ~15 or ~22 bits under one power-of-two scale per 32 values, per 256 for the "
        "K-quants, for integer dot products; Q4_0, Q4_1, Q8_0, Q4_K and Q6_K weights, others "
        "stay exact)",
        choices=PRECISIONS,
    )
    weights: str = _key(
        "auto",
        "where the weights live while the model runs: mmap (the file's page-cache "
        "mapping, 4 KB pages, no extra memory), huge (read at load into this process's memory "
        "on 2 MB huge pages: decode streams them faster, at the file's size in RSS) or auto "
        "(huge for a model of at most a quarter of the RAM, else mmap)",
        choices=WEIGHT_MODES,
    )
    control_vectors: list[str] = _key(
        [],
        "directional steering: llama.cpp control-vector GGUF files (direction.N tensors), "
        "each FILE (scale 1) or FILE:SCALE, summed (see docs/steering.md)",
        flags=("--control-vector", "--control-vector-scaled"),
        metavar="FILE[:SCALE]",
    )
    control_vector_layer_range: str = _key(
        "",
        "layers the control vectors apply to, START:END inclusive; empty = 1:n_layer",
        metavar="START:END",
    )
    directional_steering_attn: float = _key(
        0.0,
        "scale of the control vectors added after each layer's attention output",
        metavar="F",
    )
    directional_steering_ffn: float = _key(
        1.0,
        "scale of the control vectors added after each layer's FFN output (the layer's "
        "output, as llama.cpp applies them)",
        metavar="F",
    )
    steering_vectors: list[str] = _key(
        [],
        "control vectors a request may choose by name with its `steering` field, each "
        "NAME=FILE[:SCALE] (a name given twice sums its files); read when a model loads "
        "(see docs/steering.md)",
        flags=("--steering-vector",),
        metavar="NAME=FILE[:SCALE]",
    )

    # --- HTTP --------------------------------------------------------------------------
    host: str = _key("127.0.0.1", "address the HTTP server binds", metavar="HOST")
    port: int = _key(8000, "HTTP port (0 = any free port)", lo=0, hi=65535, metavar="N")
    api_keys: list[str] = _key(
        [],
        "accepted API keys (Bearer or x-api-key); empty = no authentication",
        flags=("--api-key",),
        reloadable=True,
        metavar="KEY",
    )
    queue_size: int = _key(
        16, "requests that may wait for a slot; beyond it 503 + Retry-After", lo=0, metavar="N"
    )
    max_body_bytes: int = _key(
        64 * 1024 * 1024, "largest accepted request body in bytes", lo=1024, metavar="N"
    )
    prefill_chunk_ms: float = _key(
        250.0,
        "engine time of one prefill chunk in milliseconds (32 to 256 tokens): about "
        "the longest a new request or a generating slot waits for another slot's prefill; "
        "longer chunks prefill a few per cent faster (MoE models: more)",
        lo=10.0,
        hi=60000.0,
        metavar="MS",
    )
    keepalive_s: float = _key(
        5.0,
        "longest silence of a stream in seconds: a keepalive (an empty Anthropic "
        "thinking delta, Responses' `response.in_progress` again, an SSE comment on chat "
        "streams) is sent when nothing else is",
        reloadable=True,
        lo=0.05,
        hi=3600.0,
        metavar="S",
    )

    # --- sampling defaults (when a request does not say) --------------------------------
    temperature: float = _key(
        1.0,
        "default sampling temperature (0 = greedy)",
        reloadable=True,
        lo=0.0,
        hi=100.0,
        metavar="F",
    )
    top_p: float = _key(1.0, "default nucleus mass", reloadable=True, lo=0.0, hi=1.0, metavar="F")
    top_k: int = _key(0, "default top-k (0 = off)", reloadable=True, lo=0, metavar="N")
    min_p: float = _key(
        0.05,
        "default min-p relative to the best token",
        reloadable=True,
        lo=0.0,
        hi=1.0,
        metavar="F",
    )
    max_tokens: int = _key(
        4096,
        "output token limit of a request that sets none (Codex sends none); "
        "0 = until the context is full",
        flags=("-n", "--max-tokens"),
        reloadable=True,
        lo=0,
        metavar="N",
    )

    force_tool_choice: str = _key(
        "",
        "testing aid, off when empty: a request that declares tools, leaves "
        "tool_choice at auto and whose conversation holds no tool call yet gets "
        "tool_choice `required` or the named tool, so even a small model calls a tool "
        "and a client's tool round trip can be exercised",
        reloadable=True,
        metavar="required|NAME",
    )
    infill_order: str = _key(
        "psm",
        "fill-in-the-middle order (/infill, suffix): psm (prefix, suffix, middle: what "
        "most code models are trained with) or spm (suffix first, llama-server's "
        "--spm-infill, for models trained that way: typing then keeps the suffix's KV)",
        reloadable=True,
        choices=("psm", "spm"),
    )

    # --- prompt handling ---------------------------------------------------------------
    normalize_claude_billing_header: bool = _key(
        True,
        "strip the per-request `x-anthropic-billing-header: ... cch=...;` line Claude "
        "Code puts in its system prompt, so the prefix stays reusable",
        reloadable=True,
    )
    tool_replay: bool = _key(
        True, "render tool calls in history with the exact text the model sampled"
    )
    tool_memory_max_ids: int = _key(
        100000, "tool-call ids remembered for exact replay", lo=1, metavar="N"
    )

    # --- disk KV cache -----------------------------------------------------------------
    kv_disk: bool = _key(True, "keep KV checkpoints on disk, across restarts")
    kv_disk_dir: str = _key(
        "",
        "KV checkpoint directory; empty = $CACHE_DIRECTORY/kv or $XDG_CACHE_HOME/ds4d/kv",
        metavar="DIR",
    )
    kv_disk_space_mb: int = _key(
        8192, "disk budget of the KV cache in MiB", reloadable=True, lo=1, metavar="N"
    )
    kv_disk_write_budget: int = _key(
        20480,
        "KV checkpoint MiB written per 24 h (SSD wear); past it only checkpoints a "
        "later request is likely to reuse (continued sessions, prefixes already hit) are "
        "written; 0 = unlimited",
        lo=0,
        metavar="MIB",
    )
    kv_cache_min_tokens: int = _key(
        512,
        "no checkpoint is saved or loaded with fewer tokens",
        lo=1,
        metavar="N",
        fitted="fitted to --ctx: ctx/16, from 16 up to 512",
    )
    kv_cache_cold_max_tokens: int = _key(
        30000,
        "cold saves only for prompts up to this many tokens (0 = no cold saves)",
        lo=0,
        metavar="N",
        fitted="fitted to --ctx: the context size, at most 30000",
    )
    kv_cache_continued_interval_tokens: int = _key(
        4096,
        "spacing of `continued` checkpoints as a session grows (0 = none)",
        lo=0,
        metavar="N",
        fitted="fitted to --ctx: ctx/4 but at least the alignment, at most 10000",
    )
    kv_cache_boundary_trim_tokens: int = _key(
        32, "tokens trimmed off a cold prompt's tail before its checkpoint", lo=0, metavar="N"
    )
    kv_cache_boundary_align_tokens: int = _key(
        2048,
        "cold and continued checkpoints are aligned down to this multiple (0 = off)",
        lo=0,
        metavar="N",
        fitted="fitted to --ctx: 2048, halved (not below 64) until 32 multiples fit",
    )

    # --- throttling, tracing, logging ----------------------------------------------------
    power: int = _key(
        100,
        "target share of compute time in percent (sleeps between work "
        "units; output is identical at every level)",
        reloadable=True,
        lo=1,
        hi=100,
        metavar="N",
    )
    trace: str = _key(
        "",
        "append one JSON line per request to this file; empty = off",
        reloadable=True,
        metavar="FILE",
    )
    trace_content: bool = _key(
        False, "also record the rendered prompt and the output in the trace", reloadable=True
    )
    log_level: str = _key("info", "log level", reloadable=True, choices=LOG_LEVELS, metavar="LEVEL")
    log_file: str = _key("", "log to this file instead of stderr", metavar="FILE")

    # --- service -------------------------------------------------------------------------
    admin_socket: str = _key(
        "",
        "admin Unix socket; empty = $RUNTIME_DIRECTORY/ds4d.sock or "
        "$XDG_RUNTIME_DIR/ds4d/ds4d.sock",
        metavar="PATH",
    )
    grace_period: float = _key(
        10.0,
        "seconds in-flight requests may run after SIGTERM before being cancelled",
        lo=0.0,
        metavar="SECONDS",
    )


def config_keys() -> tuple[dataclasses.Field[object], ...]:
    return dataclasses.fields(Config)


def _default(f: dataclasses.Field[object]) -> object:
    """A key's built-in value (a list key has a factory)."""
    if f.default is not dataclasses.MISSING:
        return f.default
    return typing.cast(Callable[[], object], f.default_factory)()


def _key_types() -> dict[str, Any]:
    return typing.get_type_hints(Config)


KEY_NAMES: tuple[str, ...] = tuple(f.name for f in config_keys())
RELOADABLE: frozenset[str] = frozenset(f.name for f in config_keys() if f.metadata["reloadable"])


# --------------------------------------------------------------------------------------
# Command line


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `--config`, `--config-overrides` and one flag per key (ds4-style names).

    Every flag defaults to None so `load_config` can tell "not given" from a value."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="TOML config file (default: $XDG_CONFIG_HOME/ds4d/ds4d.toml, "
        "else /etc/ds4d/ds4d.toml)",
    )
    parser.add_argument(
        "--config-overrides",
        metavar="FILE",
        default=None,
        help="overrides file written by `ds4ctl config set` "
        "(default: $STATE_DIRECTORY/overrides.toml or "
        "$XDG_STATE_HOME/ds4d/overrides.toml)",
    )
    types = _key_types()
    for f in config_keys():
        meta = f.metadata
        flags = meta["flags"] or ("--" + f.name.replace("_", "-"),)
        default = _default(f)
        doc = meta["doc"].replace("%", "%%")
        help_text = f"{doc} (default: {meta['fitted'] or repr(default)})"
        kind = types[f.name]
        if kind is bool:
            parser.add_argument(
                *flags,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=help_text,
            )
        elif kind == list[str]:
            parser.add_argument(
                *flags,
                dest=f.name,
                action="append",
                default=None,
                metavar=meta["metavar"],
                help=help_text + "; repeatable",
            )
        else:
            parser.add_argument(
                *flags,
                dest=f.name,
                default=None,
                metavar=meta["metavar"],
                choices=meta["choices"] or None,
                help=help_text,
            )


def add_engine_flags(parser: argparse.ArgumentParser, *names: str) -> None:
    """Flags for the named choice keys (kv_type, weights) on a command that opens the
    engine without a config file (generate, bench): the key's own doc, choices and
    built-in value, so they read as `ds4d serve`'s do."""
    keys = {f.name: f for f in config_keys()}
    for name in names:
        f = keys[name]
        meta = f.metadata
        default = _default(f)
        parser.add_argument(
            *(meta["flags"] or ("--" + name.replace("_", "-"),)),
            dest=name,
            choices=meta["choices"],
            default=default,
            help=f"{meta['doc']} (default: {default})".replace("%", "%%"),
        )


def open_engine(args: argparse.Namespace, *names: str) -> Engine:
    """Engine.open for a command with add_engine_flags' `names`: its --model (default: the
    embedded model), --threads and those flags' values; CliError with the engine's reason
    when the model cannot be opened."""
    from ds4d.engine import Engine, EngineError
    from ds4d.engine.default_model import resolve_model_path

    flags = {name: getattr(args, name) for name in names}
    try:
        return Engine.open(resolve_model_path(args.model), threads=args.threads, **flags)
    except (EngineError, FileNotFoundError) as e:
        raise CliError(str(e)) from None


# --------------------------------------------------------------------------------------
# Loading


@dataclass(frozen=True)
class Resolved:
    """A loaded config plus where each value came from and which files were read."""

    config: Config
    sources: dict[str, str]  # key -> "built-in" | "<file>" | "DS4D_X" | "--flag"
    config_file: Path | None  # the file read (or that would be read once created)
    overrides_file: Path


def load_config(
    args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> Config:
    """The effective Config for `args` (from add_serve_arguments) and the environment."""
    return resolve_config(args, environ).config


def resolve_config(
    args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> Resolved:
    env = os.environ if environ is None else environ
    ns = vars(args) if args is not None else {}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}

    config_file, must_exist = _config_file_path(ns.get("config"), env)
    if config_file is not None and (must_exist or config_file.is_file()):
        for key, raw in _read_toml(config_file).items():
            values[key] = _checked(key, raw, str(config_file), text=False)
            sources[key] = str(config_file)

    overrides_file = overrides_path(ns.get("config_overrides"), env)
    if overrides_file.is_file():
        for key, raw in _read_toml(overrides_file).items():
            values[key] = _checked(key, raw, str(overrides_file), text=False)
            sources[key] = str(overrides_file)

    for key in KEY_NAMES:
        name = ENV_PREFIX + key.upper()
        if name in env:
            values[key] = _checked(key, env[name], name)
            sources[key] = name

    for f in config_keys():
        raw = ns.get(f.name)
        if raw is not None:
            flag = (f.metadata["flags"] or ("--" + f.name.replace("_", "-"),))[-1]
            if raw is False:
                flag = "--no-" + flag[2:]
            values[f.name] = _checked(f.name, raw, flag)
            sources[f.name] = flag

    config = Config(**values)
    validate(config, sources)
    for key in KEY_NAMES:
        sources.setdefault(key, "built-in")
    return Resolved(config, sources, config_file, overrides_file)


def _config_file_path(cli: str | None, env: Mapping[str, str]) -> tuple[Path | None, bool]:
    """(path, whether it must exist). An explicitly named file must exist."""
    explicit = cli or env.get(ENV_PREFIX + "CONFIG")
    if explicit:
        return Path(explicit).expanduser(), True
    user = _xdg(env, "XDG_CONFIG_HOME", ".config") / "ds4d" / "ds4d.toml"
    system = Path("/etc/ds4d/ds4d.toml")
    if not user.is_file() and system.is_file():
        return system, False
    return user, False


def overrides_path(cli: str | None = None, environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    explicit = cli or env.get(ENV_PREFIX + "CONFIG_OVERRIDES")
    if explicit:
        return Path(explicit).expanduser()
    if env.get("STATE_DIRECTORY"):  # systemd StateDirectory= (first entry)
        return Path(env["STATE_DIRECTORY"].split(":")[0]) / "overrides.toml"
    return _xdg(env, "XDG_STATE_HOME", ".local/state") / "ds4d" / "overrides.toml"


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            data: dict[str, Any] = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    for key in data:
        if key not in KEY_NAMES:
            raise ConfigError(f"{path}: unknown key '{key}'")
    return data


def _xdg(env: Mapping[str, str], var: str, fallback: str) -> Path:
    value = env.get(var)
    if value and os.path.isabs(value):
        return Path(value)
    return Path(env.get("HOME") or Path.home()) / fallback


# --------------------------------------------------------------------------------------
# Types and validation

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_value(key: str, raw: Any, source: str = "command line") -> Any:
    """Convert `raw` (a TOML value, or a string from env/CLI/ds4ctl) to `key`'s type and
    check it; raises ConfigError naming key and source."""
    if key not in KEY_NAMES:
        raise ConfigError(f"unknown config key '{key}' ({source})")
    return _checked(key, raw, source)


def _checked(key: str, raw: Any, source: str, text: bool = True) -> Any:
    """Every source's value is checked on its own, so a bad value is reported even when
    a higher-precedence source masks it."""
    value = _coerce(key, raw, source, text)
    _check_range(key, value, source)
    return value


def _coerce(key: str, raw: Any, source: str, text: bool = True) -> Any:
    """`raw` as `key`'s type. Strings are parsed only when `text` (environment, command
    line, ds4ctl); a TOML file must use the right TOML type."""
    kind = _key_types()[key]

    def bad(expected: str) -> ConfigError:
        return ConfigError(f"{key}={raw!r} ({source}): expected {expected}")

    if kind is bool:
        if isinstance(raw, bool):
            return raw
        if text and isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
            return raw.strip().lower() in _TRUE
        raise bad("true or false")
    if kind is int:
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        if text and isinstance(raw, str):
            try:
                return int(raw.strip(), 10)
            except ValueError:
                pass
        raise bad("an integer")
    if kind is float:
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            return float(raw)
        if text and isinstance(raw, str):
            try:
                return float(raw.strip())
            except ValueError:
                pass
        raise bad("a number")
    if kind is str:
        if isinstance(raw, str):
            return raw
        raise bad("a string")
    if kind == list[str]:
        if text and isinstance(raw, str):  # env / ds4ctl: comma separated
            return [s.strip() for s in raw.split(",") if s.strip()]
        if isinstance(raw, list) and all(isinstance(s, str) for s in raw):
            return list(raw)
        raise bad("a list of strings")
    raise AssertionError(f"unhandled config type {kind!r}")  # pragma: no cover


def _check_range(key: str, value: Any, source: str) -> None:
    meta = next(f.metadata for f in config_keys() if f.name == key)
    lo, hi, choices = meta["lo"], meta["hi"], meta["choices"]
    where = f"{key}={value!r} ({source})"
    if lo is not None and hi is not None and not lo <= value <= hi:
        raise ConfigError(f"{where}: must be between {lo:g} and {hi:g}")
    if lo is not None and value < lo:
        raise ConfigError(f"{where}: must be at least {lo:g}")
    if hi is not None and value > hi:
        raise ConfigError(f"{where}: must be at most {hi:g}")
    if choices and value not in choices:
        raise ConfigError(f"{where}: must be one of {', '.join(choices)}")


def validate(config: Config, sources: Mapping[str, str] | None = None) -> None:
    """Check every key's range and the rules that tie keys together."""
    src = dict(sources or {})
    for key in KEY_NAMES:
        _check_range(key, getattr(config, key), src.get(key, "built-in"))
    if not config.host:
        raise ConfigError(f"host ({src.get('host', 'built-in')}): must not be empty")
    cold, low = config.kv_cache_cold_max_tokens, config.kv_cache_min_tokens
    if cold and cold < low:
        raise ConfigError(
            f"kv_cache_cold_max_tokens={cold} ({src.get('kv_cache_cold_max_tokens', 'built-in')})"
            f": must be 0 or at least kv_cache_min_tokens ({low})"
        )
    if config.speculative == "draft" and not config.draft_model:
        raise ConfigError(
            f"speculative=draft ({src.get('speculative', 'built-in')}): needs draft_model, "
            "the GGUF file of the draft model"
        )
    if any(not k or k != k.strip() for k in config.api_keys):
        raise ConfigError(
            f"api_keys ({src.get('api_keys', 'built-in')}): "
            "keys must be non-empty with no surrounding spaces"
        )


# --------------------------------------------------------------------------------------
# Derived paths and helpers


def default_kv_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get("CACHE_DIRECTORY"):  # systemd CacheDirectory=
        return Path(env["CACHE_DIRECTORY"].split(":")[0]) / "kv"
    return _xdg(env, "XDG_CACHE_HOME", ".cache") / "ds4d" / "kv"


def kv_dir(config: Config, environ: Mapping[str, str] | None = None) -> Path:
    return Path(config.kv_disk_dir).expanduser() if config.kv_disk_dir else default_kv_dir(environ)


def model_path(config: Config) -> Path:
    """The GGUF to load: `model`, else the embedded default model."""
    if config.model:
        return Path(config.model).expanduser()
    from ds4d.engine.default_model import default_model_path

    return default_model_path()


def changed_keys(old: Config, new: Config) -> list[str]:
    return [k for k in KEY_NAMES if getattr(old, k) != getattr(new, k)]
