"""The Airflow adapter: workloads in, events out. Everything else lives in the Airflow-free core.

The class is layered: :mod:`~async_local_executor.adapter.executor_base` (state, and what both Airflow
majors do with a workload), :mod:`~async_local_executor.adapter.airflow2` (Airflow 2's commands),
:mod:`~async_local_executor.adapter.airflow3` (Airflow 3's workloads; both check what a task carries
with :mod:`~async_local_executor.adapter.validation`),
:mod:`~async_local_executor.adapter.prefetching` (how much it takes ahead) and
:mod:`~async_local_executor.adapter.health` (the verdict and SIGUSR2's dump). Starting builds the core
with :mod:`~async_local_executor.core.wiring` from what :mod:`~async_local_executor.adapter.startup`
reads, after :mod:`~async_local_executor.ops.recovery` has cleaned up after a crashed predecessor;
:mod:`~async_local_executor.adapter.metrics` sends the metrics.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from typing import TYPE_CHECKING, Any, cast

from airflow.configuration import conf as airflow_conf
from airflow.models.taskinstancekey import TaskInstanceKey
from airflow.utils.state import TaskInstanceState

from async_local_executor.adapter import child, child_cli, child_entry, startup
from async_local_executor.adapter.airflow2 import Airflow2Commands
from async_local_executor.adapter.airflow3 import Airflow3Workloads
from async_local_executor.adapter.cleared_exits import ClearedExitGate
from async_local_executor.adapter.compat import (
    AIRFLOW_V3,
    ExecutorScope,
    client_timeout,
    execution_api_url,
    executor_conf,
    requeue_unreachable,
    restarting_task_instances,
)
from async_local_executor.adapter.config import SHUTDOWN_MARGIN, ContainmentKind, ExecutorConfig
from async_local_executor.adapter.health import ExecutorHealth
from async_local_executor.adapter.metrics import Metrics
from async_local_executor.adapter.prefetching import Prefetching
from async_local_executor.adapter.submissions import Started, Ticket, describe
from async_local_executor.core.errors import RuntimeNotRunning
from async_local_executor.core.health import Report
from async_local_executor.core.outcome import Outcome
from async_local_executor.core.wiring import wire
from async_local_executor.ops import journal, recovery, state_dir, status
from async_local_executor.ops.instance_cgroups import open_containment

if TYPE_CHECKING:
    from airflow.cli.cli_config import GroupCommand
    from airflow.executors.workloads.types import WorkloadKey
    from airflow.models.taskinstance import TaskInstance

log = logging.getLogger(__name__)


def _requeue_in_thread(keys: list[Any], job_id: int | str, scope: ExecutorScope) -> None:
    """A worker thread of the loop: the update may wait on a row lock the scheduler's session holds."""
    done, foreign = requeue_unreachable(keys, job_id, scope)
    for key in done:
        log.info(
            "task instance %s: queued under an id no workload has, put back to scheduled, as the "
            "scheduler does with a task stuck in queued",
            describe(key),
        )
    for key, executor in foreign.items():
        log.info(
            "task instance %s: queued under an id no workload of this executor has, left queued: its row "
            "is for %s, which may be running it",
            describe(key),
            executor,
        )


def _may_be_cleared_exit(key: object, event: Any) -> bool:
    # The scheduler restarts a cleared task instance on a success event only.
    return isinstance(key, TaskInstanceKey) and event[0] == TaskInstanceState.SUCCESS


class AsyncLocalExecutor(Airflow2Commands, Airflow3Workloads, Prefetching, ExecutorHealth):
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
        super().__init__(*args, **kwargs)
        self._cleared_exits = ClearedExitGate(
            restarting_task_instances, is_candidate=_may_be_cleared_exit, on_unreachable=self._requeue
        )

    def start(self) -> None:
        conf = executor_conf(self)
        self._config = config = ExecutorConfig.from_conf(conf)
        # Every option is checked here, before anything is reclaimed, opened or started.
        directory = state_dir.resolve(config.state_dir)
        plan = startup.plan(
            config,
            parallelism=self.parallelism,
            queued_timeout=startup.queued_timeout(conf),
            fork_target=self._fork_target(),
            learn_dir=startup.learn_dir(directory, self.team_name),
        )
        self._task_log_folder = conf.get("logging", "base_log_folder", fallback="") or ""
        self._server = execution_api_url(conf)
        self._learn_dir = plan.learn_dir
        self._argv = self._child_argv()
        team = f" [{self.team_name}]" if self.team_name else ""
        self._title_prefix = f"airflow worker -- AsyncLocalExecutor{team}:"
        # Before anything launches, so no try can run beside a survivor of its previous attempt.
        owner = f"scheduler pid {os.getpid()}" + (f" team {self.team_name}" if self.team_name else "")
        self._journal = launches = recovery.reclaim_then_open(directory, owner=owner)
        if plan.learn_dir:  # in the state directory, which the journal has just made sure is ours alone
            os.makedirs(plan.learn_dir, mode=0o700, exist_ok=True)
        self._containment = containment = open_containment(
            launches.instance,
            enabled=config.containment is ContainmentKind.AUTO,
            root=config.cgroup_root,
            limits=config.limits,
            journals=launches.directory,
        )
        # [workers] is not a team's section: the deployment's own configuration holds it.
        timeout = client_timeout(airflow_conf, os.environ)
        if timeout is not None:
            log.info("%s", timeout.describe())
        client_env = timeout.env if timeout is not None else {}
        self._status = writer = status.StatusWriter(
            status.status_path(launches.directory, launches.instance),
            self._status_meta(launches.instance),
            # Descendants the status walk sees (workloads without a cgroup) are journalled for a reclaim.
            on_seen=launches.seen,
        )
        self._metrics = Metrics(
            executor_class=type(self).__name__,
            team=self.team_name,
            qualify=self._get_metric_name if AIRFLOW_V3 else None,
        )
        wired = wire(
            plan,
            listener=journal.RecordingListener(self._mailbox, launches, describe),
            output=self._output,
            env={**launches.child_env(os.environ), **client_env},
            on_report=self._on_report,
            write=writer.write,
            clock=self.clock,
            containment=containment,
        )
        self._budget, self._thresholds = wired.budget, wired.thresholds
        self._prefetch_logged = self._budget.maximum
        self._runtime = wired.runtime
        self._runtime.start()
        self.log.info(
            "AsyncLocalExecutor started: parallelism=%d, prefetch=%d, queue limits=%s, memory floor=%g MB, "
            "launcher=%s, event loop=%s",
            self.parallelism,
            self._budget.maximum,
            ",".join(f"{q}:{n}" for q, n in config.queue_limits) or "none",
            config.min_available_memory_mb,
            config.launcher.value,
            "uvloop" if wired.use_uvloop else "asyncio",
        )

    def _child_argv(self) -> tuple[str, ...]:
        """The command that runs one workload; it reads the workload (or Airflow 2 command) from stdin."""
        entry = child.__name__ if AIRFLOW_V3 else child_cli.__name__
        flags = child_entry.argv_flags(
            os.getpid(),
            self._config.workload_cpu_priority,
            self._learn_dir,
            sys.path[0] if sys.path else None,
        )
        return (sys.executable, "-m", entry, *flags)

    def _fork_target(self) -> str:
        """What a fork-server child runs: ``module:function`` taking ``(argv, stdin_bytes)``."""
        return f"{child.__name__ if AIRFLOW_V3 else child_cli.__name__}:forked_main"

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
            ticket = cast("Ticket", event.key)
            try:
                ended |= self._report(ticket, event)
            except Exception as exc:  # noqa: BLE001 - one workload's event, not the scheduler's loop
                self._reporting_failed(ticket, not isinstance(event, Started), exc)
        if ended:
            self._log_prefetch_change()

    def _report(self, ticket: Ticket, event: Started | Outcome) -> bool:
        """Tell Airflow of one event; True when a workload ended."""
        key = cast("WorkloadKey", ticket.key)
        # Revoked ones too: until their process ends, they hold a slot like any other.
        ended = self._note_for_prefetch(ticket, event)
        tail = [] if isinstance(event, Started) else self._output.pop(ticket)
        states = self._states.get(key)
        if states is None or states.ticket != ticket:
            # A revoked submission: the scheduler already decided this try's fate, and Airflow's
            # revoke_task contract forbids an executor event for it.
            if not isinstance(event, Started):
                log.info("revoked workload %s ended: %s", describe(ticket), event.reason or "exit 0")
            return ended
        if isinstance(event, Started):
            self._metrics.launch_latency(event.at - states.accepted)
            if states.running is not None:
                self.change_state(key, states.running, remove_running=False)
            return ended
        self._finish(key, states, event, tail)
        del self._states[key]  # after its final event: until then, a failure here still gives one
        self._metrics.final_event(event)
        return ended

    def get_event_buffer(self, dag_ids: Any = None) -> dict[WorkloadKey, Any]:
        events: dict[WorkloadKey, Any] = super().get_event_buffer(dag_ids)
        if AIRFLOW_V3:  # Airflow 2 does not restart cleared task instances through these events
            # Held ones go back to the buffer, so the scheduler's next loop reads them (see cleared_exits).
            self.event_buffer.update(self._cleared_exits.hold_back(events))
        return events

    def _requeue(self, keys: list[Any]) -> None:
        """Put back to scheduled the task instances of these gone workloads that no workload can run.

        Each is queued (if it still is) under an id no workload has; unless the scheduler has handed this
        executor a workload for the key since, nothing would run it before [scheduler] task_queued_timeout.
        """
        runtime, job_id = self._runtime, self.job_id
        orphans = [key for key in keys if key not in self._states and key not in self.queued_tasks]
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
        runtime.shutdown(wait, timeout=wait + self._config.termination_grace_period + SHUTDOWN_MARGIN)
        self._runtime = None
        self._stopped = True
        self.sync()
        launches, self._journal = self._journal, None
        writer, self._status = self._status, None
        if writer is not None:
            writer.remove()
        if launches is not None and not runtime.alive and runtime.failure is None:
            # Every workload has its final event and its process is gone: nothing left to reclaim.
            launches.close()
        containment, self._containment = self._containment, None
        if containment is not None:
            containment.close()  # what is still populated (kill_leftover_processes off) stays for a reclaim
