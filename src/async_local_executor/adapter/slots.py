"""How many workloads the executor takes beyond its free slots, as the scheduler sees its slots.

The scheduler sizes what it hands over by ``slots_available`` and ``slots_occupied``. Accepting more than
there are free slots keeps the next workloads waiting inside the executor, where the capacity limiter
starts each one as soon as a slot frees, instead of one scheduler loop per freed slot. How many that is
comes from :class:`~async_local_executor.core.prefetch.PrefetchBudget`, fed with each start and end.

Rule: :class:`Prefetch` only counts; the executor adds what it allows to the slots Airflow's base class
reports.
"""

from __future__ import annotations

import logging

from async_local_executor.adapter.submissions import Started, Ticket
from async_local_executor.core.clock import Clock
from async_local_executor.core.outcome import Outcome
from async_local_executor.core.prefetch import PrefetchBudget

log = logging.getLogger(__name__)


class Prefetch:
    """The executor's prefetch: what its budget allows now, fed with each start and end.

    :param budget: the core's budget (the executor replaces this object when it starts)
    :param clock: what "now" is for the budget
    """

    def __init__(self, budget: PrefetchBudget, clock: Clock) -> None:
        self.budget = budget
        self._clock = clock
        self._logged = budget.maximum

    def allowed(self) -> int:
        """How many workloads the executor takes beyond its free slots now."""
        return self.budget.allowed(self._clock.time())

    def note(self, ticket: Ticket, event: Started | Outcome) -> bool:
        """Feed the budget; True when a workload ended."""
        if isinstance(event, Started):
            self.budget.launched(ticket, event.at)
            return False
        times = event.times
        duration = None
        if times is not None and times.launched is not None and times.ended is not None:
            duration = times.ended - times.launched
        self.budget.ended(ticket, duration)
        return True

    def log_change(self) -> None:
        """Log what it allows when that changed; once per sync(), as allowed() takes a median."""
        budget, now = self.budget, self._clock.time()
        allowed = budget.allowed(now)
        if allowed != self._logged:
            self._logged = allowed
            log.info(
                "prefetch now %d of %d: tasks take about %.0fs and [scheduler] task_queued_timeout is %.0fs",
                allowed,
                budget.maximum,
                budget.duration(now),
                budget.queued_timeout,
            )
