"""Hand the scheduler at most one exit of a cleared task instance per loop.

Rule: every event of a batch passes at once but these. Of the success events of task instances that
are ``restarting`` now, the first goes with the batch and each other waits for a following loop. The
exit of a workload whose task instance is gone (:data:`TI_GONE`) goes only if that task instance is
``restarting``; otherwise no event is sent (any event would fail the task instance queued or running
under that key) and its key goes to ``on_unreachable``. Which task instances are restarting comes from
one lookup per batch that needs it; a lookup that raises lets the batch through as Airflow would get
it. Why:
docs/design.md, "Exits of cleared task instances, one per scheduler loop".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Hashable, Iterable
from typing import Any

from async_local_executor.adapter.submissions import describe

log = logging.getLogger(__name__)

# Which of these keys name task instances that are ``restarting`` now (or raises: then nothing is held).
Lookup = Callable[[Collection[Any]], Iterable[Hashable]]

# The info of a gone workload's exit (see the module docstring).
TI_GONE = "the api-server no longer has this task instance: it was cleared while the workload started or ran"


class ClearedExitGate:
    """Splits each batch of events into what the scheduler gets now and what waits for its next loop."""

    def __init__(
        self,
        lookup: Lookup,
        *,
        is_candidate: Callable[[Hashable, Any], bool],
        on_unreachable: Callable[[list[Any]], None] | None = None,
    ) -> None:
        self._lookup = lookup
        self._is_candidate = is_candidate  # an event the scheduler could handle with set_state(None)
        self._on_unreachable = on_unreachable  # gone workloads' keys whose event was dropped
        self._holding = 0  # how many the last batch held back: what the log lines report on
        self._lookup_failed = False

    def hold_back(self, events: dict[Any, Any]) -> dict[Any, Any]:
        """Remove from ``events`` all but one exit of a restarting task instance, and every gone workload's
        exit whose task instance is not restarting; return the held ones (the dropped ones are logged)."""
        candidates = [key for key, value in events.items() if self._is_candidate(key, value)]
        gone = [key for key, value in events.items() if _is_gone(value)]
        held: dict[Any, Any] = {}
        if len(candidates) > 1 or gone:
            try:
                restarting = set(self._lookup(set(candidates) | set(gone)))
            except Exception:  # the batch goes through as Airflow would get it
                if not self._lookup_failed:
                    log.warning(
                        "could not read which task instances are restarting; exits of cleared task "
                        "instances go to the scheduler unpaced",
                        exc_info=True,
                    )
                self._lookup_failed = True
                restarting = set()
                gone = []  # unknown: each goes to the scheduler, which may fail it, as before this read
            else:
                self._lookup_failed = False
            dropped = [key for key in gone if key not in restarting]
            for key in dropped:
                events.pop(key)
                candidates.remove(key)
                log.info(
                    "workload %s: its task instance was cleared and is no longer restarting, under an id "
                    "this workload does not have (queued or running under it, or cleared again); no event "
                    "is sent, as the scheduler would fail the task instance on any",
                    describe(key),
                )
            if dropped and self._on_unreachable is not None:
                self._on_unreachable(dropped)
            # The first one stays in the batch: the scheduler gets one per loop.
            for key in [key for key in candidates if key in restarting][1:]:
                held[key] = events.pop(key)
        self._note(len(held))
        return held

    def _note(self, count: int) -> None:
        # How many exits are held back now: logged when that starts and when it ends, not each loop.
        if count and not self._holding:
            log.info(
                "%d more exits of cleared (restarting) task instances ended together: the scheduler "
                "gets one per loop (Airflow 3 commits its session for each; see docs/troubleshooting.md)",
                count,
            )
        elif self._holding and not count:
            log.info("every exit of a cleared task instance has gone to the scheduler")
        self._holding = count


def _is_gone(event: Any) -> bool:
    return isinstance(event, tuple) and len(event) == 2 and event[1] == TI_GONE
