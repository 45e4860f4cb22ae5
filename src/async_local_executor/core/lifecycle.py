"""The life of one workload as a plain state machine: no I/O, no event loop.

The supervisor only carries out what this table allows, so "exactly one final event" is a property of
the table (``FINISHED`` has no way out) rather than of careful bookkeeping spread over coroutines.
"""

from __future__ import annotations

import enum

from async_local_executor.core.errors import InvalidTransition


class Phase(enum.Enum):
    QUEUED = "queued"  # accepted, waiting for a slot
    LAUNCHING = "launching"  # holds a slot, the launcher is starting the process
    RUNNING = "running"
    TERMINATING = "terminating"  # we signalled it and are waiting for it to exit
    FINISHED = "finished"  # the final outcome has been posted


class Step(enum.Enum):
    ADMIT = "admit"
    DROP = "drop"
    LAUNCHED = "launched"
    LAUNCH_FAILED = "launch_failed"
    TERMINATE = "terminate"
    EXIT = "exit"


TRANSITIONS: dict[tuple[Phase, Step], Phase] = {
    (Phase.QUEUED, Step.ADMIT): Phase.LAUNCHING,
    (Phase.QUEUED, Step.DROP): Phase.FINISHED,
    (Phase.LAUNCHING, Step.LAUNCHED): Phase.RUNNING,
    (Phase.LAUNCHING, Step.LAUNCH_FAILED): Phase.FINISHED,
    (Phase.RUNNING, Step.TERMINATE): Phase.TERMINATING,
    (Phase.RUNNING, Step.EXIT): Phase.FINISHED,
    (Phase.TERMINATING, Step.EXIT): Phase.FINISHED,
}


class Lifecycle:
    """Where one workload is; :meth:`advance` refuses an illegal step and leaves the phase unchanged."""

    __slots__ = ("phase",)

    def __init__(self) -> None:
        self.phase = Phase.QUEUED

    def advance(self, step: Step) -> Phase:
        """Move along ``step``.

        :raises InvalidTransition: if ``step`` is not allowed from the current phase
        """
        try:
            self.phase = TRANSITIONS[self.phase, step]
        except KeyError:
            raise InvalidTransition(f"cannot {step.value} a workload that is {self.phase.value}") from None
        return self.phase

    @property
    def finished(self) -> bool:
        return self.phase is Phase.FINISHED
