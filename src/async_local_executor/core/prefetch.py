"""How many workloads to accept beyond the free slots, without any of them outwaiting the scheduler.

A prefetched workload waits inside the executor for a slot, and Airflow counts that wait as queued: a
task queued longer than ``[scheduler] task_queued_timeout`` is revoked and rescheduled, and failed after
``num_stuck_in_queued_retries`` of those. With tasks that hold every slot for longer than that, a fixed
prefetch would turn a busy host into failed tasks. So the prefetch shrinks as tasks get longer.

Slots free at about ``parallelism / D`` per second, D being a typical task's duration, so the k-th
waiting workload waits about ``ceil(k / parallelism) * D``. Keeping that under half the timeout allows
``parallelism * floor(timeout / 2 / D)`` waiting workloads. D is the larger of a moving average of the
durations of finished workloads and the median age of the running ones (a task running for ``e`` seconds
lasts at least ``e``; the median ignores one stuck task). Nothing here knows Airflow.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable

# Weight of the newest duration in the moving average: about the last ten workloads count.
SMOOTHING = 0.2


class PrefetchBudget:
    """
    :param parallelism: how many workloads run at once
    :param maximum: the configured prefetch, never exceeded
    :param queued_timeout: the scheduler's patience with a queued task, in seconds; 0 or less for none
    """

    def __init__(self, *, parallelism: int, maximum: int, queued_timeout: float) -> None:
        self.parallelism = parallelism
        self.maximum = maximum
        self.queued_timeout = queued_timeout
        self.typical: float | None = None  # moving average of finished workloads' durations
        self._running: dict[Hashable, float] = {}  # launch time of each running workload

    def launched(self, ident: Hashable, at: float) -> None:
        self._running[ident] = at

    def ended(self, ident: Hashable, duration: float | None) -> None:
        """``duration`` is None for a workload that never ran."""
        self._running.pop(ident, None)
        if duration is None:
            return
        duration = max(duration, 0.0)
        self.typical = (
            duration if self.typical is None else SMOOTHING * duration + (1 - SMOOTHING) * self.typical
        )

    def duration(self, now: float) -> float:
        """The typical duration this budget assumes; 0 while nothing is known."""
        running = statistics.median_low([now - at for at in self._running.values()]) if self._running else 0.0
        return max(self.typical or 0.0, running)

    def allowed(self, now: float) -> int:
        """How many workloads may wait inside the executor now."""
        if self.maximum == 0 or self.queued_timeout <= 0:
            return self.maximum
        duration = self.duration(now)
        if duration <= 0:
            return self.maximum
        waves = math.floor(self.queued_timeout / 2 / duration)
        return min(self.maximum, self.parallelism * waves)
