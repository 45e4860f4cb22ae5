"""The one clock the core reads: monotonic time for intervals, wall time for what operators see.

Every core component takes a :class:`Clock` (default :data:`SYSTEM`), so a test can drive time by hand
(``tests/core/helpers.py``'s ``FakeClock``) instead of sleeping and hoping the time has passed.
"""

from __future__ import annotations

import time
from typing import Protocol

import anyio


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never jumps; only differences mean anything."""
        ...

    def time(self) -> float:
        """Seconds since the epoch, for timestamps a person or another process reads."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's monotonic time."""
        ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


SYSTEM: Clock = SystemClock()
