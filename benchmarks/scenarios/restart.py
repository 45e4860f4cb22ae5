"""Restart: the scheduler is stopped (SIGTERM) or killed (SIGKILL) while long tasks run, then started again.

One DAG run of ``bench_restart`` (``benchmarks/dags/bench_restart.py``): 24 mapped tasks that sleep 90 s,
no retries, parallelism 32, on PostgreSQL. 20 s after the first task started, the scheduler process
alone (not its process group, as ``kill <pid>`` or Kubernetes does it) gets SIGTERM (case ``sigterm``)
or SIGKILL (case ``kill9``). The benchmark waits for it to exit (bounded: past ``exit_timeout`` it is
SIGKILLed, and a note says so), starts a new scheduler in the same home, and waits for the DAG run to
end. What happened to each task comes from files its executions wrote (every execution's task
instance key, try number, pid, start and end), not from Airflow's database alone: an execution the
scheduler lost track of, still running beside its task instance's next try, appears only there. An
execution that never recorded an end was killed part-way; the benchmark watches its process and dates
its death to the poll that first saw it gone (every 0.5 s).

Only the full profile has this case: its figures need the full length of a task (a restart takes tens
of seconds), and four deployments of several minutes each would more than double the smoke suite.
"""

from __future__ import annotations

import functools
import json
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Final

from benchmarks.deployment import deployment
from benchmarks.probes import as_utc
from benchmarks.scenarios.base import (
    EXITED,
    Case,
    Figures,
    Outcome,
    RunContext,
    airflow_config,
    run_status,
    wait_for_run,
    wait_parsed,
)
from harness.sandbox import AirflowSandbox, SandboxError

DAG_ID: Final[str] = "bench_restart"
# The case is about PostgreSQL deployments (the issue's); --database overrides it.
DATABASE: Final[str] = "postgres"
SIGNALS: Final[dict[str, signal.Signals]] = {"sigterm": signal.SIGTERM, "kill9": signal.SIGKILL}
POLL: Final[float] = 0.5
# A progress line at most this often during a long wait.
PROGRESS_EVERY: Final[float] = 15.0


@dataclass(frozen=True)
class Size:
    tasks: int
    sleep: float
    parallelism: int
    signal_after: float  # seconds after the first task started
    start_timeout: float  # trigger to the first task's start, at most
    exit_timeout: float  # signal to the old scheduler's exit, at most (then SIGKILL)
    # New scheduler to the run's end, at most: a task instance left running by a dead scheduler waits
    # for Airflow's task_instance_heartbeat_timeout or orphaned_tasks_check_interval (300 s each).
    timeout: float
    signal: str = "sigterm"  # the case's variant, one of SIGNALS


SIZES: Final[dict[str, Size]] = {
    "full": Size(
        tasks=24,
        sleep=90,
        parallelism=32,
        signal_after=20,
        start_timeout=300,
        exit_timeout=300,
        timeout=1200,
    ),
}


def cases(profile: str) -> list[Case]:
    size = SIZES.get(profile)
    if size is None:
        return []
    return [
        Case(
            "restart",
            f"{size.tasks}x{size.sleep:g}s-p{size.parallelism}-{name}",
            asdict(sized := replace(size, signal=name)),
            functools.partial(run, sized),
            database=DATABASE,
        )
        for name in SIGNALS
    ]


# ------------------------------------------------------------------ what the tasks recorded


@dataclass
class Execution:
    """One execution of a task instance's try, as its file and the benchmark's polls saw it."""

    map_index: int
    try_number: int
    pid: int
    start_ticks: int | None
    start: float  # wall time, written by the task
    end: float | None = None  # written by the task when its sleep was over; None: killed part-way
    gone: float | None = None  # first poll that found its process gone without an end
    seen: float = 0.0  # last poll that found it running

    @property
    def until(self) -> float:
        """Its end, else when it was found gone, else the last time it was seen running."""
        if self.end is not None:
            return self.end
        return self.gone if self.gone is not None else max(self.seen, self.start)

    @property
    def running(self) -> bool:
        return self.end is None and self.gone is None


def _alive(pid: int, start_ticks: int | None) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    if fields[0] in ("Z", "X"):
        return False  # dead, not yet reaped
    # Another process with a reused pid is not this execution.
    return start_ticks is None or fields[19] == str(start_ticks)


class ExecutionLog:
    """The executions recorded in ``directory``, kept up to date by :meth:`poll`."""

    def __init__(self, directory: Path, alive: Callable[[int, int | None], bool] = _alive) -> None:
        self.directory = directory
        self._alive = alive
        self.executions: dict[str, Execution] = {}

    def poll(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        for path in self.directory.glob("*.json"):
            known = self.executions.get(path.name)
            if known is not None and known.end is not None:
                continue
            try:
                data: dict[str, Any] = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if known is None:
                known = self.executions[path.name] = Execution(
                    int(data["map_index"]),
                    int(data["try_number"]),
                    int(data["pid"]),
                    data.get("start_ticks"),
                    float(data["start"]),
                    seen=now,
                )
            if data.get("end") is not None:
                known.end = float(data["end"])
        for execution in self.executions.values():
            if not execution.running:
                continue
            if self._alive(execution.pid, execution.start_ticks):
                execution.seen = now
            else:
                execution.gone = now

    def first_start(self) -> float | None:
        return min((e.start for e in self.executions.values()), default=None)

    def running(self) -> list[Execution]:
        return [e for e in self.executions.values() if e.running]

    def describe(self) -> str:
        executions = list(self.executions.values())
        ended = sum(1 for e in executions if e.end is not None)
        gone = sum(1 for e in executions if e.gone is not None)
        return f"executions: {len(executions) - ended - gone} running, {ended} ended, {gone} killed part-way"


def overlaps(executions: Iterable[Execution]) -> dict[int, float]:
    """Per map index whose executions ran at the same time, the longest time two of them did."""
    by_index: dict[int, list[Execution]] = {}
    for e in executions:
        by_index.setdefault(e.map_index, []).append(e)
    found: dict[int, float] = {}
    for index, runs in by_index.items():
        longest = 0.0
        for i, a in enumerate(runs):
            for b in runs[i + 1 :]:
                longest = max(longest, min(a.until, b.until) - max(a.start, b.start))
        if longest > 0:
            found[index] = longest
    return found


def execution_figures(executions: Sequence[Execution]) -> Figures:
    twice = overlaps(executions)
    return {
        "executions": float(len(executions)),
        "executions_killed": float(sum(1 for e in executions if e.end is None)),
        "tasks_ran_twice_at_once": float(len(twice)),
        "ran_twice_overlap_max_s": max(twice.values(), default=None),
    }


def timeline(executions: Iterable[Execution], origin: float) -> list[list[float | int | None]]:
    """``[map_index, try_number, start, until, ended]`` per execution, seconds from ``origin``."""
    return [
        [e.map_index, e.try_number, round(e.start - origin, 2), round(e.until - origin, 2), e.end is not None]
        for e in sorted(executions, key=lambda e: (e.map_index, e.start))
    ]


# ------------------------------------------------------------------ the run


class _Ticker:
    """Progress lines for a long wait: at most one every ``PROGRESS_EVERY`` seconds."""

    def __init__(self, progress: Callable[[str], None] | None) -> None:
        self.progress = progress
        self.last = 0.0

    def __call__(self, line: str | Callable[[], str], *, now: bool = False) -> None:
        # A callable is called only when a line is due: some lines query the database.
        if self.progress is None or (not now and time.monotonic() - self.last < PROGRESS_EVERY):
            return
        self.last = time.monotonic()
        self.progress(f"restart: {line if isinstance(line, str) else line()}")


def _exited(sb: AirflowSandbox) -> str | None:
    """Why a process of the deployment exited, or None while all run (a result, not a harness error)."""
    try:
        sb.check_processes()
    except SandboxError as exc:
        lines = str(exc).splitlines()
        errors = [line.strip() for line in lines if "Error:" in line]
        return f"{lines[0].split(' ', 1)[0]}{EXITED}{errors[-1][:300] if errors else lines[0]}"
    return None


def _ti_states(sb: AirflowSandbox, run_id: str) -> str:
    rows = sb.query(
        "SELECT state, count(*) FROM task_instance WHERE dag_id = :d AND run_id = :r GROUP BY state",
        d=DAG_ID,
        r=run_id,
    )
    return ", ".join(f"{n} {state or 'none'}" for state, n in sorted(rows, key=lambda r: str(r[0])))


def _run_end(sb: AirflowSandbox, run_id: str) -> float | None:
    rows = sb.query("SELECT end_date FROM dag_run WHERE dag_id = :d AND run_id = :r", d=DAG_ID, r=run_id)
    end = as_utc(rows[0][0]) if rows else None
    return end.timestamp() if end else None


def run(size: Size, ctx: RunContext) -> Outcome:
    executions_dir = Path(tempfile.mkdtemp(prefix="ale-bench-restart-"))
    try:
        return _run(size, ctx, executions_dir)
    finally:
        if ctx.keep_home:
            if ctx.progress is not None:
                ctx.progress(f"kept {executions_dir}")
        else:
            shutil.rmtree(executions_dir, ignore_errors=True)


def _run(size: Size, ctx: RunContext, executions_dir: Path) -> Outcome:
    sig = SIGNALS[size.signal]
    dag_env = {
        "ALE_BENCH_RESTART_TASKS": str(size.tasks),
        "ALE_BENCH_RESTART_SLEEP": str(size.sleep),
        "ALE_BENCH_EXECUTIONS_DIR": str(executions_dir),
    }
    notes: list[str] = []
    log = ExecutionLog(executions_dir)
    say = _Ticker(ctx.progress)
    problem: str | None = None
    state: str | None = None
    signalled: float | None = None
    exited: float | None = None
    restarted: float | None = None
    exit_code: int | None = None
    running_at_signal: int | None = None
    with deployment(
        ctx.variant,
        airflow_cfg=ctx.airflow_cfg,
        parallelism=size.parallelism,
        database=ctx.database,
        dag_env=dag_env,
        progress=ctx.progress,
        keep_home=ctx.keep_home,
    ) as dep:
        sb = dep.sandbox
        wait_parsed(dep, DAG_ID)
        info = dep.executor_info()
        applied = airflow_config(sb)
        triggered = time.time()
        run_id = sb.trigger(DAG_ID)
        # The first task's start, then signal_after more: the scheduler stops with every task mid-sleep.
        first: float | None = None
        while problem is None and (first := log.first_start()) is None:
            if time.time() - triggered > size.start_timeout:
                problem = f"timeout after {size.start_timeout:.0f}s: no task started"
            problem = problem or _exited(sb)
            say(lambda: f"waiting for the first task to start, {time.time() - triggered:.0f}s since trigger")
            time.sleep(POLL / 2)
            log.poll()
        while problem is None and first is not None and time.time() < first + size.signal_after:
            problem = _exited(sb)
            time.sleep(min(POLL / 2, max(0.0, first + size.signal_after - time.time())))
            log.poll()
        if problem is None:
            log.poll()
            running_at_signal = len(log.running())
            signalled = time.time()
            pid = sb.send_signal("scheduler", sig)
            say(lambda: f"{sig.name} to the scheduler (pid {pid}); {log.describe()}", now=True)
            while (exit_code := sb.wait_exited("scheduler", POLL)) is None:
                log.poll()
                waited = time.time() - signalled
                if waited > size.exit_timeout:
                    notes.append(f"the scheduler still ran {waited:.0f}s after {sig.name}: SIGKILLed")
                    sb.kill("scheduler")
                    exit_code = sb.wait_exited("scheduler", POLL)
                    break
                say(f"the old scheduler still runs {waited:.0f}s after {sig.name}; {log.describe()}")
            else:
                exited = time.time()
            say(lambda: f"the old scheduler exited (code {exit_code}); {log.describe()}", now=True)
            log.poll()
            restarted = time.time()
            sb.restart("scheduler")
            say(lambda: "a new scheduler started in the same home", now=True)

            def watch() -> str | None:
                log.poll()
                say(
                    lambda: (
                        f"run {sb.run_state(DAG_ID, run_id)}, {time.time() - restarted:.0f}s since the "
                        f"restart; task instances: {_ti_states(sb, run_id)}; {log.describe()}"
                    )
                )
                return None

            try:
                state, problem = wait_for_run(sb, DAG_ID, run_id, timeout=size.timeout, abort=watch)
            except SandboxError:
                state, problem = sb.run_state(DAG_ID, run_id), _exited(sb)
        else:
            state = sb.run_state(DAG_ID, run_id)
        log.poll()
        rows = sb.task_instances(DAG_ID, run_id)
        run_end = _run_end(sb, run_id) if state in ("success", "failed") else None
        if ctx.progress is not None:
            ctx.progress(f"restart: run {state}; task instances: {_ti_states(sb, run_id)}; {log.describe()}")
    if problem:
        notes.insert(0, problem)
    executions = list(log.executions.values())
    first_start = log.first_start()
    alive_at_end = [e for e in executions if e.running]
    if alive_at_end:
        notes.append(
            f"{len(alive_at_end)} execution(s) still running when the run ended (killed by teardown)"
        )
    succeeded = sum(1 for r in rows if r.state == "success")

    def since(t: float | None, origin: float | None) -> float | None:
        return None if t is None or origin is None else round(t - origin, 2)

    metrics: Figures = {
        "old_scheduler_exit_s": since(exited, signalled),
        "old_scheduler_exit_code": None if exit_code is None else float(exit_code),
        "tasks_succeeded": float(succeeded),
        "tasks_failed": float(
            sum(1 for r in rows if r.state in ("failed", "up_for_retry", "upstream_failed"))
        ),
        "tasks_rerun": float(sum(1 for r in rows if r.try_number > 1)),
        **execution_figures(executions),
        "executions_running_at_signal": None if running_at_signal is None else float(running_at_signal),
        "executions_alive_at_run_end": float(len(alive_at_end)),
        "restart_to_run_end_s": since(run_end, restarted),
        "makespan_s": since(run_end, first_start),
    }
    series = {
        # Seconds from the first task's start.
        "timeline": timeline(executions, first_start) if first_start is not None else [],
        "events": {
            name: since(t, first_start)
            for name, t in (
                ("signal", signalled),
                ("exit", exited),
                ("restart", restarted),
                ("run_end", run_end),
            )
        },
        "try_numbers": {str(r.map_index): r.try_number for r in rows},
        "airflow_config": applied,
    }
    status = run_status(state == "success" and succeeded == size.tasks, state, problem)
    return Outcome(metrics, series, status, notes, info=info, text={"run_state": state or "none"})
