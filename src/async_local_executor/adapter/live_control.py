"""The executor's side of live control (:mod:`~async_local_executor.ops.control`): it reads its team's
control file on every heartbeat, applies a change to the event loop's admission, says so in one INFO
line, and keeps what it applied for the status file, where the command line and the REST API see that it
took.

- ``paused`` and ``draining`` take no new work: the executor reports no open slots, so Airflow leaves task
  instances ``scheduled`` rather than queueing them where they would run into ``task_queued_timeout``.
- ``paused`` also holds back the start of the tasks Airflow had already handed over (each says why in
  its log); callbacks and connection tests are not held: they are short, and a callback that must run
  should not wait behind a pause.
- ``draining`` lets what was already handed over start (Airflow has it ``queued``: held, it would be
  reset and run again after the stop a drain prepares), and is done (``drained``) once none of it is
  left, waiting or running. At its deadline, what is still there is handled as ``on_stop`` says:
  terminated now (and what waits, dropped), or left to run and be handed over at the scheduler's stop;
  either way the operator is told which tasks those are, and the drain counts as overdue.
- A resize sets the limits in force; lowering one stops nothing that runs.

Scheduler thread only, but for :meth:`LiveControl.fields`, which the status writer reads from its own
thread (one reference to a dict replaced whole).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from async_local_executor.core.clock import Clock
from async_local_executor.core.health import Report
from async_local_executor.core.runtime import Runtime
from async_local_executor.ops import control
from async_local_executor.ops.control import Control, ControlError
from async_local_executor.ops.status_format import ControlFields

log = logging.getLogger(__name__)

DRAINED = "drained"


class LiveControl:
    """
    :param directory: the state directory, where the control file is
    :param team: the executor's team, whose control file it reads
    :param parallelism: the configured executor-wide limit
    :param queues: the configured queue limits
    :param terminates: at a drain's deadline, what still runs is terminated (``on_stop = terminate``);
        else it is left running, for the scheduler's stop to hand over
    :param stop_running: stops every task workload, started or waiting (the executor knows their
        submissions)
    """

    def __init__(
        self,
        directory: Path,
        team: str | None,
        *,
        parallelism: int,
        queues: Mapping[str, int],
        terminates: bool,
        stop_running: Callable[[], None],
        clock: Clock,
    ) -> None:
        self._watcher = control.Watcher(directory, team)
        self._configured = parallelism
        self._queues = dict(queues)
        self._terminates = terminates
        self._stop_running = stop_running
        self._clock = clock
        self.control = Control()
        self._applied_at = clock.monotonic()  # when the control in force was handed to the event loop
        self._drained = False
        self._overdue: tuple[str, ...] | None = None  # at a drain's deadline: the tasks that still ran
        self._broken: str | None = None  # the last unreadable file's error, said once
        self._fields: ControlFields = self._snapshot()

    @property
    def holds_starts(self) -> bool:
        return self.control.holds_starts

    @property
    def configured(self) -> int:
        """The configured executor-wide limit."""
        return self._configured

    @property
    def parallelism(self) -> int:
        """The executor-wide limit in force."""
        return self.control.parallelism or self._configured

    @property
    def queues(self) -> dict[str, int]:
        """Each limited queue's limit in force."""
        return {**self._queues, **self.control.queues}

    def fields(self) -> ControlFields:
        """What the status file says of it; safe from any thread."""
        return self._fields

    @property
    def holds_back(self) -> bool:
        """Tasks handed over already wait to start: a pause (a drain lets them start)."""
        return self.control.mode == control.PAUSED

    def start(self, runtime: Runtime) -> None:
        """Read the control file and apply it before the first task can start; say so if it is in force."""
        self.poll(runtime, starting=True)

    def poll(self, runtime: Runtime, *, starting: bool = False) -> bool:
        """Apply a change of the control file; True when what is in force changed. Never raises: the
        scheduler's loop calls it, and what a control file holds must not stop that loop."""
        try:
            new = self._watcher.changed()
        except ControlError as exc:
            if str(exc) != self._broken:
                self._broken = str(exc)
                log.error("the control file cannot be read, so the control in force stays as it was: %s", exc)
            return False
        if new is None or (not starting and new.serial == self.control.serial and new.at == self.control.at):
            return False
        self._broken = None
        return self._apply(runtime, new, starting=starting)

    def _apply(self, runtime: Runtime, new: Control, *, starting: bool) -> bool:
        before = self.control
        try:
            runtime.control(
                paused=new.mode == control.PAUSED,
                # parallelism 0 (Airflow 2) is no limit at all
                limit=new.parallelism or self._configured or None,
                group_limits={
                    name: value
                    for name, value in {**self._queues, **new.queues}.items()
                    if name in self._queues
                },
            )
        except ValueError as exc:  # only a file written by hand can hold one
            log.error("the control file asks for %s; the control in force stays as it was", exc)
            return False
        self.control = new
        self._applied_at = self._clock.monotonic()
        if new.mode != control.DRAINING or before.mode != control.DRAINING or new.deadline != before.deadline:
            self._drained, self._overdue = False, None
        if starting:
            if new != Control():
                log.info(
                    "live control in force since before this start: %s; %s", new.describe(), self._limits()
                )
        else:
            log.info("live control changed (serial %d): %s; %s", new.serial, new.describe(), self._limits())
        self._fields = self._snapshot()
        return True

    def _limits(self) -> str:
        said = f"parallelism {self.parallelism} (configured {self._configured})"
        if self._queues:
            said += ", queue limits " + ", ".join(
                f"{name}:{value} (configured {self._queues[name]})"
                for name, value in sorted(self.queues.items())
            )
        return said

    @property
    def following(self) -> bool:
        """A drain is in force and not done yet: :meth:`follow_drain` has something to look at."""
        return self.control.mode == control.DRAINING and not self._drained

    def follow_drain(
        self, report: Report | None, running: Sequence[str], waiting: Sequence[str], *, since: float
    ) -> None:
        """After the scheduler's events were read: say drained once nothing is left, or act at the deadline.

        :param report: the event loop's latest health report (how many workloads hold a slot)
        :param running: the labels of the task workloads that started and have not ended
        :param waiting: those handed over that have not started
        :param since: when the executor last learnt of a start (monotonic): an older report could have
            been taken while that workload waited for its slot, before it held one
        """
        if not self.following or report is None:
            return
        fresh = report.at > max(self._applied_at, since)
        if fresh and not running and not waiting and report.state.held == 0:
            self._drained = True
            log.info("drained: no workload runs or waits (%s)", self.control.describe())
            self._fields = self._snapshot()
            return
        deadline = self.control.deadline
        if self._overdue is not None or deadline is None or self._clock.time() < deadline:
            return
        still = tuple(sorted(running)) + tuple(sorted(f"{label} (waiting)" for label in waiting))
        self._overdue = still
        if self._terminates:
            log.warning(
                "drain deadline passed with %d workload(s) left; stopping them (on_stop = terminate): %s",
                len(still),
                ", ".join(still),
            )
            self._stop_running()
        else:
            log.warning(
                "drain deadline passed with %d workload(s) left; they run on, and those running when the "
                "scheduler stops are handed over (on_stop = handover): %s",
                len(still),
                ", ".join(still),
            )
        self._fields = self._snapshot()

    def _snapshot(self) -> ControlFields:
        now = self.control
        mode = DRAINED if now.mode == control.DRAINING and self._drained else now.mode
        return {
            "mode": mode,
            "by": now.by or None,
            "at": now.at or None,
            "deadline": now.deadline,
            "overdue": self._overdue is not None,
            "still_running": list(self._overdue or ()),
            "serial": now.serial,
            "parallelism": self.parallelism,
            "configured_parallelism": self._configured,
            "queue_limits": self.queues,
            "configured_queue_limits": dict(self._queues),
            "note": None if now == Control() else now.describe() + (" (drained)" if mode == DRAINED else ""),
        }

    def waiting_note(self) -> str:
        """What a task held back by the pause or the drain says in its log."""
        return (
            f"The executor is {self.control.describe()}: this task starts once an operator resumes it "
            "(async-local-executor resume)."
        )
