"""``core/stopping.py``: a termination policy's grace is never negative. How stops escalate, on a fake
clock, is tests/core/test_supervisor.py's."""

from __future__ import annotations

import pytest

from async_local_executor.core.stopping import TerminationPolicy


def test_grace_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="grace must be >= 0"):
        TerminationPolicy(grace=-1)
