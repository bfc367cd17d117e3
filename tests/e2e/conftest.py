"""The `slow` marker, for the end-to-end tests that restart daemons."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: takes long (run by `make test-all`)")
