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
}


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
    """The embedded model, opened once for the whole run (opening it takes seconds)."""
    from ds4d.engine import Engine

    with Engine.open(model_path, threads=2) as e:
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
