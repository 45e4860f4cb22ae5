"""Control: live control at full size on PostgreSQL, as an operator uses it (Airflow's CLI).

One DAG run of ``bench_control`` (``benchmarks/dags/bench_restart.py``): sleeping tasks that record each
execution. The cases:

- ``pause``: 40 tasks made while paused, the pause held 300 s with ``task_queued_timeout = 120``, then
  resumed. Figures: how many started, were queued, failed or were requeued while paused (all 0 is the
  claim), and that every task ran once after the resume.
- ``drain-<deadline>``: 16 tasks of 60 s all running, then ``drain --deadline D --wait``: with 120 s the
  drain ends when they do; with 30 s it passes its deadline with all 16 running, which run on
  (``on_stop = handover``) or are stopped (``terminate``). Figures: how long the drain took, whether it
  passed its deadline, how many it named, how the tasks ended.
- ``resize``: 40 tasks of 30 s at parallelism 4, raised to 16 once 4 run, lowered to 2 once 16 run.
  The executor's status file is sampled every 0.25 s: each sample has the running count and the limit in
  force, side by side. Figures: the samples where a new task started while the count was at or over the
  limit in force (0 is the claim), and the peak under each limit.

The stock LocalExecutor has no live control: its runs are recorded ``n/a`` without a deployment. Full
profile only: a case takes minutes.
"""

from __future__ import annotations

import functools
import itertools
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from async_local_executor.ops.status_read import read_all
from benchmarks.deployment import OURS, Deployment, deployment
from benchmarks.scenarios.base import Case, Figures, Outcome, RunContext, wait_parsed
from benchmarks.scenarios.restart import ExecutionLog

DATABASE: Final[str] = "postgres"
DAG_ID: Final[str] = "bench_control"
POLL: Final[float] = 0.25  # seconds between two samples of the status file and the executions
RUN_TIMEOUT: Final[float] = 900.0


@dataclass(frozen=True)
class Plan:
    kind: str  # "pause", "drain" or "resize"
    tasks: int
    sleep: float
    parallelism: int
    hold: float = 0.0  # pause: how long it is held
    queued_timeout: int = 600  # [scheduler] task_queued_timeout
    deadline: float | None = None  # drain
    on_stop: str = "handover"  # drain: what the deadline does to what still runs
    limits: tuple[int, ...] = ()  # resize: the limits in turn

    @property
    def name(self) -> str:
        if self.kind == "pause":
            return f"pause-{self.tasks}-held{self.hold:g}s-qt{self.queued_timeout}"
        if self.kind == "drain":
            return f"drain-{self.tasks}x{self.sleep:g}s-deadline{self.deadline:g}s-{self.on_stop}"
        return f"resize-{self.tasks}x{self.sleep:g}s-" + "-".join(map(str, (self.parallelism, *self.limits)))


PLANS: Final[tuple[Plan, ...]] = (
    Plan("pause", tasks=40, sleep=5, parallelism=16, hold=300, queued_timeout=120),
    Plan("drain", tasks=16, sleep=60, parallelism=16, deadline=30, on_stop="handover"),
    Plan("drain", tasks=16, sleep=60, parallelism=16, deadline=30, on_stop="terminate"),
    Plan("drain", tasks=16, sleep=60, parallelism=16, deadline=120),
    Plan("resize", tasks=40, sleep=30, parallelism=4, limits=(16, 2)),
)


def cases(profile: str) -> list[Case]:
    if profile != "full":
        return []
    return [
        Case("control", plan.name, asdict(plan), functools.partial(run, plan), database=DATABASE)
        for plan in PLANS
    ]


FIGURES: Final[tuple[str, ...]] = (
    "tasks_succeeded",
    "tasks_failed",
    "task_instances_run_twice",
    "started_while_held",
    "queued_while_paused",
    "requeued_stuck_in_queued",
    "resume_to_run_end_s",
    "drain_s",
    "drain_overdue",
    "named_at_deadline",
    "starts_over_limit",
    "peak_running_first_limit",
    "peak_running_raised",
    "peak_running_lowered",
)


def _empty() -> Figures:
    return dict.fromkeys(FIGURES, None)


def run(plan: Plan, ctx: RunContext) -> Outcome:
    if ctx.variant.executor != OURS:
        return Outcome(
            _empty(),
            status="n/a",
            notes=["the control case is this executor's: the stock LocalExecutor has no live control"],
        )
    folder = Path(tempfile.mkdtemp(prefix="ale-bench-control-"))
    say = ctx.progress or (lambda _line: None)
    try:
        with deployment(
            ctx.variant,
            airflow_cfg=ctx.airflow_cfg,
            parallelism=plan.parallelism,
            database=ctx.database,
            dag_env={
                "ALE_BENCH_CONTROL_TASKS": str(plan.tasks),
                "ALE_BENCH_CONTROL_SLEEP": str(plan.sleep),
                "ALE_BENCH_EXECUTIONS_DIR": str(folder),
            },
            airflow_env={
                "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": str(plan.queued_timeout),
                "AIRFLOW__ASYNC_LOCAL_EXECUTOR__ON_STOP": plan.on_stop,
            },
            progress=ctx.progress,
            keep_home=ctx.keep_home,
        ) as dep:
            wait_parsed(dep, DAG_ID)
            info = dep.executor_info()
            played = {"pause": _pause, "drain": _drain, "resize": _resize}[plan.kind]
            figures, notes = played(plan, dep, ExecutionLog(folder), say)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return Outcome(
        {**_empty(), **figures}, status="ok" if not notes else "claims broken", notes=notes, info=info
    )


# ------------------------------------------------------------------ the operator's commands


def _command(dep: Deployment, *args: str) -> subprocess.CompletedProcess[str]:
    return dep.sandbox.airflow("async-local-executor", *args, timeout=RUN_TIMEOUT, check=False)


def _status(dep: Deployment) -> dict[str, Any] | None:
    """The running executor's status file, or None between two schedulers."""
    for found in read_all(dep.sandbox.home / "async_local_executor"):
        if found.stale is None:
            return found.data
    return None


def _states(dep: Deployment, run_id: str) -> Counter[str | None]:
    return Counter(r.state for r in dep.sandbox.task_instances(DAG_ID, run_id))


def _until(what: str, done: Callable[[], bool], executions: ExecutionLog, guard: float = RUN_TIMEOUT) -> None:
    end = time.monotonic() + guard
    while not done():
        if time.monotonic() > end:
            raise TimeoutError(f"control: {what} not within {guard:.0f}s")
        executions.poll()
        time.sleep(POLL)  # the sampling period


def _ended(dep: Deployment, run_id: str, executions: ExecutionLog) -> str | None:
    _until(
        "the run's end", lambda: dep.sandbox.run_state(DAG_ID, run_id) in ("success", "failed"), executions
    )
    executions.poll()
    return dep.sandbox.run_state(DAG_ID, run_id)


def _outcome(dep: Deployment, run_id: str, executions: ExecutionLog) -> Figures:
    states = _states(dep, run_id)
    per_index = Counter(e.map_index for e in executions.executions.values())
    return {
        "tasks_succeeded": float(states["success"]),
        "tasks_failed": float(states["failed"] + states["upstream_failed"]),
        "task_instances_run_twice": float(sum(1 for n in per_index.values() if n > 1)),
    }


def _requeued(dep: Deployment, offset: int) -> int:
    text = dep.sandbox.process_logs["scheduler"].read_text(errors="replace")[offset:]
    return text.count("Task stuck in queued")


# ------------------------------------------------------------------ the cases


def _pause(
    plan: Plan, dep: Deployment, executions: ExecutionLog, say: Callable[[str], None]
) -> tuple[Figures, list[str]]:
    offset = dep.sandbox.process_logs["scheduler"].stat().st_size
    paused = _command(dep, "pause")
    if paused.returncode:
        return {}, [f"pause failed: {paused.stderr.strip()}"]
    run_id = dep.sandbox.trigger(DAG_ID)
    queued_peak = 0
    say(f"control: {plan.tasks} tasks made while paused; holding the pause {plan.hold:g}s")
    held_until = time.monotonic() + plan.hold
    while time.monotonic() < held_until:  # the hold itself is what is measured
        states = _states(dep, run_id)
        queued_peak = max(queued_peak, states["queued"] + states["running"])
        executions.poll()
        time.sleep(1.0)
    started_while_held = len(executions.executions)
    failed_while_held = _states(dep, run_id)["failed"]
    resumed = time.monotonic()
    _command(dep, "resume")
    state = _ended(dep, run_id, executions)
    figures: Figures = {
        **_outcome(dep, run_id, executions),
        "started_while_held": float(started_while_held),
        "queued_while_paused": float(queued_peak),
        "requeued_stuck_in_queued": float(_requeued(dep, offset)),
        "resume_to_run_end_s": time.monotonic() - resumed,
    }
    notes = [] if state == "success" else [f"the run ended {state}"]
    if started_while_held or queued_peak or failed_while_held or figures["requeued_stuck_in_queued"]:
        notes.append(
            f"while paused: {started_while_held} started, {queued_peak} queued at most, {failed_while_held} failed"
        )
    return figures, notes


def _drain(
    plan: Plan, dep: Deployment, executions: ExecutionLog, say: Callable[[str], None]
) -> tuple[Figures, list[str]]:
    run_id = dep.sandbox.trigger(DAG_ID)
    _until("every task running", lambda: len(executions.running()) == plan.tasks, executions)
    say(f"control: {plan.tasks} running; drain --deadline {plan.deadline:g} --wait")
    began = time.monotonic()
    drained = _command(dep, "drain", "--deadline", f"{plan.deadline:g}", "--wait")
    took = time.monotonic() - began
    overdue = drained.returncode == 3
    named = sum(line.count(" try ") for line in drained.stdout.splitlines() if "deadline passed" in line)
    _command(dep, "resume")
    state = _ended(dep, run_id, executions)
    figures: Figures = {
        **_outcome(dep, run_id, executions),
        "drain_s": took,
        "drain_overdue": float(overdue),
        "named_at_deadline": float(named),
    }
    expected = "failed" if overdue and plan.on_stop == "terminate" else "success"
    notes = [] if state == expected else [f"the run ended {state}, not {expected}"]
    if drained.returncode not in (0, 3):
        notes.append(f"drain exited {drained.returncode}: {drained.stderr.strip()}")
    return figures, notes


def _at_least(count: Callable[[], int], target: int) -> bool:
    return count() >= target


def _resize(
    plan: Plan, dep: Deployment, executions: ExecutionLog, say: Callable[[str], None]
) -> tuple[Figures, list[str]]:
    run_id = dep.sandbox.trigger(DAG_ID)
    samples: list[tuple[int, int]] = []  # (running, limit in force), one status file each

    def sample() -> int:
        data = _status(dep)
        if data is not None and isinstance(data.get("control"), dict):
            samples.append((len(data.get("running") or []), int(data["control"]["parallelism"])))
        return samples[-1][0] if samples else 0

    peaks: list[int] = []
    limits = (plan.parallelism, *plan.limits)
    for step, limit in enumerate(limits):
        if step:
            resized = _command(dep, "resize", "--parallelism", str(limit))
            say(
                f"control: resized to {limit}: {resized.stdout.strip().splitlines()[0] if resized.stdout else resized.stderr}"
            )
        target = min(limit, plan.tasks)
        first = len(samples)
        if step + 1 < len(limits):
            _until(
                f"{target} running under {limit}", functools.partial(_at_least, sample, target), executions
            )
        else:
            _until(
                "the run's end",
                lambda: sample() >= 0 and dep.sandbox.run_state(DAG_ID, run_id) in ("success", "failed"),
                executions,
            )
        phase = samples[first:]
        if step and limit < limits[step - 1]:
            # Lowered: what ran before stops nothing; the peak counts from when fewer than the limit ran.
            under = next((i for i, (running, _) in enumerate(phase) if running <= limit), len(phase))
            phase = phase[under:]
        peaks.append(max((running for running, _ in phase), default=0))
    state = _ended(dep, run_id, executions)
    # A start over the limit in force: the count grew from one sample to the next, past the limit the
    # later one shows (the limit in force when the start was seen).
    over = sum(
        1 for (before, _), (after, limit) in itertools.pairwise(samples) if after > before and after > limit
    )
    figures: Figures = {
        **_outcome(dep, run_id, executions),
        "starts_over_limit": float(over),
        "peak_running_first_limit": float(peaks[0]),
        "peak_running_raised": float(peaks[1]),
        "peak_running_lowered": float(peaks[2]),
    }
    notes = [] if state == "success" else [f"the run ended {state}"]
    if over:
        notes.append(f"{over} sample(s) saw a start at or over the limit in force")
    return figures, notes
