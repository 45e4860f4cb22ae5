"""What every scenario shares: the run context, a case, its outcome, and common figures."""

from __future__ import annotations

import configparser
import contextlib
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks import roles
from benchmarks.deployment import Deployment, Variant
from benchmarks.probes import HeartbeatLog, LoopProbe, MemoryProbe, MemorySample, as_utc
from benchmarks.roles import RoleAccount
from benchmarks.stats import max_or_none, percentile
from harness.sandbox import AirflowSandbox, SandboxTimeout, TaskInstanceRow

Figures = dict[str, float | None]
# In a problem that is a process's exit: "<process> exited: <error>".
EXITED = " exited: "


@dataclass(frozen=True)
class RunContext:
    variant: Variant
    database: str
    progress: Callable[[str], None] | None
    keep_home: bool = False
    # The home's airflow.cfg: "generated" by Airflow as on a deployment (the default), or "empty".
    airflow_cfg: str = "generated"
    # Where this run's scheduler profile goes (benchmarks/scheduler_profile.py), for the cases that take
    # one; None: not profiled.
    profile_stem: Path | None = None


@dataclass
class Outcome:
    metrics: Figures
    series: dict[str, Any] = field(default_factory=dict)
    status: str = "ok"
    notes: list[str] = field(default_factory=list)
    # Facts about the executor that ran, e.g. {"launcher": "forkserver"}.
    info: dict[str, str] = field(default_factory=dict)
    # Figures that are words, not numbers (e.g. {"run_state": "success"}); the report shows them
    # side by side with the numbers.
    text: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Case:
    """One selectable unit of a scenario: a fixed configuration and how to run it once."""

    scenario: str
    name: str
    config: Mapping[str, Any]
    run: Callable[[RunContext], Outcome]
    # The metadata database this case runs on unless --database says otherwise; None: the suite's
    # default for the installed Airflow (SQLite on 3, PostgreSQL on 2).
    database: str | None = None


def cpu_figures(before: Mapping[str, float], after: Mapping[str, float], tasks: int) -> Figures:
    def delta(name: str) -> float | None:
        if name not in before or name not in after:
            return None
        return max(0.0, after[name] - before[name])

    scheduler, api = delta("scheduler"), delta("api-server")
    own = delta("scheduler-process")
    # The scheduler tree minus the scheduler process: what running the workloads cost (workers,
    # fork server, supervisors, task processes), wherever the executor runs them.
    workloads = None if scheduler is None or own is None else max(0.0, scheduler - own)
    return {
        "scheduler_cpu_s": scheduler,
        "scheduler_cpu_per_task_s": None if scheduler is None or not tasks else scheduler / tasks,
        "scheduler_process_cpu_s": own,
        "workload_cpu_per_task_s": None if workloads is None or not tasks else workloads / tasks,
        "api_server_cpu_s": api,
        "api_server_cpu_per_task_s": None if api is None or not tasks else api / tasks,
        "dag_processor_cpu_s": delta("dag-processor"),
    }


def roles_figures(account: RoleAccount | None, tasks: int) -> Figures:
    """Each role's CPU per task (:mod:`benchmarks.roles`); every figure None without an account."""
    return roles.unaccounted() if account is None else account.per_task(tasks)


def roles_notes(account: RoleAccount | None) -> list[str]:
    """Why the run has no CPU account by role, if it has none."""
    if account is not None and account.unavailable:
        return [f"no CPU account by role: {account.unavailable}"]
    return []


def loop_figures(heartbeats: HeartbeatLog, loop: LoopProbe) -> Figures:
    ms = [d * 1000.0 for d in heartbeats.durations]
    return {
        "executor_heartbeat_p50_ms": percentile(ms, 50),
        "executor_heartbeat_p99_ms": percentile(ms, 99),
        "executor_heartbeat_max_s": heartbeats.longest,
        "job_heartbeat_max_gap_s": max_or_none(loop.gaps()),
        "job_heartbeat_max_gap_sampled_s": max_or_none(loop.gaps(sampled_only=True)),
    }


def sample_median(samples: Sequence[MemorySample], attr: str) -> float | None:
    values = [float(getattr(s, attr)) for s in samples]
    return statistics.median(values) if values else None


def busy_samples(memory: MemoryProbe, loop: LoopProbe, peak: int) -> list[MemorySample]:
    """The memory samples taken while ``peak`` task instances were running."""
    # Memory and running count come from two probes; pair each memory sample with the nearest count.
    counts = loop.samples
    if not counts or peak <= 0:
        return []
    return [m for m in memory.samples if min(counts, key=lambda c: abs(c.t - m.t)).running == peak]


def busy_memory_figures(
    memory: MemoryProbe, loop: LoopProbe, idle_uss: float | None, idle_pss: float | None
) -> Figures:
    """Scheduler-tree memory while the most tasks ran, and what each running task added to the idle tree."""
    peak = loop.peak_running()
    busy = busy_samples(memory, loop, peak)
    busy_uss, busy_pss = sample_median(busy, "uss_mb"), sample_median(busy, "pss_mb")
    return {
        "busy_uss_mb": busy_uss,
        "busy_pss_mb": busy_pss,
        "peak_uss_mb": max((s.uss_mb for s in memory.samples), default=None),
        "peak_running": float(peak),
        "per_task_uss_mb": (busy_uss - idle_uss) / peak if busy_uss and idle_uss and peak else None,
        "per_task_pss_mb": (busy_pss - idle_pss) / peak if busy_pss and idle_pss and peak else None,
    }


# Settings a case may change; every record carries the values its deployment ran with.
CONFIG_KEYS = (
    "AIRFLOW__CORE__PARALLELISM",
    "AIRFLOW__API__WORKERS",
    "AIRFLOW__SCHEDULER__MAX_TIS_PER_QUERY",
    "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT",
)


def airflow_config(sandbox: AirflowSandbox) -> dict[str, str]:
    """The deployment's values of ``CONFIG_KEYS`` as Airflow reads them: from the environment, else
    from ``airflow.cfg`` (Airflow's generated one holds every option's default); "unset" in neither.
    """
    file = configparser.RawConfigParser(strict=False, interpolation=None)
    file.read(sandbox.airflow_cfg_path)
    env = sandbox.env
    values: dict[str, str] = {}
    for key in CONFIG_KEYS:
        _, section, option = key.lower().split("__", 2)
        values[key] = env.get(key) or str(file.get(section, option, fallback="unset"))
    return values


def wait_for_run(
    sandbox: AirflowSandbox,
    dag_id: str,
    run_id: str,
    *,
    timeout: float,
    abort: Callable[[], str | None] = lambda: None,
) -> tuple[str | None, str | None]:
    """Poll the run until final, timeout or ``abort()`` gives a reason; return (state, reason)."""
    deadline = time.monotonic() + timeout
    while True:
        sandbox.check_processes()
        state = sandbox.run_state(dag_id, run_id)
        if state in ("success", "failed"):
            return state, None
        reason = abort()
        if reason is not None:
            return state, reason
        if time.monotonic() >= deadline:
            return state, f"timeout after {timeout:.0f}s"
        time.sleep(0.5)


def stalled(loop: LoopProbe, limit: float) -> Callable[[], str | None]:
    """An abort check: the scheduler wrote no job heartbeat for ``limit`` seconds."""

    def check() -> str | None:
        since = loop.seconds_since_heartbeat()
        if since is not None and since > limit:
            return f"scheduler stalled: no job heartbeat for {since:.0f}s"
        return None

    return check


def wait_parsed(dep: Deployment, dag_id: str) -> None:
    """Wait until the DAG is parsed and the executor is ready (what a measurement may start from)."""
    try:
        dep.sandbox.wait_for_dag(dag_id, timeout=120)
    except SandboxTimeout as exc:
        raise RuntimeError(f"{dag_id} was not parsed: {exc}") from exc
    dep.wait_executor_ready(timeout=120)


@dataclass(frozen=True)
class FinishedRun:
    """One DAG run triggered and waited for, with what was measured around it."""

    run_id: str
    state: str | None
    problem: str | None  # why the wait ended without a final state
    rows: list[TaskInstanceRow]
    queued_at: datetime | None
    ended_at: datetime | None
    loop: LoopProbe
    heartbeats: HeartbeatLog
    cpu_before: dict[str, float]
    cpu_after: dict[str, float]
    roles: RoleAccount | None  # where each task's CPU went, when the scenario asked

    @property
    def makespan_s(self) -> float | None:
        """First task start to last task end."""
        starts = [r.start_date for r in self.rows if r.start_date]
        ends = [r.end_date for r in self.rows if r.end_date]
        return (max(ends) - min(starts)).total_seconds() if starts and ends else None

    @property
    def run_duration_s(self) -> float | None:
        """The run's queued_at to its end_date."""
        if self.queued_at and self.ended_at:
            return (self.ended_at - self.queued_at).total_seconds()
        return None


def trigger_and_wait(dep: Deployment, dag_id: str, timeout: float, *, roles: bool = False) -> FinishedRun:
    """Trigger ``dag_id``, wait for the run (a 120 s scheduler stall aborts), read back its task instances.

    :param roles: also account each task's CPU by role (:mod:`benchmarks.roles`) over the run
    """
    sb = dep.sandbox
    loop = dep.loop_probe()
    account = dep.role_account() if roles else None
    cpu_before = dep.cpu()
    with loop.sampling(), account.measuring() if account else contextlib.nullcontext():
        run_id = sb.trigger(dag_id)
        state, problem = wait_for_run(sb, dag_id, run_id, timeout=timeout, abort=stalled(loop, 120))
    cpu_after = dep.cpu()
    [(queued_at, ended_at)] = sb.query(
        "SELECT queued_at, end_date FROM dag_run WHERE dag_id = :d AND run_id = :r", d=dag_id, r=run_id
    )
    return FinishedRun(
        run_id,
        state,
        problem,
        sb.task_instances(dag_id, run_id),
        as_utc(queued_at),
        as_utc(ended_at),
        loop,
        dep.heartbeats(),
        cpu_before,
        cpu_after,
        account,
    )


def run_status(ok: bool, state: str | None, problem: str | None) -> str:
    """A run's status word: ok, stalled, timeout, "<process> exited", else the run's own state."""
    if ok:
        return "ok"
    if problem and "stalled" in problem:
        return "stalled"
    if problem and EXITED in problem:
        return problem.split(EXITED, 1)[0] + " exited"
    if problem and problem.startswith("timeout"):
        return "timeout"
    return f"run {state}"
