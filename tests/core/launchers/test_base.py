"""``core/launchers/base.py``: a launch request names a program (its spawns through event loops are
test_base_spawning.py's)."""

from __future__ import annotations

import pytest

from async_local_executor.core.launchers.base import LaunchRequest


def test_request_needs_a_program() -> None:
    with pytest.raises(ValueError, match="argv must not be empty"):
        LaunchRequest("k", [])
