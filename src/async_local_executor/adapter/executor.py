"""The Airflow adapter: workloads in, events out. Everything else lives in the Airflow-free core."""

from __future__ import annotations

import functools
import itertools
import logging
import os
import sys
import time
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from airflow.configuration import AIRFLOW_HOME
from airflow.executors.base_executor import BaseExecutor
from airflow.models.taskinstancekey import TaskInstanceKey
from airflow.utils.helpers import prune_dict
from airflow.utils.state import TaskInstanceState

from async_local_executor.adapter import child, child_cli, child_entry, tasklog
from async_local_executor.adapter.child_output import ChildOutput
from async_local_executor.adapter.cleared_exits import ClearedExitGate
from async_local_executor.adapter.compat import (
    AIRFLOW_V3,
    SAFE_CLIENT_TIMEOUT,
    CallbackKey,
    ConnectionTestKey,
    airflow2_audit,
    airflow2_log_path,
    child_client_env,
    execution_api_url,
    executor_conf,
    restarting_task_instances,
    stats,
)
from async_local_executor.adapter.config import EventLoop, ExecutorConfig, LauncherKind
from async_local_executor.core.errors import RuntimeNotRunning
from async_local_executor.core.health import Health, Probe, Report, Thresholds, Verdict, stale
from async_local_executor.core.launchers.base import Launcher, LaunchRequest
from async_local_executor.core.launchers.forkserver import ForkServerLauncher
from async_local_executor.core.launchers.subprocess import SubprocessLauncher
from async_local_executor.core.prefetch import PrefetchBudget
from async_local_executor.core.runtime import Runtime, uvloop_available
from async_local_executor.core.supervisor import MB, Outcome, OutcomeKind, Supervisor
from async_local_executor.core.termination import TerminationPolicy
from async_local_executor.ops import journal as registry
from async_local_executor.ops import status

if TYPE_CHECKING:
    from airflow.cli.cli_config import GroupCommand
    from airflow.executors.workloads import ExecutorWorkload
    from airflow.executors.workloads.types import WorkloadKey, WorkloadState
    from airflow.models.taskinstance import TaskInstance

log = logging.getLogger(__name__)

_EXIT_REASONS = {
    child.EXIT_CRASHED: "workload process crashed (its traceback is in the scheduler log)",
    child.EXIT_BAD_INPUT: "workload process could not read its workload (see the scheduler log)",
    child.EXIT_ORPHANED: "workload process found the executor gone before it started",
}


# Metric name suffixes of final events that are not a success.
_OUTCOME_NAMES = {OutcomeKind.EXITED: "failed", OutcomeKind.SIGNALLED: "killed"}


@dataclass(frozen=True)
class _Started:
    key: Hashable
    pid: int
    at: float  # wall clock, when the loop learnt the pid


@dataclass(frozen=True)
class _Ticket:
    """One submission of a workload: the loop's key for it.

    Airflow's key names the try, not the submission: after a revoke the scheduler may queue the same
    key again while the revoked process is still being stopped, and that process's outcome must not
    be taken for the new one's.
    """

    key: Hashable
    serial: int


@dataclass(frozen=True)
class _States:
    ticket: _Ticket
    running: WorkloadState | None
    success: WorkloadState
    failure: WorkloadState
    label: str
    log_path: str | None = None  # the task's log file, relative to [logging] base_log_folder
    accepted: float = 0.0  # wall clock, when the scheduler handed it over


class _Mailbox:
    """The supervisor's listener: runs on the loop thread and only appends to a deque."""

    def __init__(self) -> None:
        self.events: deque[_Started | Outcome] = deque()

    def started(self, key: Hashable, pid: int) -> None:
        self.events.append(_Started(key, pid, time.time()))

    def finished(self, outcome: Outcome) -> None:
        self.events.append(outcome)


def _may_be_cleared_exit(key: object, event: Any) -> bool:
    # The scheduler restarts a cleared task instance on a success event only.
    return isinstance(key, TaskInstanceKey) and event[0] == TaskInstanceState.SUCCESS


def describe(key: object) -> str:
    """A short name for a workload key, for log lines."""
    if isinstance(key, _Ticket):
        key = key.key
    if isinstance(key, TaskInstanceKey):
        mapped = f"[{key.map_index}]" if key.map_index >= 0 else ""
        return f"{key.dag_id}.{key.task_id}{mapped} try {key.try_number}"
    if isinstance(key, CallbackKey):
        return f"callback {key.id}"
    if isinstance(key, ConnectionTestKey):
        return f"connection-test {key.id}"
    return str(key)


def _tell_the_task(folder: str, relative: str | None, key: Any, reason: str) -> None:
    """Runs in a worker thread: on Airflow 2 this reads and writes the database."""
    if not AIRFLOW_V3:
        try:
            airflow2_audit(key, "executor launch failed", reason)
        except Exception:  # the scheduler log still has the reason
            log.exception("cannot record the launch failure of %s in the audit log", describe(key))
        try:
            relative = airflow2_log_path(key)
        except Exception:
            log.exception("cannot find the log file of %s", describe(key))
    if relative:
        message = f"The executor could not run this task: {reason}"
        tasklog.append_line(folder, relative, message, text=not AIRFLOW_V3)


class AsyncLocalExecutor(BaseExecutor):
    """Runs each workload as its own process, supervised by an event loop on a dedicated thread.

    The scheduler's thread only appends to in-process structures: it never writes to a pipe a worker
    must drain, and never waits on a child.
    """

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
        self._mailbox = _Mailbox()
        self._output = ChildOutput(describe)
        self._states: dict[WorkloadKey, _States] = {}
        self._serials = itertools.count()
        self._config = ExecutorConfig()
        self._server = ""
        self._argv: tuple[str, ...] = ()
        self._title_prefix = ""
        self._budget = PrefetchBudget(parallelism=self.parallelism, maximum=0, queued_timeout=0.0)
        self._prefetch_logged = 0
        self._task_log_folder = ""
        self._journal: registry.LaunchJournal | None = None
        self._status: status.StatusWriter | None = None
        self._thresholds = Thresholds()
        self._metric_tags: dict[str, str] = {}
        self._memory_waits_seen = 0
        self._cleared_exits = ClearedExitGate(restarting_task_instances, is_candidate=_may_be_cleared_exit)

    # The scheduler sizes what it hands over by these two. Accepting `prefetch` more than there are
    # free slots keeps the next workloads waiting inside the executor, where the capacity limiter
    # starts each one as soon as a slot frees: the scheduler no longer runs one loop per freed slot
    # (its loop is the costliest thing on a busy host), and a task does not wait for that loop.
    @property
    def slots_available(self) -> int:
        return int(super().slots_available) + self._budget.allowed(time.time())

    # The scheduler itself queues no more than [core] parallelism minus what every executor holds
    # (slots_occupied). Prefetched workloads wait for one of our slots and hold none of parallelism's,
    # so up to the prefetch they are not counted; counted, the prefetch could never fill.
    @property
    def slots_occupied(self) -> int:
        return max(0, int(super().slots_occupied) - self._budget.allowed(time.time()))

    def trigger_tasks(self, open_slots: int) -> None:
        super().trigger_tasks(open_slots + self._budget.allowed(time.time()))

    def start(self) -> None:
        conf = executor_conf(self)
        self._config = config = ExecutorConfig.from_conf(conf)
        self._budget = PrefetchBudget(
            parallelism=self.parallelism,
            maximum=config.prefetch(self.parallelism),
            queued_timeout=float(conf.get("scheduler", "task_queued_timeout", fallback="600") or 600),
        )
        self._prefetch_logged = self._budget.maximum
        self._task_log_folder = conf.get("logging", "base_log_folder", fallback="") or ""
        self._server = execution_api_url(conf)
        self._argv = self._child_argv()
        team = f" [{self.team_name}]" if self.team_name else ""
        self._title_prefix = f"airflow worker -- AsyncLocalExecutor{team}:"
        use_uvloop = config.event_loop is EventLoop.UVLOOP or (
            config.event_loop is EventLoop.AUTO and uvloop_available()
        )
        policy = TerminationPolicy(grace=config.termination_grace_period)
        self._journal = journal = self._open_journal(config)
        listener = registry.RecordingListener(self._mailbox, journal, describe)
        client_env = child_client_env(os.environ)
        if client_env:
            log.info(
                "task processes get [workers] execution_api_timeout = %gs (Airflow's default of 5s lets a "
                "burst of task starts time out at the api-server and be retried unsafely); set it to "
                "choose your own",
                SAFE_CLIENT_TIMEOUT,
            )
        child_env = {**journal.child_env(os.environ), **client_env}
        output = self._output

        def make_supervisor() -> Supervisor:
            launcher: Launcher = SubprocessLauncher(output=output, env=child_env)
            if config.launcher is LauncherKind.FORKSERVER:
                launcher = ForkServerLauncher(
                    target=self._fork_target(),
                    preload=config.preload_modules,
                    output=output,
                    fallback=launcher,
                    env=child_env,
                    idle_timeout=config.forkserver_idle_timeout or None,
                )
            return Supervisor(
                launcher,
                listener,
                # Airflow 2's parallelism 0 means unlimited (the memory guard still applies).
                limit=self.parallelism or None,
                policy=policy,
                group_limits=dict(config.queue_limits),
                memory_floor=int(config.min_available_memory_mb * MB),
            )

        self._status = writer = status.StatusWriter(
            status.status_path(journal.directory, journal.instance),
            {
                "instance": journal.instance,
                "pid": os.getpid(),
                "team": self.team_name,
                "executor": type(self).__name__,
                "parallelism": self.parallelism,
                "launcher": config.launcher.value,
            },
        )
        self._thresholds = Thresholds(max_lag=config.health_loop_lag_limit, max_wait=config.health_wait_limit)
        self._metric_tags = prune_dict(
            {"executor_class_name": type(self).__name__, "team_name": self.team_name}
        )
        thresholds = self._thresholds

        def make_probe(supervisor: Supervisor) -> Probe:
            return Probe(
                supervisor.state, thresholds=thresholds, on_report=self._emit_report, write=writer.write
            )

        self._runtime = Runtime(make_supervisor, use_uvloop=use_uvloop, make_probe=make_probe)
        self._runtime.start()
        self.log.info(
            "AsyncLocalExecutor started: parallelism=%d, prefetch=%d, queue limits=%s, memory floor=%g MB, "
            "launcher=%s, event loop=%s",
            self.parallelism,
            self._budget.maximum,
            ",".join(f"{q}:{n}" for q, n in config.queue_limits) or "none",
            config.min_available_memory_mb,
            config.launcher.value,
            "uvloop" if use_uvloop else "asyncio",
        )

    def _open_journal(self, config: ExecutorConfig) -> registry.LaunchJournal:
        """Kill what a crashed predecessor left running, then start this instance's own journal.

        Before anything launches, so no try can run beside a survivor of its previous attempt.
        """
        directory = Path(config.state_dir or os.path.join(AIRFLOW_HOME, "async_local_executor"))
        survivors = registry.reclaim(directory)
        for survivor in survivors:
            log.warning(
                "killed pid %d (%s) left running by a stopped executor (%s): %s",
                survivor.pid,
                survivor.label or "started by one of its workloads",
                survivor.owner,
                survivor.command,
            )
        if survivors:
            log.warning(
                "killed %d process(es) a previous executor left running; the scheduler resets their "
                "task instances and retries decide what runs again",
                len(survivors),
            )
        for found in status.read_all(directory):
            if found.gone:
                found.path.unlink(missing_ok=True)  # a crashed scheduler's last word
        team = f" team {self.team_name}" if self.team_name else ""
        return registry.LaunchJournal.open(directory, owner=f"scheduler pid {os.getpid()}{team}")

    def _child_argv(self) -> tuple[str, ...]:
        """The command that runs one workload; it reads the workload (or Airflow 2 command) from stdin."""
        entry = child.__name__ if AIRFLOW_V3 else child_cli.__name__
        flags = child_entry.argv_flags(os.getpid(), self._config.workload_cpu_priority)
        return (sys.executable, "-m", entry, *flags)

    def _fork_target(self) -> str:
        """What a fork-server child runs: ``module:function`` taking ``(argv, stdin_bytes)``."""
        return f"{child.__name__ if AIRFLOW_V3 else child_cli.__name__}:forked_main"

    def _process_workloads(self, workload_items: Sequence[ExecutorWorkload]) -> None:
        if self._runtime is None:
            raise RuntimeError("AsyncLocalExecutor.start() was not called")
        requests = []
        for workload in workload_items:
            # Each queue is typed by its own key kind; the key's kind already says which one holds it.
            key: Any = workload.key
            # A valid workload sits in exactly one of these dicts.
            removed = (
                self.queued_tasks.pop(key, None)
                or self.queued_callbacks.pop(key, None)
                or self.queued_connection_tests.pop(key, None)
            )
            if not removed:
                raise KeyError(f"Workload {key} was not found in any queue")
            # Stock 3.3 never fills `running`, so parallelism limits nothing there; we do, so open_slots
            # is the truth and the scheduler stops handing us work once every slot is taken.
            self.running.add(key)
            label = describe(key)
            ti = getattr(workload, "ti", None)  # tasks only
            try:
                timeout = self._config.timeout_for(getattr(ti, "executor_config", None))
            except ValueError as exc:
                self._not_launched(
                    key, label, workload.failure_state, str(exc), getattr(workload, "log_path", None)
                )
                continue
            ticket = _Ticket(key, next(self._serials))
            self._states[key] = _States(
                ticket,
                workload.running_state,
                workload.success_state,
                workload.failure_state,
                label,
                getattr(workload, "log_path", None),
                time.time(),
            )
            title = f"{self._title_prefix} {workload.display_name}"
            payload = child.encode_payload(workload.model_dump_json(), self._server, title)
            # Only tasks have a queue; callbacks and connection tests are limited by parallelism alone.
            queue = (getattr(ti, "queue", None) or "default") if isinstance(key, TaskInstanceKey) else ""
            requests.append(
                LaunchRequest(
                    key=ticket, argv=self._argv, stdin=payload, label=label, timeout=timeout, group=queue
                )
            )
        self._runtime.submit(requests)

    # Airflow 2: the base class's trigger_tasks hands over `airflow tasks run ...` commands here.
    def _process_tasks(self, task_tuples: Sequence[tuple[Any, list[str], str | None, Any]]) -> None:
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
        try:
            if not isinstance(command, list) or command[:3] != ["airflow", "tasks", "run"]:
                raise ValueError(f"not an `airflow tasks run` command: {command!r}")
            timeout = self._config.timeout_for(executor_config)
        except ValueError as exc:
            self._not_launched(key, label, TaskInstanceState.FAILED, str(exc), None)
            return None
        ticket = _Ticket(key, next(self._serials))
        self._states[key] = _States(
            ticket, None, TaskInstanceState.SUCCESS, TaskInstanceState.FAILED, label, None, time.time()
        )
        payload = child_cli.encode_payload(command, f"{self._title_prefix} {label}")
        return LaunchRequest(
            key=ticket, argv=self._argv, stdin=payload, label=label, timeout=timeout, group=queue or "default"
        )

    def _submit(self, requests: list[LaunchRequest]) -> None:
        if self._runtime is None:
            raise RuntimeError("AsyncLocalExecutor.start() was not called")
        if requests:
            self._runtime.submit(requests)

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

    def sync(self) -> None:
        runtime = self._runtime
        if runtime is not None and not runtime.alive:
            # Raising out of the scheduler's loop makes the scheduler exit non-zero, so systemd or
            # Kubernetes restarts it, instead of it accepting work that nothing would ever run.
            log.critical("the executor's event loop thread is dead; stopping the scheduler")
            raise RuntimeNotRunning(
                "the executor's event loop thread died; see the CRITICAL log line before this one"
            ) from runtime.failure
        events = self._mailbox.events
        ended = False
        while events:
            event = events.popleft()
            ticket = cast("_Ticket", event.key)
            key = cast("WorkloadKey", ticket.key)
            # Revoked ones too: until their process ends, they hold a slot like any other.
            ended |= self._note_for_prefetch(ticket, event)
            tail = [] if isinstance(event, _Started) else self._output.pop(ticket)
            states = self._states.get(key)
            if states is None or states.ticket != ticket:
                # A revoked submission: the scheduler already decided this try's fate, and Airflow's
                # revoke_task contract forbids an executor event for it.
                if not isinstance(event, _Started):
                    log.info("revoked workload %s ended: %s", describe(ticket), event.reason or "exit 0")
                continue
            if isinstance(event, _Started):
                stats.timing(
                    self._metric_name("launch_latency"),
                    timedelta(seconds=max(0.0, event.at - states.accepted)),
                    tags=self._metric_tags,
                )
                if states.running is not None:
                    self.change_state(key, states.running, remove_running=False)
                continue
            del self._states[key]
            self._finish(key, states, event, tail)
            outcome = "success" if event.ok else _OUTCOME_NAMES.get(event.kind, event.kind.value)
            stats.incr(self._metric_name(f"final_events.{outcome}"), tags=self._metric_tags)
        if ended:
            self._log_prefetch_change()

    def get_event_buffer(self, dag_ids: Any = None) -> dict[WorkloadKey, Any]:
        events: dict[WorkloadKey, Any] = super().get_event_buffer(dag_ids)
        if AIRFLOW_V3:  # Airflow 2 does not restart cleared task instances through these events
            # Held ones go back to the buffer, so the scheduler's next loop reads them (see cleared_exits).
            self.event_buffer.update(self._cleared_exits.hold_back(events))
        return events

    def _note_for_prefetch(self, ticket: _Ticket, event: _Started | Outcome) -> bool:
        """Feed the prefetch budget; True when a workload ended."""
        if isinstance(event, _Started):
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
        budget, now = self._budget, time.time()
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

    def get_health(self) -> Health:
        """Healthy, unhealthy (with reasons) or unknown; never waits, safe from any thread.

        The verdict comes from the event loop's probe (loop lag, the launch path, recent launch
        failures, the memory guard, workloads waiting too long); a loop thread that died or stopped
        refreshing it is judged here.
        """
        runtime = self._runtime
        if runtime is None:
            return Health(Verdict.UNKNOWN, ("executor stopped" if self._stopped else "executor not started",))
        if not runtime.alive:
            return Health(Verdict.UNHEALTHY, (f"event loop thread is dead: {runtime.failure!r}",))
        report = runtime.report
        return stale(report, self._thresholds, time.monotonic()) or cast("Report", report).health

    def _metric_name(self, name: str) -> str:
        name = f"async_local_executor.{name}"
        if not AIRFLOW_V3:
            return name  # Airflow 2 has no per-team metric names
        return str(self._get_metric_name(name))

    def _emit_report(self, report: Report) -> None:
        # On the loop thread, every probe: gauges are a UDP datagram each (StatsD) or an in-memory
        # update (OpenTelemetry), neither of which waits.
        state, tags = report.state, self._metric_tags
        stats.gauge(self._metric_name("loop_lag"), report.lag * 1000, tags=tags)
        stats.gauge(self._metric_name("waiting"), state.waiting, tags=tags)
        stats.gauge(self._metric_name("memory_guard_holding"), int(state.memory_low), tags=tags)
        stats.gauge(self._metric_name("healthy"), int(report.health.verdict is Verdict.HEALTHY), tags=tags)
        if waits := state.memory_waits_total - self._memory_waits_seen:
            self._memory_waits_seen = state.memory_waits_total
            stats.incr(self._metric_name("memory_guard_waits"), waits, tags=tags)

    def debug_dump(self) -> None:
        """SIGUSR2 to the scheduler: Airflow's queues, then this executor's health and workloads."""
        super().debug_dump()  # type: ignore[no-untyped-call]
        health = self.get_health()
        log.info(
            "async_local_executor health: %s%s",
            health.verdict.value,
            f" ({health.reason})" if health.reason else "",
        )
        report = self._runtime.report if self._runtime is not None else None
        if report is not None:
            now = time.time()
            state = report.state
            log.info(
                "async_local_executor: %d running, %d waiting, loop lag %.1f ms, launched %d, outcomes %s\n\t%s",
                len(state.running),
                state.waiting,
                report.lag * 1000,
                state.launched_total,
                dict(state.outcomes_total),
                "\n\t".join(f"{w.label} pid {w.pid} age {now - w.launched:.0f}s" for w in state.running),
            )

    @staticmethod
    def get_cli_commands() -> list[GroupCommand]:
        """``airflow async-local-executor status`` (Airflow also finds it through the provider info)."""
        from async_local_executor.adapter.provider import get_cli_commands

        return get_cli_commands()

    def revoke_task(self, *, ti: TaskInstance) -> None:
        """Forget ``ti``'s workload and stop its process if it has one; no event, as Airflow requires.

        The scheduler revokes tasks stuck in queued, then requeues or fails them itself.
        """
        key = ti.key
        if self.queued_tasks.pop(key, None) is not None:
            self.log.info("revoked %s before it reached the executor's loop", describe(key))
            return
        states = self._states.pop(key, None)
        self.running.discard(key)
        if states is None or self._runtime is None:
            return
        self.log.info("revoking %s: stopping it if it started", states.label)
        try:
            self._runtime.stop(states.ticket, "revoked by the scheduler")
        except RuntimeNotRunning:
            self.log.exception("cannot stop revoked workload %s", states.label)

    def _finish(self, key: WorkloadKey, states: _States, outcome: Outcome, tail: Sequence[str]) -> None:
        if outcome.ok:
            self.change_state(key, states.success)
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
            if self._task_log_folder and (log_path or not AIRFLOW_V3):
                write = functools.partial(
                    _tell_the_task,
                    self._task_log_folder,
                    log_path,
                    key,
                    reason,
                )
                runtime = self._runtime
                if runtime is not None and runtime.alive:
                    runtime.run_blocking(write)  # file I/O: never on the scheduler's thread
                else:
                    write()  # shutting down: end() already waits, and nothing else needs the thread
        self.log.error("workload %s failed: %s", label, reason)
        self.change_state(key, failure, info=reason)

    def end(self) -> None:
        self._shutdown(wait=self._config.shutdown_timeout)

    def terminate(self) -> None:
        self._shutdown(wait=0.0)

    def _shutdown(self, wait: float) -> None:
        runtime = self._runtime
        if runtime is None:
            return
        self.log.info("shutting down: waiting up to %.0fs for %d running workloads", wait, len(self.running))
        # Past `wait` and the grace period, every process has been SIGKILLed; the margin covers reaping.
        runtime.shutdown(wait, timeout=wait + self._config.termination_grace_period + 30.0)
        self._runtime = None
        self._stopped = True
        self.sync()
        journal, self._journal = self._journal, None
        writer, self._status = self._status, None
        if writer is not None:
            writer.remove()
        if journal is not None and not runtime.alive and runtime.failure is None:
            # Every workload has its final event and its process is gone: nothing left to reclaim.
            journal.close()
