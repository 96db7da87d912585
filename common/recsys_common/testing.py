"""Locating the project's small real datasets from tests and benchmarks.

The datasets live beside the repository (``../shared/data``) or wherever ``RECSYS_DATA_DIR`` points; their licences
forbid committing them. A user's fresh clone has none, so tests that need them skip with a reason; CI sets
``RECSYS_REQUIRE_DATA=1`` and then a missing dataset fails the test instead of skipping it.
"""
from __future__ import annotations

import os

REQUIRE_ENV = "RECSYS_REQUIRE_DATA"
DATA_DIR_ENV = "RECSYS_DATA_DIR"


def repo_root() -> str:
    """The repository root (``common/recsys_common/testing.py`` -> two levels up from ``common``)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def shared_data_dir() -> str:
    return os.path.abspath(os.environ.get(DATA_DIR_ENV) or os.path.join(repo_root(), os.pardir, "shared", "data"))


def data_required() -> bool:
    return os.environ.get(REQUIRE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def shared_data_path(*parts: str) -> str:
    """Path of a shared dataset; inside pytest, skip (or fail when required) if it does not exist."""
    path = os.path.join(shared_data_dir(), *parts)
    if os.path.exists(path):
        return path
    reason = (f"real dataset {os.path.join(*parts)} not found at {path}: set {DATA_DIR_ENV} to the directory "
              f"holding the project's shared datasets (see README)")
    import pytest  # imported here so that the library itself does not depend on pytest
    if data_required():
        pytest.fail(f"{reason}; {REQUIRE_ENV}=1 makes this a failure", pytrace=False)
    pytest.skip(reason)
    return path  # unreachable
