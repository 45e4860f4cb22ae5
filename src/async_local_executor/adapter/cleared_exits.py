"""Hand the scheduler at most one exit of a cleared task instance per loop.

A task instance cleared while it runs becomes ``restarting``; the api-server then tells its supervisor
to stop, the workload exits, and the scheduler handles that exit in ``process_executor_events`` with
``ti.set_state(None)``. On Airflow 3 that call runs without the scheduler's session, so it commits and
closes the session the whole batch of events is being read through. Two things follow when many cleared
task instances end together (every task of a large run cleared at once):

- the batch's row locks go with the first commit, a clear waiting on them (a second clear of the same
  run) gives every task instance a new id, and the next ``set_state`` in the batch updates a row that
  no longer exists: ``StaleDataError`` (or ``IntegrityError``), and the scheduler exits;
- each of those exits costs the scheduler a serialized-DAG lookup and a commit: 256 of them in one
  batch kept its loop away from its heartbeat for 30 s and more.

With one such exit per batch, both go away: the only ``set_state`` of the batch is on a row the batch
has locked, and the loop stays short. Every other event passes at once; the held ones follow, one per
scheduler loop (a loop takes well under a second while the scheduler has events to process).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Hashable, Iterable
from typing import Any

log = logging.getLogger(__name__)

# Which of these keys name task instances that are ``restarting`` now (or raises: then nothing is held).
Lookup = Callable[[Collection[Any]], Iterable[Hashable]]


class ClearedExitGate:
    """Splits each batch of events into what the scheduler gets now and what waits for its next loop."""

    def __init__(self, lookup: Lookup, *, is_candidate: Callable[[Hashable, Any], bool]) -> None:
        self._lookup = lookup
        self._is_candidate = is_candidate  # an event the scheduler could handle with set_state(None)
        self._holding = 0  # how many the last batch held back: what the log lines report on
        self._lookup_failed = False

    def hold_back(self, events: dict[Any, Any]) -> dict[Any, Any]:
        """Remove from ``events`` all but one exit of a restarting task instance; return the removed ones."""
        candidates = [key for key, value in events.items() if self._is_candidate(key, value)]
        held: dict[Any, Any] = {}
        if len(candidates) > 1:
            try:
                restarting = set(self._lookup(candidates))
            except Exception:  # the batch goes through as Airflow would get it
                if not self._lookup_failed:
                    log.warning(
                        "could not read which task instances are restarting; exits of cleared task "
                        "instances go to the scheduler unpaced",
                        exc_info=True,
                    )
                self._lookup_failed = True
                restarting = set()
            else:
                self._lookup_failed = False
            # The first one stays in the batch: the scheduler gets one per loop.
            for key in [key for key in candidates if key in restarting][1:]:
                held[key] = events.pop(key)
        self._note(len(held))
        return held

    def _note(self, count: int) -> None:
        if count and not self._holding:
            log.info(
                "%d more exits of cleared (restarting) task instances ended together: the scheduler "
                "gets one per loop (Airflow 3 commits its session for each; see docs/troubleshooting.md)",
                count,
            )
        elif self._holding and not count:
            log.info("every exit of a cleared task instance has gone to the scheduler")
        self._holding = count
