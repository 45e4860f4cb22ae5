"""Who may launch now: a slot under the executor-wide limit, one under its group's limit, and memory.

Waiting here is the only queue there is: an accepted workload holds no slot until every limit lets it
through, and low memory delays launches but never fails them. A process that already runs (one adopted
from a stopped executor) never waits: it takes its slot at once, on credit when none is free, and the
limit is that much lower until it ends.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import AsyncIterator, Callable, Iterator, Mapping

import anyio
import psutil

from async_local_executor.core.clock import SYSTEM, Clock
from async_local_executor.core.launchers.base import LaunchRequest

log = logging.getLogger(__name__)

MB = 1024 * 1024


def host_available_memory() -> int:
    return int(psutil.virtual_memory().available)


class Admission:
    """The limits one supervisor's workloads pass before they launch. Loop thread only.

    :param limit: at most this many workloads hold a slot (launching or running) at once; ``None`` for
        no limit
    :param group_limits: at most this many workloads of each named group hold a slot at once
    :param memory_floor: bytes of available memory below which admitted workloads wait before launching;
        0 turns the guard off
    :param available_memory: reads the host's available memory in bytes
    :param memory_poll: seconds between two reads while memory is low
    :param clock: what the memory guard sleeps on between reads
    """

    def __init__(
        self,
        *,
        limit: int | None,
        group_limits: Mapping[str, int] | None = None,
        memory_floor: int = 0,
        available_memory: Callable[[], int] = host_available_memory,
        memory_poll: float = 1.0,
        clock: Clock = SYSTEM,
    ) -> None:
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be >= 1 or None, got {limit}")
        for group, group_limit in (group_limits or {}).items():
            if group_limit < 1:
                raise ValueError(f"limit of group {group!r} must be >= 1, got {group_limit}")
        self._limiter = anyio.CapacityLimiter(math.inf if limit is None else limit)
        self._group_limiters = {
            group: anyio.CapacityLimiter(group_limit) for group, group_limit in (group_limits or {}).items()
        }
        # Each limiter's own limit, and how many slots running processes took from it on credit.
        self._limits: dict[anyio.CapacityLimiter, float] = {
            limiter: limiter.total_tokens for limiter in (self._limiter, *self._group_limiters.values())
        }
        self._owed: dict[anyio.CapacityLimiter, int] = dict.fromkeys(self._limits, 0)
        self._saturated: set[str] = set()
        self.memory_floor = memory_floor
        self._available_memory = available_memory
        self._memory_poll = memory_poll
        self._clock = clock
        self.memory_low = False
        self.last_available: int | None = None  # bytes, as last read by the guard
        self.memory_waits_total = 0  # workloads that had to wait for memory

    @contextlib.asynccontextmanager
    async def slot(self, request: LaunchRequest, *, running: bool = False) -> AsyncIterator[None]:
        """Hold a slot in ``request``'s group and one executor-wide, for as long as the body runs.

        :param running: the workload's process runs already (it was adopted): it takes its slots at once,
            without waiting. Where a limit has none free, it takes one on credit: that limit is one lower
            until the body ends, so workloads waiting to launch go only once enough others have ended
            to bring the count back under the limit. Nothing that runs is held back, or stopped, for it.
        """
        if running:
            with self._on_credit(self._group_limiters.get(request.group)), self._on_credit(self._limiter):
                yield
            return
        async with self._group_slot(request), self._limiter:
            yield

    @contextlib.contextmanager
    def _on_credit(self, limiter: anyio.CapacityLimiter | None) -> Iterator[None]:
        if limiter is None:
            yield
            return
        try:
            limiter.acquire_nowait()
        except anyio.WouldBlock:
            pass
        else:
            try:
                yield
            finally:
                limiter.release()
            return
        # Lowering the limit never wakes a waiter; every slot freed while something is owed pays it back
        # (anyio hands a freed token on only while fewer are borrowed than the limit).
        self._owed[limiter] += 1
        self._set_limit(limiter)
        try:
            yield
        finally:
            self._owed[limiter] -= 1
            self._set_limit(limiter)

    def _set_limit(self, limiter: anyio.CapacityLimiter) -> None:
        limit = self._limits[limiter]
        limiter.total_tokens = limit if math.isinf(limit) else max(0, int(limit) - self._owed[limiter])

    def _group_slot(self, request: LaunchRequest) -> contextlib.AbstractAsyncContextManager[object]:
        # Taken before the executor-wide slot, so a workload held back by its group's limit does not
        # also hold a slot another group could use.
        limiter = self._group_limiters.get(request.group)
        if limiter is None:
            return contextlib.nullcontext()
        if limiter.available_tokens < 1:
            if request.group not in self._saturated:
                self._saturated.add(request.group)
                log.info(
                    "queue %r is at its limit of %d running workloads; its next ones wait",
                    request.group,
                    int(limiter.total_tokens),
                )
        else:
            self._saturated.discard(request.group)
        return limiter

    async def wait_for_memory(self, request: LaunchRequest) -> None:
        """Return once available memory is at or above the floor; at once if the guard is off."""
        if not self.memory_floor:
            return
        waited = False
        while (available := self._available_memory()) < self.memory_floor:
            self.last_available = available
            if not waited:
                waited = True
                self.memory_waits_total += 1
            if not self.memory_low:
                self.memory_low = True
                log.warning(
                    "available memory %d MB is below the floor of %d MB; workload %s and the ones "
                    "after it wait to launch",
                    available // MB,
                    self.memory_floor // MB,
                    request.label or request.key,
                )
            await self._clock.sleep(self._memory_poll)
        self.last_available = available
        if self.memory_low:
            self.memory_low = False
            log.warning("available memory is back above %d MB; launching again", self.memory_floor // MB)
