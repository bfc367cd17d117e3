"""Shared test fixtures (the embedded model, the vendored test data) and the CI skip rule."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Everything the tests read lives in the repo: vectors, client captures and texts are
# vendored here (see tests/data/README.md), so no test depends on a path outside it.
DATA = REPO / "tests" / "data"

# In CI (CI=true) a skipped test fails the run unless its reason matches one of these,
# each with why that skip is expected there.
ALLOWED_CI_SKIPS: dict[str, str] = {
    r"DS4D_TEST_MODEL is not set": (
        "the DeepSeek V4 Flash GGUF is about 86 GB; CI machines have 24 GB of memory"
    ),
    r"skipped as in ds4: the API disagrees": (
        "a vector case known to disagree with the reference graph, skipped on purpose"
    ),
    r"no enable_thinking switch, no prompt that opens <think>": (
        "the thinking check is parametrized over every kit family; most have no thinking mode"
    ),
    r"only gpt-oss reads reasoning_effort": (
        "the reasoning-effort check is parametrized over every kit family; only gpt-oss has it"
    ),
}


# The slow tier: run by `make test-all`, left out of `make test` (CI) to keep it within
# three minutes on two cores. A file marks all its tests; "file::test" marks one test (all
# its parameters). Each names what makes it slow (measured under `--durations`).
SLOW_TESTS: dict[str, str] = {
    "tests/packaging/test_wheel.py": "builds the wheel and installs it into a fresh venv",
    "tests/e2e/test_e2e_state.py": "real daemons restarted and killed over ~6000-token prompts",
    "tests/engine/test_vectors.py::test_teacher_forced_logprobs_match_exact[long_chat_6k]": (
        "teacher-forces a 6k-token conversation"
    ),
    "tests/engine/test_vectors.py::test_teacher_forced_logprobs_match_exact[long_story_2k]": (
        "teacher-forces a 2k-token story"
    ),
    "tests/e2e/test_e2e_api.py::test_long_prefill_does_not_block_other_slots": (
        "prefills a long prompt while a short request runs"
    ),
    "tests/e2e/test_e2e_api.py::test_memory_reuse_of_a_long_conversation": (
        "a long conversation over several turns"
    ),
    "tests/ds4ctl/test_control_plane.py::test_cache_ls_and_evict": "fills the disk cache with long prompts",
    "tests/tools/test_bench_serve.py::test_start_runs_k_clients_against_a_real_daemon": (
        "starts a daemon and replays the serving workload at K = 1 and 2"
    ),
    "tests/ds4ctl/test_control_plane.py::test_power_50_keeps_the_output_identical": (
        "two cold long-prompt requests, one at half power"
    ),
    "tests/engine/test_llama_forward.py::test_prefill_then_decode_match_reference": (
        "the numpy reference forward over a whole prompt"
    ),
    "tests/engine/deepseek4/test_layout.py::test_full_size_file_opens_without_reading_weights": (
        "writes a sparse file of the full DeepSeek V4 size"
    ),
    "tests/daemon/test_config.py::test_second_sigint_while_draining_exits_130_without_a_traceback": (
        "a real daemon prefilling a long prompt"
    ),
}


# The longest modules, longest first (measured with `--durations`), run before all others.
# `make test` hands whole modules to its workers in collection order (xdist's loadscope,
# --no-loadscope-reorder): started first, the long ones overlap each other and the many
# short modules fill in at the end, so no worker sits idle while the other finishes a long
# module. (xdist's own reordering, by number of tests, would put these few-test modules
# last.) A module missing here just runs in file order after them.
RUN_FIRST: list[str] = [
    "tests/e2e/test_e2e_kit_families.py",  # nine daemons, one per kit family
    "tests/e2e/test_e2e_api.py",
    "tests/engine/test_family_vectors.py",
    "tests/native/test_native_build.py",  # the library built with gcc and with clang
    "tests/e2e/test_e2e_families.py",
    "tests/state/test_writer.py",
    "tests/serving/test_loop.py",
    "tests/serving/test_speculation_real.py",
    "tests/engine/test_gemma3_real.py",
    "tests/native/test_check_neon.py",
    "tests/e2e/test_e2e_batching.py",
    "tests/e2e/test_e2e_stream_start.py",
    "tests/state/test_kvstate.py",
    "tests/chat/test_constrain.py",
    "tests/engine/deepseek4/test_forward.py",
    "tests/engine/test_llama_forward.py",
    "tests/engine/test_tokenizer_vocab.py",
    "tests/engine/test_session.py",
    "tests/engine/test_kv_types.py",
    "tests/e2e/test_e2e_clients.py",
    "tests/e2e/test_e2e_force_tool_choice.py",
    "tests/chat/test_structured.py",  # real models sampled under a schema
    "tests/e2e/test_e2e_structured.py",
    "tests/e2e/test_e2e_fair_prefill.py",
    "tests/tools/test_bench_serve.py",
    "tests/api/test_http_fuzz.py",
    "tests/engine/test_gguf_reader.py",
]


def run_order(nodeid: str) -> int:
    module = nodeid.split("::", 1)[0]
    return RUN_FIRST.index(module) if module in RUN_FIRST else len(RUN_FIRST)


def is_slow(nodeid: str) -> bool:
    for key in SLOW_TESTS:
        if nodeid == key or nodeid.startswith((key + "::", key + "[")):
            return True
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if is_slow(item.nodeid):
            item.add_marker(pytest.mark.slow)
    # stable: each module's own order (and pytest's grouping by fixture) is kept
    items.sort(key=lambda item: run_order(item.nodeid))


@pytest.fixture(scope="session")
def model_path() -> Path:
    from ds4d.engine.default_model import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """tests/data: vectors/, fixtures/clients/, text/, templates/."""
    return DATA


@pytest.fixture(scope="session")
def shared_dir(data_dir: Path) -> Path:
    """The former name of data_dir (the data used to be read from ../shared)."""
    return data_dir


@pytest.fixture(scope="session")
def engine(model_path: Path) -> Iterator[object]:
    """The embedded model, opened once for the whole run (opening it takes seconds), with the
    default (serving) KV type."""
    from ds4d.engine import Engine

    with Engine.open(model_path, threads=2) as e:
        yield e


@pytest.fixture(scope="session")
def exact_engine(model_path: Path) -> Iterator[object]:
    """The embedded model with the exact float32 KV, for the exactness vectors."""
    from ds4d.engine import Engine

    with Engine.open(model_path, threads=2, kv_type="f32") as e:
        yield e


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def unlisted_skip(report: pytest.TestReport | pytest.CollectReport) -> str | None:
    """The reason of a skip that CI does not accept, or None."""
    if not in_ci() or not report.skipped or hasattr(report, "wasxfail"):
        return None
    reason = skip_reason(report)
    if any(re.search(pattern, reason) for pattern in ALLOWED_CI_SKIPS):
        return None
    return reason


def _fail_unlisted_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    reason = unlisted_skip(report)
    if reason is not None:
        report.outcome = "failed"
        report.longrepr = (
            f"skipped in CI without a listed reason: {reason}\n"
            "(install what it needs with `make test-tools`, or add the reason with why it "
            "is expected to ALLOWED_CI_SKIPS in tests/conftest.py)"
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    _fail_unlisted_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield
    _fail_unlisted_skip(outcome.get_result())
