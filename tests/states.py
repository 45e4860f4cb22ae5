"""A supervisor's state with nothing going on, for tests of what reads it (health, status, overview)."""

from __future__ import annotations

import time

from async_local_executor.core.admission import MB
from async_local_executor.core.health import Health, Report, Verdict
from async_local_executor.core.state import SupervisorState


def quiet(**changes: object) -> SupervisorState:
    base: dict[str, object] = {
        "running": (),
        "waiting": 0,
        "oldest_waiting_since": None,
        "memory_low": False,
        "memory_floor": 256 * MB,
        "available_memory": 8000 * MB,
        "launcher_problem": None,
        "recent_failures": (),
        "launched_total": 0,
        "last_launched_at": None,
        "memory_waits_total": 0,
        "outcomes_total": {},
    }
    return SupervisorState(**{**base, **changes})  # type: ignore[arg-type]


def quiet_report() -> Report:
    """A healthy report of an idle supervisor without a memory guard, taken now."""
    state = quiet(memory_floor=0, available_memory=None)
    return Report(time.monotonic(), 0.0, 0.0, Health(Verdict.HEALTHY), state)
