"""Shared test fixtures.

``shared_data`` points at the real public data in ``../shared/data`` (beside the repository;
override with ``FEDCXR_SHARED``); tests that use it are skipped when it is absent. CI always
has it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _shared_root() -> Path:
    env = os.environ.get("FEDCXR_SHARED")
    return Path(env) if env else REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` or skip."""
    path = _shared_root() / "data"
    if not path.is_dir():
        pytest.skip("../shared/data not present")
    return path


@pytest.fixture(scope="session")
def shared_papers() -> Path:
    path = _shared_root() / "papers"
    if not path.is_dir():
        pytest.skip("../shared/papers not present")
    return path
