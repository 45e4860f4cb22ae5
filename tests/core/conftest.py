"""Fixtures every core test directory shares."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["subprocess", "forkserver"])
def kind(request: pytest.FixtureRequest) -> str:
    """Which launch path a real-process test runs on: both, one after the other."""
    return str(request.param)
