"""The Airflow adapter's one executor class: workloads in, events out.

:class:`AsyncLocalExecutor` is the only class Airflow loads. It owns what it keeps per workload
(:mod:`~async_local_executor.adapter.submissions`), and composes the rest: what differs between Airflow
majors in taking a workload in and telling its task (:mod:`~async_local_executor.adapter.intake`),
the prefetch (:mod:`~async_local_executor.adapter.slots`), the health verdict and SIGUSR2's dump
(:mod:`~async_local_executor.adapter.diagnostics`), the pacing of cleared task instances' exits
(:mod:`~async_local_executor.adapter.cleared_exits`), the task workloads handed over to it and by it
(:class:`~async_local_executor.adapter.adoption.Handovers`) and the metrics. Its start is
:mod:`~async_local_executor.adapter.startup`'s: the options read and checked, then the core built.

Rule: the scheduler's thread only appends to in-process structures and reads what the loop thread
published; it never writes to a pipe a worker must drain, and never waits on a child. Every hook
Airflow 2 or 3 calls is a method here, each major's beside the other.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

from airflow.configuration import conf as airflow_conf
from airflow.executors.base_executor import BaseExecutor
from airflow.models.taskinstancekey import TaskInstanceKey
from airflow.utils.state import TaskInstanceState

from async_local_executor.adapter import adoption, intake, scheduler_helpers, startup, stop_signals
from async_local_executor.adapter.cleared_exits import TI_GONE, ClearedExitGate
from async_local_executor.adapter.compat import AIRFLOW_V3, executor_conf
from async_local_executor.adapter.config import SECTION, SHUTDOWN_MARGIN, ExecutorConfig
from async_local_executor.adapter.diagnostics import Diagnostics
from async_local_executor.adapter.intake import Incoming
from async_local_executor.adapter.live_control import LiveControl
from async_local_executor.adapter.metadata_db import (
    ExecutorScope,
    requeue_unreachable,
    restarting_task_instances,
)
from async_local_executor.adapter.metrics import Metrics
from async_local_executor.adapter.output_relay import OutputRelay
from async_local_executor.adapter.slots import Prefetch
from async_local_executor.adapter.submissions import Mailbox, Started, Submission, Ticket, describe
from async_local_executor.adapter.validation import KNOWN_KEYS, Checked, shown
from async_local_executor.adapter.workload import entry
from async_local_executor.core.cgroups import Containment
from async_local_executor.core.clock import SYSTEM, Clock
from async_local_executor.core.errors import RuntimeNotRunning
from async_local_executor.core.health import Health, Report
from async_local_executor.core.launchers.base import LaunchRequest
from async_local_executor.core.outcome import Outcome, OutcomeKind
from async_local_executor.core.prefetch import PrefetchBudget
from async_local_executor.core.runtime import Runtime
from async_local_executor.ops import journal, status

if TYPE_CHECKING:
    from airflow.cli.cli_config import GroupCommand
    from airflow.executors.workloads import ExecutorWorkload
    from airflow.executors.workloads.types import WorkloadKey, WorkloadState
    from airflow.models.taskinstance import TaskInstance

log = logging.getLogger(__name__)


def _requeue_in_thread(keys: list[Any], job_id: int | str, scope: ExecutorScope) -> None:
    """A worker thread of the loop: the update may wait on a row lock the scheduler's session holds."""
    done = requeue_unreachable(keys, job_id, scope)
    for key in done.scheduled:
        log.info(
            "task instance %s: queued under an id no workload has, put back to scheduled, as the "
            "scheduler does with a task stuck in queued",
            describe(key),
        )
    for key in done.reset:
        log.info(
            "task instance %s: running (or restarting) under an id no workload has, put to no state, as "
            "the scheduler does when a cleared running task's workload ends: it runs again as a new try",
            describe(key),
        )
    for key, executor in done.foreign.items():
        log.info(
            "task instance %s: queued or running under an id no workload of this executor has, left as it "
            "is: its row is for %s, which may be running it",
            describe(key),
            executor,
        )


def _may_be_cleared_exit(key: object, event: Any) -> bool:
    # The scheduler restarts a cleared task instance on a success event only.
    return isinstance(key, TaskInstanceKey) and event[0] == TaskInstanceState.SUCCESS


_EXIT_REASONS = {
    entry.EXIT_CRASHED: "workload process crashed (its traceback is in the scheduler log)",
    entry.EXIT_BAD_INPUT: "workload process could not read its workload (see the scheduler log)",
    entry.EXIT_ORPHANED: "workload process found the executor gone before it started",
}
_IGNORED_KEYS_WARNED = 100


def _ti_gone(key: object, outcome: Outcome) -> bool:
    return (
        isinstance(key, TaskInstanceKey)
        and outcome.kind is OutcomeKind.EXITED
        and outcome.returncode == entry.EXIT_TI_GONE
    )


class AsyncLocalExecutor(BaseExecutor):
    """Runs each workload as its own process, supervised by an event loop on a dedicated thread.

    :attr clock: the time the executor and everything it builds reads; a test overrides it in a
        subclass to drive time by hand
    """

    clock: Clock = SYSTEM

    is_local: bool = True
    serve_logs: bool = True
    supports_callbacks: bool = True
    supports_connection_test: bool = True
    supports_multi_team: bool = True
    team_name: str | None = None  # Airflow 3 sets it per instance; Airflow 2 has no teams

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The api-server builds executors too, only to read logs: nothing here may start a thread.
        super().__init__(*args, **kwargs)
        self._runtime: Runtime | None = None
        self._stopped = False  # end() or terminate() has finished
        self._mailbox = Mailbox(self.clock)
        self._output = OutputRelay(describe, clock=self.clock)
        self._submissions: dict[WorkloadKey, Submission] = {}
        self._serials = itertools.count()
        self._config = ExecutorConfig()
        self._settings: startup.Settings | None = None
        self._argv: tuple[str, ...] = ()
        self._server = ""
        self._title_prefix = ""
        self._task_log_folder = ""
        self._prefetch = Prefetch(
            PrefetchBudget(parallelism=self.parallelism, maximum=0, queued_timeout=0.0), self.clock
        )
        self._diagnostics = Diagnostics(self.clock)
        self._journal: journal.LaunchJournal | None = None
        self._status: status.StatusWriter | None = None
        self._containment: Containment | None = None
        self._metrics = Metrics()
        self._ignored_keys: set[str] = set()  # unknown executor_config keys already warned about
        self._live: LiveControl | None = None  # pause, drain and resize (adapter/live_control)
        self._unstarted: set[WorkloadKey] = set()  # task workloads handed to the loop, not started yet
        self._last_start = 0.0  # monotonic: when a start was last read from the loop
        self._probing = False  # Airflow asks for slots to start connection tests, which no pause holds
        # Workloads handed over to this executor and by it (see adapter/adoption).
        self._handovers = adoption.Handovers(self.clock, self._submissions, self._new_ticket)
        self._cleared_exits = ClearedExitGate(
            restarting_task_instances, is_candidate=_may_be_cleared_exit, on_unreachable=self._requeue
        )

    def start(self) -> None:
        stop_signals.arm()
        settings = startup.prepare(
            executor_conf(self),
            airflow_conf,
            parallelism=self.parallelism,
            team=self.team_name,
            fork_target=self._fork_target(),
        )
        self._settings = settings
        self._config = config = settings.config
        self._argv = self._child_argv()
        self._server, self._title_prefix = settings.server, settings.title_prefix
        self._task_log_folder = settings.task_log_folder
        if settings.timeout is not None:
            log.info("%s", settings.timeout.describe())
        self._live = live = LiveControl(
            settings.state_dir,
            self.team_name,
            parallelism=self.parallelism,
            queues=dict(config.queue_limits),
            terminates=not config.hands_over,
            stop_running=self._stop_tasks,
            clock=self.clock,
        )
        built = startup.build(
            settings,
            startup.Callbacks(
                self._mailbox,
                self._output,
                self._on_report,
                self._handovers.launch_record,
                self._handovers.holding.claimed_pid,
                live.fields,
            ),
            team=self.team_name,
            executor=type(self).__name__,
            parallelism=self.parallelism,
            clock=self.clock,
        )
        self._journal, self._containment, self._status = built.journal, built.containment, built.status
        self._handovers.open(
            state_dir=settings.state_dir,
            journal=built.journal,
            owner_key=settings.owner_key,
            hold_bound=settings.hold_bound,
            handover_timeout=config.handover_timeout,
        )
        self._metrics = Metrics(
            executor_class=type(self).__name__,
            team=self.team_name,
            qualify=self._get_metric_name if AIRFLOW_V3 else None,
        )
        wired = built.wired
        self._prefetch = Prefetch(wired.budget, self.clock)
        self._diagnostics.thresholds = wired.thresholds
        self._runtime = wired.runtime
        self._runtime.start()
        live.start(self._runtime)  # before the first heartbeat can hand a task over
        self.parallelism = self._prefetch.budget.parallelism = live.parallelism
        self._handovers.hold(built.held, self._runtime)
        room = settings.room
        self.log.info(
            "AsyncLocalExecutor started: parallelism=%d, prefetch=%d, queue limits=%s, memory floor=%g MB, "
            "launcher=%s, event loop=%s, %s",
            self.parallelism,
            wired.budget.maximum,
            ",".join(f"{q}:{n}" for q, n in config.queue_limits) or "none",
            config.min_available_memory_mb,
            config.launcher.value,
            "uvloop" if wired.use_uvloop else "asyncio",
            room.describe(),
        )
        if not room.enough:
            self.log.warning("%s", room.describe())
        # Last: on Airflow 2 the scheduler forks its DAG file processor manager next.
        scheduler_helpers.unshare_db_connections()
        if not AIRFLOW_V3:
            scheduler_helpers.tie_to_scheduler()

    def _child_argv(self) -> tuple[str, ...]:
        """The command that runs one workload; it reads the workload (or Airflow 2 command) from stdin."""
        assert self._settings is not None
        return self._settings.argv

    def _new_ticket(self, key: WorkloadKey) -> Ticket:
        return Ticket(key, next(self._serials))

    def _fork_target(self) -> str:
        """What a fork-server child runs: ``module:function`` taking ``(argv, stdin_bytes)``."""
        return intake.fork_target()

    # Taking workloads in: Airflow 3's hook, then Airflow 2's (each major calls only its own).

    def _process_workloads(self, workload_items: Sequence[ExecutorWorkload]) -> None:
        """Airflow 3's hand-over: workload objects (tasks, callbacks, connection tests), in one batch."""
        if self._runtime is None:  # before any leaves its queue, so none is lost
            raise RuntimeError("AsyncLocalExecutor.start() was not called")
        requests = []
        for workload in workload_items:
            # Each queue is typed by its own key kind; the key's kind already says which one holds it.
            key: Any = workload.key
            intake.dequeue(key, self.queued_tasks, self.queued_callbacks, self.queued_connection_tests)
            # Stock 3.3 never fills `running`, so parallelism limits nothing there; we do, so open_slots
            # is the truth and the scheduler stops handing us work once every slot is taken.
            self.running.add(key)
            label, log_path = describe(key), getattr(workload, "log_path", None)
            with self._last_resort(key, label, workload.failure_state, log_path):
                incoming = intake.from_workload(
                    workload,
                    label,
                    log_path,
                    default_timeout=self._config.task_timeout,
                    server=self._server,
                    prefix=self._title_prefix,
                )
                if (request := self._launch_request(incoming)) is not None:
                    requests.append(request)
        self._submit(requests)

    def _process_tasks(self, task_tuples: Sequence[tuple[Any, list[str], str | None, Any]]) -> None:
        """Airflow 2's hand-over: its ``trigger_tasks`` passes ``airflow tasks run`` commands in batches."""
        requests = []
        for key, command, queue, executor_config in task_tuples:
            self.queued_tasks.pop(key, None)
            if (request := self._command_request(key, command, queue, executor_config)) is not None:
                requests.append(request)
        self._submit(requests)

    def execute_async(
        self, key: Any, command: list[str], queue: str | None = None, executor_config: Any = None
    ) -> None:
        """Airflow 2's hand-over of one task; _process_tasks batches them, this serves direct callers."""
        if (request := self._command_request(key, command, queue, executor_config)) is not None:
            self._submit([request])

    def _command_request(
        self, key: Any, command: list[str], queue: str | None, executor_config: Any
    ) -> LaunchRequest | None:
        self.running.add(key)
        label = describe(key)
        with self._last_resort(key, label, TaskInstanceState.FAILED):
            incoming = intake.from_command(
                key,
                label,
                command,
                queue,
                executor_config,
                default_timeout=self._config.task_timeout,
                prefix=self._title_prefix,
            )
            return self._launch_request(incoming)
        return None  # the last resort failed it

    def cleanup_stuck_queued_tasks(self, tis: list[TaskInstance]) -> list[str]:
        """The deprecated hook for tasks stuck in queued, for Airflow 2 schedulers without revoke_task.

        Each is revoked (stopped if it started, forgotten either way) and failed for the scheduler
        to retry or fail, as the deprecated contract says; returns a line per task for its warning.
        """
        readable = []
        for ti in tis:
            self.revoke_task(ti=ti)
            self.fail(ti.key, info="stuck in queued")
            readable.append(repr(ti))
        return readable

    def _launch_request(self, incoming: Incoming) -> LaunchRequest | None:
        """Accept a workload Airflow handed in and say how it launches; None when it is invalid (it is then
        failed, unlaunched, with why)."""
        checked = self._checked(incoming)
        if checked is None:
            return None
        ticket = self._new_ticket(incoming.key)
        self._handovers.submitted(incoming.key)
        task = isinstance(incoming.key, TaskInstanceKey)
        self._submissions[incoming.key] = Submission(
            ticket,
            incoming.running,
            incoming.success,
            incoming.failure,
            incoming.label,
            incoming.log_path,
            self.clock.time(),
            incoming.ti_id,
            checked.timeout,
        )
        if task:
            self._unstarted.add(incoming.key)
            if self._live is not None and self._live.holds_back:
                self._tell_held_back(incoming.key)
        return LaunchRequest(
            key=ticket,
            argv=self._argv,
            stdin=checked.payload,
            label=incoming.label,
            timeout=checked.timeout,
            group=checked.group,
            limits=checked.limits,
            source=checked.source,
            # A pause holds tasks back; a callback or a connection test is short, and must not wait on it.
            pausable=task,
        )

    def _checked(self, incoming: Incoming) -> Checked | None:
        """What the task launches with when its values are valid; else None, and the task failed,
        unlaunched, with the reason."""
        checked = incoming.checked
        if isinstance(checked, str):
            self._not_launched(incoming.key, incoming.label, incoming.failure, checked, incoming.log_path)
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
                    incoming.label,
                    ", ".join(KNOWN_KEYS),
                )
        return checked

    def _submit(self, requests: list[LaunchRequest]) -> None:
        if self._runtime is None:
            raise RuntimeError("AsyncLocalExecutor.start() was not called")
        if requests:
            self._runtime.submit(requests)

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
            self._submissions.pop(key, None)  # accepted but never submitted: no event will come for it
            self._unstarted.discard(key)
            if key not in self.running:  # it already has its final event
                return
            reason = f"internal error: {shown(exc)}"
            try:
                self._not_launched(key, label, failure, reason, log_path)
            except Exception as again:  # noqa: BLE001 - the event still goes out, without the task log
                log.error("cannot report workload %s as not launched: %s", label, shown(again))
                self.change_state(key, failure, info=f"not launched: {reason}")

    # Slots, as the scheduler sees them: the prefetch on top of Airflow's count.

    @property
    def slots_available(self) -> int:
        live = self._live
        if live is not None and live.holds_starts and not self._probing:
            # Paused or draining: Airflow keeps its task instances scheduled, out of task_queued_timeout.
            return 0
        return int(super().slots_available) + self._prefetch.allowed()

    # The scheduler itself queues no more than [core] parallelism minus what every executor holds
    # (slots_occupied). Prefetched workloads wait for one of our slots and hold none of parallelism's,
    # so up to the prefetch they are not counted; counted, the prefetch could never fill.
    # A live resize above the configured parallelism is room the scheduler's own cap ([core] parallelism
    # over every executor together) would not give: it is reported as room here too.
    @property
    def slots_occupied(self) -> int:
        live = self._live
        # parallelism 0 is no limit: nothing to raise it over
        raised = max(0, live.parallelism - live.configured) if live is not None and live.configured else 0
        return max(0, int(super().slots_occupied) - self._prefetch.allowed() - raised)

    def heartbeat(self) -> None:
        # The scheduler loop calls this between its database calls: a stop signal held while it was
        # inside one is delivered here, before and after this executor's own work (stop_signals).
        stop_signals.hold()
        stop_signals.deliver_held()
        self._follow_control()
        super().heartbeat()
        self._follow_drain()
        stop_signals.deliver_held()

    def _follow_control(self) -> None:
        """Apply a change of live control (adapter/live_control); a pause tells each task it holds back."""
        live, runtime = self._live, self._runtime
        if live is None or runtime is None or not runtime.alive:
            return
        if live.poll(runtime):
            self.parallelism = self._prefetch.budget.parallelism = live.parallelism
            self._metrics.control(live.control.mode, live.parallelism)
            if live.holds_back:
                for key in self._unstarted:
                    self._tell_held_back(key)

    def _follow_drain(self) -> None:
        """After the scheduler's events were read (sync): a drain's end, or its deadline."""
        live, runtime = self._live, self._runtime
        # Every heartbeat calls this: without a drain to follow, it looks at nothing.
        if live is None or not live.following or runtime is None or not runtime.alive:
            return
        running: list[str] = []
        waiting: list[str] = []
        for key, submission in self._submissions.items():
            if isinstance(key, TaskInstanceKey):
                (waiting if key in self._unstarted else running).append(submission.label)
        live.follow_drain(runtime.report, running, waiting, since=self._last_start)

    def _tell_held_back(self, key: WorkloadKey) -> None:
        live, submission = self._live, self._submissions.get(key)
        if live is not None and submission is not None:
            log.info("workload %s waits: the executor is %s", submission.label, live.control.describe())
            self._tell(key, live.waiting_note(), submission.log_path)

    def _stop_tasks(self) -> None:
        """At a drain's deadline (on_stop = terminate): stop every task workload, started or waiting."""
        runtime = self._runtime
        if runtime is None:
            return
        for key, submission in list(self._submissions.items()):
            if isinstance(key, TaskInstanceKey):
                runtime.stop(submission.ticket, "stopped at the drain's deadline (on_stop = terminate)")

    def trigger_tasks(self, open_slots: int) -> None:
        live = self._live
        # Tasks a pause holds back hold no slot of the loop's: a callback may still go past them.
        held = len(self._unstarted) if live is not None and live.holds_back else 0
        super().trigger_tasks(open_slots + self._prefetch.allowed() + held)

    def trigger_connection_tests(self) -> None:
        # Airflow 3 starts connection tests only while slots_available is positive: no pause holds them.
        self._probing = True
        try:
            super().trigger_connection_tests()
        finally:
            self._probing = False

    # Events back to the scheduler.

    def sync(self) -> None:
        runtime = self._runtime
        if runtime is not None and not runtime.alive:
            # Raising out of the scheduler's loop makes the scheduler exit non-zero, so systemd or
            # Kubernetes restarts it, instead of it accepting work that nothing would ever run.
            log.critical("the executor's event loop thread is dead; stopping the scheduler")
            raise RuntimeNotRunning(
                "the executor's event loop thread died; see the CRITICAL log line before this one"
            ) from runtime.failure
        self._handovers.expire(runtime)
        events = self._mailbox.events
        ended = False
        while events:
            event = events.popleft()
            ticket = cast("Ticket", event.key)
            try:
                ended |= self._report(ticket, event)
            except Exception as exc:  # noqa: BLE001 - one workload's event, not the scheduler's loop
                self._reporting_failed(ticket, not isinstance(event, Started), exc)
        if ended:
            self._prefetch.log_change()

    def _report(self, ticket: Ticket, event: Started | Outcome) -> bool:
        """Tell Airflow of one event; True when a workload ended."""
        key = cast("WorkloadKey", ticket.key)
        # Revoked ones too: until their process ends, they hold a slot like any other.
        ended = self._prefetch.note(ticket, event)
        tail = [] if isinstance(event, Started) else self._output.pop(ticket)
        submission = self._submissions.get(key)
        if submission is not None and submission.ticket == ticket:
            self._unstarted.discard(key)
            if isinstance(event, Started):
                self._last_start = self.clock.monotonic()
        if submission is None or submission.ticket != ticket:
            # A revoked submission: the scheduler already decided this try's fate, and Airflow's
            # revoke_task contract forbids an executor event for it.
            if not isinstance(event, Started):
                log.info("revoked workload %s ended: %s", describe(ticket), event.reason or "exit 0")
            return ended
        if isinstance(event, Started):
            if not self._handovers.holding.is_held(key):
                self._metrics.launch_latency(event.at - submission.accepted)
            if submission.running is not None:
                self.change_state(key, submission.running, remove_running=False)
            return ended
        if self._handovers.holding.is_held(key):
            # Airflow has not offered its task instance yet: the end waits for that (adapter/adoption).
            self._handovers.holding.keep_end(cast("TaskInstanceKey", key), event)
            return ended
        self._deliver(key, submission, event, tail)
        return ended

    def _deliver(
        self, key: WorkloadKey, submission: Submission, outcome: Outcome, tail: Sequence[str]
    ) -> None:
        self._finish(key, submission, outcome, tail)
        del self._submissions[key]  # after its final event: until then, a failure here still gives one
        if self._handovers.holding.was_claimed(key):
            log.info("adopted workload %s ended: %s", submission.label, outcome.reason or "exit 0")
        self._handovers.ended(key)
        self._metrics.final_event(outcome, gone=_ti_gone(key, outcome))

    def _finish(
        self, key: WorkloadKey, submission: Submission, outcome: Outcome, tail: Sequence[str]
    ) -> None:
        cleanup = outcome.cleanup
        if cleanup is not None and cleanup.oom_kills:
            # The task's own log is where its author looks; the kernel's kill leaves no line there.
            self._tell(
                key, f"The executor saw this task's process killed: {outcome.reason}", submission.log_path
            )
        if outcome.ok:
            info = None
            if outcome.reason:  # the task process was OOM-killed, its supervisor exited cleanly
                log.error("workload %s: %s", submission.label, outcome.reason)
                info = outcome.reason
            elif cleanup is not None and cleanup.killed:
                info = f"{cleanup.killed} process(es) the task left running were killed"
                log.info("workload %s ended; %s", submission.label, info)
            self.change_state(key, submission.success, info=info)
            return
        if _ti_gone(key, outcome):
            # Its task instance was cleared (it has a new id) while this workload started or ran. The
            # scheduler applies an event to whichever task instance holds the key now: a failure would
            # fail the cleared one, which waits in RESTARTING for the end of this try; an ended workload
            # is what lets it run again, as for a running task a clear stops. get_event_buffer() drops
            # the event if the task instance is not restarting (see cleared_exits).
            log.info("workload %s: %s; reported as ended, not failed", submission.label, TI_GONE)
            self.change_state(key, submission.success, info=TI_GONE)
            return
        reason = outcome.reason
        if outcome.kind is OutcomeKind.EXITED:
            reason = _EXIT_REASONS.get(outcome.returncode or 0, reason)
            if outcome.returncode == entry.EXIT_CRASHED and self._handovers.holding.was_claimed(key):
                # It crashed after its handover: its own output reached no scheduler, and it wrote the
                # traceback to its task's log instead (core/custody.py, Custody.tell).
                reason = "workload process crashed after its handover (its traceback is in the task's log)"
        if outcome.kind in (OutcomeKind.LAUNCH_FAILED, OutcomeKind.NOT_STARTED):
            self._not_launched(key, submission.label, submission.failure, reason, submission.log_path)
            return
        if tail:
            log.error(
                "workload %s failed: %s; its last %d output lines:\n\t%s",
                submission.label,
                reason,
                len(tail),
                "\n\t".join(tail),
            )
        else:
            log.error("workload %s failed: %s", submission.label, reason)
        self.change_state(key, submission.failure, info=reason)

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
        write = functools.partial(intake.tell_the_task, self._task_log_folder, log_path, key, message, audit)
        runtime = self._runtime
        if runtime is not None and runtime.alive:
            runtime.run_blocking(write)  # file I/O: never on the scheduler's thread
        else:
            write()  # shutting down: end() already waits, and nothing else needs the thread

    def _reporting_failed(self, ticket: Ticket, final: bool, exc: Exception) -> None:
        """Last resort for an event whose handling raised in sync(): a final event that was not given is,
        as a failure; a start is only logged (the workload runs on, and its end will come)."""
        log.error("internal error reporting workload %s", describe(ticket), exc_info=exc)
        key = cast("WorkloadKey", ticket.key)
        submission = self._submissions.get(key)
        if not final or submission is None or submission.ticket != ticket:
            return  # a start, a revoked submission, or one whose final event was given
        del self._submissions[key]
        self._unstarted.discard(key)
        if key in self.running:
            self.change_state(key, submission.failure, info=f"internal error: {shown(exc)}")

    def get_event_buffer(self, dag_ids: Any = None) -> dict[WorkloadKey, Any]:
        events: dict[WorkloadKey, Any] = super().get_event_buffer(dag_ids)
        if AIRFLOW_V3:  # Airflow 2 does not restart cleared task instances through these events
            # Held ones go back to the buffer, so the scheduler's next loop reads them (see cleared_exits).
            self.event_buffer.update(self._cleared_exits.hold_back(events))
        return events

    def _requeue(self, keys: list[Any]) -> None:
        """Put back the task instances of these gone workloads that no workload can run.

        Each is queued or running (if it still is) under an id no workload has; unless the scheduler has
        handed this executor a workload for the key since, nothing would run it before [scheduler]
        task_queued_timeout, or end it before the scheduler's heartbeat timeout fails it.
        """
        runtime, job_id = self._runtime, self.job_id
        orphans = [key for key in keys if key not in self._submissions and key not in self.queued_tasks]
        if not orphans or runtime is None or job_id is None:
            return
        try:
            scope = ExecutorScope.of(self)
        except Exception:  # left queued: the scheduler's own timeout still applies
            log.exception("cannot tell which task instances are this executor's; none is put back")
            return
        runtime.run_blocking(functools.partial(_requeue_in_thread, orphans, job_id, scope))

    def _on_report(self, report: Report) -> None:
        """Every health report, on the loop thread: must not block."""
        self._metrics.report(report)

    # What the executor says about itself.

    def get_health(self) -> Health:
        """Healthy, unhealthy (with reasons) or unknown; never waits, safe from any thread."""
        return self._diagnostics.health(self._runtime, stopped=self._stopped)

    def debug_dump(self) -> None:
        """SIGUSR2 to the scheduler: Airflow's queues, then this executor's health and workloads."""
        super().debug_dump()  # type: ignore[no-untyped-call]
        self._diagnostics.dump(self.get_health(), self._runtime)

    @staticmethod
    def get_cli_commands() -> list[GroupCommand]:
        """``airflow async-local-executor status`` (Airflow also finds it through the provider info)."""
        from async_local_executor.adapter.provider import get_cli_commands

        return get_cli_commands()

    # Stopping: one workload, or all of them.

    def revoke_task(self, *, ti: TaskInstance) -> None:
        """Forget ``ti``'s workload and stop its process if it has one; no event, as Airflow requires.

        The scheduler revokes tasks stuck in queued, then requeues or fails them itself.
        """
        key = ti.key
        if self.queued_tasks.pop(key, None) is not None:
            self.log.info("revoked %s before it reached the executor's loop", describe(key))
            return
        submission = self._submissions.pop(key, None)
        self._unstarted.discard(key)
        self.running.discard(key)
        self._handovers.ended(key)
        if submission is None or self._runtime is None:
            return
        self.log.info("revoking %s: stopping it if it started", submission.label)
        try:
            self._runtime.stop(submission.ticket, "revoked by the scheduler")
        except RuntimeNotRunning:
            self.log.exception("cannot stop revoked workload %s", submission.label)

    def try_adopt_task_instances(self, tis: Sequence[TaskInstance]) -> Sequence[TaskInstance]:
        """Adopt the task instances whose workloads a stopped scheduler handed over to this one.

        Airflow offers the task instances a dead scheduler job left queued or running; those whose
        workload this executor holds (still running as recorded, see adapter/adoption) are adopted,
        the rest are returned for the scheduler to reset, as every executor that adopts nothing does.
        Asked again with the same task instances (Airflow retries the call when its database
        transaction failed), it gives the same answer, and no end twice.
        """
        stop_signals.hold()  # Airflow 2 installs its stop handlers after start(), before its first adoption
        unknown = {ti.key for ti in tis if not self._handovers.holding.knows(ti.key)}
        if self._config.hands_over and unknown and self._runtime is not None:
            # A scheduler that stopped after this one started (its journal was locked at the start)
            # may have handed them over: held now, they are adopted instead of run twice.
            self._handovers.reclaim_for(unknown, self._runtime)
        refused: list[TaskInstance] = []
        adopted = 0
        for ti in tis:
            if not self._handovers.holding.claim(ti.key):
                refused.append(ti)
                continue
            adopted += 1
            submission = self._submissions.get(ti.key)
            if submission is None:
                continue  # its end was given at an earlier offer
            self.running.add(ti.key)
            ended = self._handovers.holding.take_end(ti.key)
            if ended is not None:
                self._deliver(ti.key, submission, ended, ())
        if tis:
            log.info(
                "adopted %d task instance(s) whose workloads were handed over to this scheduler; %d others "
                "are left for the scheduler to reset",
                adopted,
                len(refused),
            )
        return refused

    def end(self) -> None:
        stop_signals.release()
        if self._config.hands_over:
            self._hand_over()
        else:
            self._shutdown(wait=self._config.shutdown_timeout)

    def _hand_over(self) -> None:
        """Stop, letting running task workloads live on for the next scheduler to adopt."""
        runtime = self._runtime
        if runtime is None:
            return
        config = self._config
        running = len(self.running) + len(self._handovers.holding.waiting())
        if running:
            self.log.info(
                "stopping: %d running workload(s) are handed over to the next scheduler on this host "
                "(on_stop = handover, handover_timeout = %.0fs); the others stop as at a shutdown",
                running,
                config.handover_timeout,
            )
        else:
            self.log.info("stopping: no workload runs, nothing to hand over")
        handovers = runtime.release(
            config.shutdown_timeout,
            timeout=config.shutdown_timeout
            + config.termination_grace_period
            + SHUTDOWN_MARGIN
            + adoption.CUSTODY_WAIT,
            which=adoption.a_task,
            settle=adoption.into_custody,
        )
        self._runtime = None
        self._stopped = True
        self.sync()  # the final events of what was stopped rather than handed over
        recorded = self._handovers.record(handovers)
        if recorded:
            self.log.info(
                "handed over %d running task workload(s); each kills itself (and what it started) if no "
                "scheduler adopts it within %.0fs",
                recorded,
                config.handover_timeout,
            )
        self._close(runtime, handed_over=recorded)

    def terminate(self) -> None:
        stop_signals.release()
        self._shutdown(wait=0.0)

    def _shutdown(self, wait: float) -> None:
        runtime = self._runtime
        if runtime is None:
            return
        self.log.info("shutting down: waiting up to %.0fs for %d running workloads", wait, len(self.running))
        # Past `wait` and the grace period, every process has been SIGKILLed; the margin covers reaping.
        runtime.shutdown(wait, timeout=wait + self._config.termination_grace_period + SHUTDOWN_MARGIN)
        self._runtime = None
        self._stopped = True
        self.sync()
        self._close(runtime, handed_over=None)

    def _close(self, runtime: Runtime, *, handed_over: int | None) -> None:
        """Let go of what a stopped executor kept on disk: its status file, its journal, its cgroups.

        :param handed_over: how many workloads a handover stop journalled; None for a shutdown
        """
        writer, self._status = self._status, None
        if writer is not None:
            writer.remove()
        left = runtime.alive or runtime.failure is not None
        self._handovers.close()
        launches, self._journal = self._journal, None
        if launches is not None:
            if not left and not handed_over:
                launches.close()  # every workload has its final event and its process is gone
            elif handed_over is not None:
                launches.hand_on()  # unlocked, not removed: the next executor's reclaim finds what is in it
            # else a shutdown whose loop did not stop cleanly: locked until this process exits, then reclaimed
        containment, self._containment = self._containment, None
        if containment is not None:
            # The populated ones (the handed-over workloads', what kill_leftover_processes = False left) stay
            # for their adopter or a reclaim.
            containment.close()
