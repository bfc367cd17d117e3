"""Shared test fixtures: the embedded model, the shared reference data, the repo root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# ../shared sits beside the checkout (in CI too); DS4D_SHARED overrides.
SHARED = Path(os.environ.get("DS4D_SHARED", REPO.parent / "shared"))


@pytest.fixture(scope="session")
def model_path() -> Path:
    from ds4d.engine.default_model import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"shared reference data not found at {SHARED} (set DS4D_SHARED)")
    return SHARED


@pytest.fixture(scope="session")
def engine(model_path: Path):
    """The embedded model, opened once for the whole run (opening it takes seconds)."""
    from ds4d.engine import Engine

    with Engine.open(model_path, threads=2) as e:
        yield e
