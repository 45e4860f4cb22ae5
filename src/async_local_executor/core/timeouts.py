"""A workload's run-time limit: a timer that stops it unless it exits first."""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio

from async_local_executor.core.clock import Clock

log = logging.getLogger(__name__)


class Deadline:
    """Calls ``expire`` with the reason once ``limit`` seconds of ``clock`` have passed, unless the
    workload has exited (``exited`` is set) or the deadline was cancelled.

    Cancelling works even before :meth:`run` first runs, so a workload that exits at once does not leave
    a timer behind to hold up shutdown.

    :param label: names the workload in the log
    """

    def __init__(
        self,
        limit: float,
        *,
        clock: Clock,
        exited: anyio.Event,
        expire: Callable[[str], None],
        label: object,
    ) -> None:
        self.limit = limit
        self._clock = clock
        self._exited = exited
        self._expire = expire
        self._label = label
        self._scope = anyio.CancelScope()

    async def run(self) -> None:
        with self._scope:
            await self._clock.sleep(self.limit)
            if not self._exited.is_set():
                log.warning(
                    "workload %s ran longer than its %gs timeout; terminating it", self._label, self.limit
                )
                self._expire(f"timed out after {self.limit:g}s")

    def cancel(self) -> None:
        self._scope.cancel()
