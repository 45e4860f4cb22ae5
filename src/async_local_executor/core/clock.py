"""The one clock the core reads: monotonic time for intervals, wall time for what operators see.

Every core component takes a :class:`Clock` (default :data:`SYSTEM`), so a test can drive time by hand
(``tests/core/helpers.py``'s ``FakeClock``) instead of sleeping and hoping the time has passed.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
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

    def move_on_after(
        self, seconds: float, shield: bool = False
    ) -> AbstractContextManager[anyio.CancelScope]:
        """A cancel scope cancelled once ``seconds`` of this clock's monotonic time have passed.

        Every timeout in the core goes through here, so a fake clock drives them all.
        """
        ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)

    def move_on_after(
        self, seconds: float, shield: bool = False
    ) -> AbstractContextManager[anyio.CancelScope]:
        return anyio.move_on_after(seconds, shield=shield)


SYSTEM: Clock = SystemClock()
