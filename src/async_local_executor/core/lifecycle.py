"""The life of one workload as a plain state machine: no I/O, no event loop.

The supervisor only carries out what this table allows, so "exactly one final event" is a property of
the table (``FINISHED`` and ``RELEASED`` have no way out, and only ``FINISHED`` posts an event) rather
than of careful bookkeeping spread over coroutines.
:func:`transition` is the only way a phase changes: :class:`Lifecycle` offers no setter.
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
    RELEASED = "released"  # handed over alive to a successor: its final event is the successor's to give


_ENDED = (Phase.FINISHED, Phase.RELEASED)


class Step(enum.Enum):
    ADMIT = "admit"
    DROP = "drop"
    LAUNCHED = "launched"
    LAUNCH_FAILED = "launch_failed"
    TERMINATE = "terminate"
    EXIT = "exit"
    ABANDON = "abandon"  # supervising it failed (a bug): it finishes with an internal error
    RELEASE = "release"  # let go alive at a handover: no final event from this supervisor


TRANSITIONS: dict[tuple[Phase, Step], Phase] = {
    (Phase.QUEUED, Step.ADMIT): Phase.LAUNCHING,
    (Phase.QUEUED, Step.DROP): Phase.FINISHED,
    (Phase.LAUNCHING, Step.LAUNCHED): Phase.RUNNING,
    (Phase.LAUNCHING, Step.LAUNCH_FAILED): Phase.FINISHED,
    (Phase.RUNNING, Step.TERMINATE): Phase.TERMINATING,
    (Phase.RUNNING, Step.EXIT): Phase.FINISHED,
    (Phase.TERMINATING, Step.EXIT): Phase.FINISHED,
    # A running workload is handed over; one being stopped is stopped to its end, unless it is being
    # stopped for its run-time limit (see Supervisor.release).
    (Phase.RUNNING, Step.RELEASE): Phase.RELEASED,
    (Phase.TERMINATING, Step.RELEASE): Phase.RELEASED,
    # A bug may strike in any phase; the workload must still get its one final event (from us, unless
    # it was handed over: then from whoever adopts it).
    **{(phase, Step.ABANDON): Phase.FINISHED for phase in Phase if phase not in _ENDED},
}


def transition(phase: Phase, step: Step) -> Phase:
    """The phase ``step`` leads to from ``phase``.

    :raises InvalidTransition: if the table has no such edge
    """
    try:
        return TRANSITIONS[phase, step]
    except KeyError:
        raise InvalidTransition(f"cannot {step.value} a workload that is {phase.value}") from None


class Lifecycle:
    """Where one workload is; :meth:`advance` refuses an illegal step and leaves the phase unchanged."""

    __slots__ = ("_phase",)

    def __init__(self) -> None:
        self._phase = Phase.QUEUED

    @property
    def phase(self) -> Phase:
        return self._phase

    def advance(self, step: Step) -> Phase:
        """Move along ``step``.

        :raises InvalidTransition: if ``step`` is not allowed from the current phase
        """
        self._phase = transition(self._phase, step)
        return self._phase

    @property
    def finished(self) -> bool:
        """Whether this supervisor is done with it: its final event posted, or handed over alive."""
        return self._phase in _ENDED
