"""What both Airflow majors' hand-over paths share: the executor's state, taking a workload in, passing it
to the loop, and telling Airflow how it ended.

:class:`~async_local_executor.adapter.executor.AsyncLocalExecutor` is built on this; Airflow 2's commands
(:mod:`~async_local_executor.adapter.airflow2`), the prefetch (:mod:`~async_local_executor.adapter.prefetching`)
and the health verdict (:mod:`~async_local_executor.adapter.health`) are layers of their own on it.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

from airflow.executors.base_executor import BaseExecutor
from airflow.models.taskinstancekey import TaskInstanceKey

from async_local_executor.adapter import child, tasklog
from async_local_executor.adapter.child_output import ChildOutput
from async_local_executor.adapter.cleared_exits import TI_GONE
from async_local_executor.adapter.compat import AIRFLOW_V3, airflow2_audit, airflow2_log_path
from async_local_executor.adapter.config import SECTION, ExecutorConfig
from async_local_executor.adapter.metrics import Metrics
from async_local_executor.adapter.submissions import Mailbox, States, Ticket, describe
from async_local_executor.adapter.validation import KNOWN_KEYS, Checked, shown
from async_local_executor.core.cgroups import Containment
from async_local_executor.core.clock import SYSTEM, Clock
from async_local_executor.core.health import Thresholds
from async_local_executor.core.launchers.base import LaunchRequest
from async_local_executor.core.outcome import Outcome, OutcomeKind
from async_local_executor.core.prefetch import PrefetchBudget
from async_local_executor.core.runtime import Runtime
from async_local_executor.ops import journal, status

if TYPE_CHECKING:
    from airflow.executors.workloads.types import WorkloadKey, WorkloadState

log = logging.getLogger(__name__)

_EXIT_REASONS = {
    child.EXIT_CRASHED: "workload process crashed (its traceback is in the scheduler log)",
    child.EXIT_BAD_INPUT: "workload process could not read its workload (see the scheduler log)",
    child.EXIT_ORPHANED: "workload process found the executor gone before it started",
}
_IGNORED_KEYS_WARNED = 100


def _ti_gone(key: object, outcome: Outcome) -> bool:
    return (
        isinstance(key, TaskInstanceKey)
        and outcome.kind is OutcomeKind.EXITED
        and outcome.returncode == child.EXIT_TI_GONE
    )


def _tell_the_task(folder: str, relative: str | None, key: Any, message: str, audit: str = "") -> None:
    """Runs in a worker thread of the loop: on Airflow 2 this reads and writes the database.

    Never raises: an exception here would end the loop's task group, and every workload with it.

    :param audit: the event of Airflow 2's audit log to record ``message`` as; none when empty
    """
    try:
        _write_the_message(folder, relative, key, message, audit)
    except Exception:
        log.exception("cannot write to the task log of %s: %s", describe(key), message)


def _write_the_message(folder: str, relative: str | None, key: Any, message: str, audit: str) -> None:
    if not AIRFLOW_V3:
        if audit:
            try:
                airflow2_audit(key, audit, message)
            except Exception:  # the scheduler log still has it
                log.exception("cannot record %r of %s in the audit log", audit, describe(key))
        try:
            relative = airflow2_log_path(key)
        except Exception:
            log.exception("cannot find the log file of %s", describe(key))
    if relative:
        tasklog.append_line(folder, relative, message, text=not AIRFLOW_V3)


class ExecutorBase(BaseExecutor):
    """The executor's state, and what every hand-over path does with a workload.

    :attr clock: the time the executor and everything it builds reads; a test overrides it in a
        subclass to drive time by hand
    """

    clock: Clock = SYSTEM

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The api-server builds executors too, only to read logs: nothing here may start a thread.
        super().__init__(*args, **kwargs)
        self._runtime: Runtime | None = None
        self._stopped = False  # end() or terminate() has finished
        self._mailbox = Mailbox(self.clock)
        self._output = ChildOutput(describe, clock=self.clock)
        self._states: dict[WorkloadKey, States] = {}
        self._serials = itertools.count()
        self._config = ExecutorConfig()
        self._server = ""
        self._argv: tuple[str, ...] = ()
        self._learn_dir = ""  # where task processes record what they import (preload = auto)
        self._title_prefix = ""
        self._budget = PrefetchBudget(parallelism=self.parallelism, maximum=0, queued_timeout=0.0)
        self._prefetch_logged = 0
        self._task_log_folder = ""
        self._journal: journal.LaunchJournal | None = None
        self._status: status.StatusWriter | None = None
        self._containment: Containment | None = None
        self._thresholds = Thresholds()
        self._metrics = Metrics()
        self._ignored_keys: set[str] = set()  # unknown executor_config keys already warned about

    def _accept(
        self,
        key: WorkloadKey,
        running: WorkloadState | None,
        success: WorkloadState,
        failure: WorkloadState,
        label: str,
        log_path: str | None,
    ) -> Ticket:
        """Record a workload the loop is about to get; returns its submission's key."""
        ticket = Ticket(key, next(self._serials))
        self._states[key] = States(ticket, running, success, failure, label, log_path, self.clock.time())
        return ticket

    def _request(self, ticket: Ticket, label: str, checked: Checked) -> LaunchRequest:
        """The launch of an accepted workload, from what validation checked (both Airflow majors)."""
        return LaunchRequest(
            key=ticket,
            argv=self._argv,
            stdin=checked.payload,
            label=label,
            timeout=checked.timeout,
            group=checked.group,
            limits=checked.limits,
            source=checked.source,
        )

    def _submit(self, requests: list[LaunchRequest]) -> None:
        if self._runtime is None:
            raise RuntimeError("AsyncLocalExecutor.start() was not called")
        if requests:
            self._runtime.submit(requests)

    def _finish(self, key: WorkloadKey, states: States, outcome: Outcome, tail: Sequence[str]) -> None:
        cleanup = outcome.cleanup
        if cleanup is not None and cleanup.oom_kills:
            # The task's own log is where its author looks; the kernel's kill leaves no line there.
            self._tell(key, f"The executor saw this task's process killed: {outcome.reason}", states.log_path)
        if outcome.ok:
            info = None
            if outcome.reason:  # the task process was OOM-killed, its supervisor exited cleanly
                log.error("workload %s: %s", states.label, outcome.reason)
                info = outcome.reason
            elif cleanup is not None and cleanup.killed:
                info = f"{cleanup.killed} process(es) the task left running were killed"
                log.info("workload %s ended; %s", states.label, info)
            self.change_state(key, states.success, info=info)
            return
        if _ti_gone(key, outcome):
            # Its task instance was cleared (it has a new id) while this workload started or ran. The
            # scheduler applies an event to whichever task instance holds the key now: a failure would
            # fail the cleared one, which waits in RESTARTING for the end of this try; an ended workload
            # is what lets it run again, as for a running task a clear stops. get_event_buffer() drops
            # the event if the task instance is not restarting (see cleared_exits).
            log.info("workload %s: %s; reported as ended, not failed", states.label, TI_GONE)
            self.change_state(key, states.success, info=TI_GONE)
            return
        reason = outcome.reason
        if outcome.kind is OutcomeKind.EXITED:
            reason = _EXIT_REASONS.get(outcome.returncode or 0, reason)
        if outcome.kind in (OutcomeKind.LAUNCH_FAILED, OutcomeKind.NOT_STARTED):
            self._not_launched(key, states.label, states.failure, reason, states.log_path)
            return
        if tail:
            log.error(
                "workload %s failed: %s; its last %d output lines:\n\t%s",
                states.label,
                reason,
                len(tail),
                "\n\t".join(tail),
            )
        else:
            log.error("workload %s failed: %s", states.label, reason)
        self.change_state(key, states.failure, info=reason)

    def _not_launched(
        self, key: WorkloadKey, label: str, failure: WorkloadState, why: str, log_path: str | None
    ) -> None:
        # It never ran, so nothing else will say why: the task's log, Airflow's audit log and one
        # scheduler line do, and the task is failed as never launched, not as having run.
        reason = f"not launched: {why}"
        if isinstance(key, TaskInstanceKey):
            if AIRFLOW_V3:
                self.log_task_event(event="executor launch failed", extra=reason, ti_key=key)
            self._tell(
                key, f"The executor could not run this task: {reason}", log_path, "executor launch failed"
            )
        self.log.error("workload %s failed: %s", label, reason)
        self.change_state(key, failure, info=reason)

    def _tell(self, key: WorkloadKey, message: str, log_path: str | None, audit: str = "") -> None:
        """Append ``message`` to the task's own log (and Airflow 2's audit log as ``audit``), off this thread."""
        if (
            not isinstance(key, TaskInstanceKey)
            or not self._task_log_folder
            or not (log_path or not AIRFLOW_V3)
        ):
            return
        write = functools.partial(_tell_the_task, self._task_log_folder, log_path, key, message, audit)
        runtime = self._runtime
        if runtime is not None and runtime.alive:
            runtime.run_blocking(write)  # file I/O: never on the scheduler's thread
        else:
            write()  # shutting down: end() already waits, and nothing else needs the thread

    def _checked(
        self,
        key: WorkloadKey,
        label: str,
        failure: WorkloadState,
        log_path: str | None,
        checked: Checked | str,
    ) -> Checked | None:
        """``checked`` when the task's values are valid; else None, and the task failed, unlaunched, with
        the reason."""
        if isinstance(checked, str):
            self._not_launched(key, label, failure, checked, log_path)
            return None
        for name in checked.ignored:
            # Once each, as every task of a DAG may carry it; and only so many, as keys a DAG generates
            # would otherwise grow this set for as long as the scheduler runs.
            if name not in self._ignored_keys and len(self._ignored_keys) < _IGNORED_KEYS_WARNED:
                self._ignored_keys.add(name)
                log.warning(
                    'executor_config["%s"] has %s (on %s and maybe others), which this version does not '
                    "know: ignored (known: %s)",
                    SECTION,
                    name,
                    label,
                    ", ".join(KNOWN_KEYS),
                )
        return checked

    @contextlib.contextmanager
    def _last_resort(
        self, key: WorkloadKey, label: str, failure: WorkloadState, log_path: str | None = None
    ) -> Iterator[None]:
        """Fail this one workload, unlaunched, when taking it in raises.

        A bug of ours, or a value nothing foresaw, must cost one task, not the scheduler: an exception out
        of heartbeat() stops it, and the parent-death chain takes every running task with it.
        """
        try:
            yield
        except Exception as exc:
            log.error("internal error taking in workload %s; failing it", label, exc_info=exc)
            self._states.pop(key, None)  # accepted but never submitted: no event will come for it
            if key not in self.running:  # it already has its final event
                return
            reason = f"internal error: {shown(exc)}"
            try:
                self._not_launched(key, label, failure, reason, log_path)
            except Exception as again:  # noqa: BLE001 - the event still goes out, without the task log
                log.error("cannot report workload %s as not launched: %s", label, shown(again))
                self.change_state(key, failure, info=f"not launched: {reason}")

    def _reporting_failed(self, ticket: Ticket, final: bool, exc: Exception) -> None:
        """Last resort for an event whose handling raised in sync(): a final event that was not given is,
        as a failure; a start is only logged (the workload runs on, and its end will come)."""
        log.error("internal error reporting workload %s", describe(ticket), exc_info=exc)
        key = cast("WorkloadKey", ticket.key)
        states = self._states.get(key)
        if not final or states is None or states.ticket != ticket:
            return  # a start, a revoked submission, or one whose final event was given
        del self._states[key]
        if key in self.running:
            self.change_state(key, states.failure, info=f"internal error: {shown(exc)}")
