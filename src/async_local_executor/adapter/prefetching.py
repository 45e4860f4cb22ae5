"""How many workloads the executor takes beyond its free slots, as the scheduler sees it.

The scheduler sizes what it hands over by ``slots_available`` and ``slots_occupied``. Accepting
``prefetch`` more than there are free slots keeps the next workloads waiting inside the executor, where
the capacity limiter starts each one as soon as a slot frees: the scheduler no longer runs one loop per
freed slot (its loop is the costliest thing on a busy host), and a task does not wait for that loop. How
many that is comes from :class:`~async_local_executor.core.prefetch.PrefetchBudget`, fed here with each
start and end.
"""

from __future__ import annotations

import logging

from async_local_executor.adapter.executor_base import ExecutorBase
from async_local_executor.adapter.submissions import Started, Ticket
from async_local_executor.core.outcome import Outcome

log = logging.getLogger(__name__)


class Prefetching(ExecutorBase):
    @property
    def slots_available(self) -> int:
        return int(super().slots_available) + self._budget.allowed(self.clock.time())

    # The scheduler itself queues no more than [core] parallelism minus what every executor holds
    # (slots_occupied). Prefetched workloads wait for one of our slots and hold none of parallelism's,
    # so up to the prefetch they are not counted; counted, the prefetch could never fill.
    @property
    def slots_occupied(self) -> int:
        return max(0, int(super().slots_occupied) - self._budget.allowed(self.clock.time()))

    def trigger_tasks(self, open_slots: int) -> None:
        super().trigger_tasks(open_slots + self._budget.allowed(self.clock.time()))

    def _note_for_prefetch(self, ticket: Ticket, event: Started | Outcome) -> bool:
        """Feed the prefetch budget; True when a workload ended."""
        if isinstance(event, Started):
            self._budget.launched(ticket, event.at)
            return False
        times = event.times
        duration = None
        if times is not None and times.launched is not None and times.ended is not None:
            duration = times.ended - times.launched
        self._budget.ended(ticket, duration)
        return True

    def _log_prefetch_change(self) -> None:
        # Once per sync(), not per outcome: allowed() takes a median over the running workloads.
        budget, now = self._budget, self.clock.time()
        allowed = budget.allowed(now)
        if allowed != self._prefetch_logged:
            self._prefetch_logged = allowed
            log.info(
                "prefetch now %d of %d: tasks take about %.0fs and [scheduler] task_queued_timeout is %.0fs",
                allowed,
                budget.maximum,
                budget.duration(now),
                budget.queued_timeout,
            )
