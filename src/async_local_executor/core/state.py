"""What the supervisor reports about itself: the snapshot types and the running counts behind them."""

from __future__ import annotations

import collections
from collections.abc import Mapping
from dataclasses import dataclass, field

from async_local_executor.core.admission import Admission
from async_local_executor.core.cgroups.group import WorkloadCgroup
from async_local_executor.core.descriptors import Table
from async_local_executor.core.launchers.base import LauncherReport, PreloadSummary
from async_local_executor.core.outcome import Outcome, OutcomeKind

# Launch failures kept for the health check and the status report.
RECENT_FAILURES = 20
# Finished workloads kept for the status report (the dashboard's "last finished" table).
RECENT_FINISHED = 20


@dataclass(frozen=True)
class RunningWorkload:
    label: str
    pid: int
    launched: float  # wall clock
    group: str
    cgroup: WorkloadCgroup | None = None  # where its memory and CPU are accounted, when contained
    adopted: bool = False  # launched by a stopped predecessor, handed over to this supervisor


@dataclass(frozen=True)
class LaunchFailure:
    at: float  # wall clock
    label: str
    reason: str


@dataclass(frozen=True)
class FinishedWorkload:
    """One workload's end, as the status report lists it."""

    at: float  # wall clock
    label: str
    outcome: str  # "ok" or an OutcomeKind value
    returncode: int | None
    reason: str
    ran_s: float | None  # seconds from launch to exit; None when it never had a process


@dataclass(frozen=True)
class SupervisorState:
    """What the supervisor is doing, as of one moment; built on the loop thread, read anywhere."""

    running: tuple[RunningWorkload, ...]
    waiting: int  # accepted, no process yet (waiting for a slot, for memory, or being launched)
    oldest_waiting_since: float | None  # wall clock acceptance of the longest-waiting one
    memory_low: bool
    memory_floor: int  # bytes; 0 when the guard is off
    available_memory: int | None  # bytes, as last read by the guard
    launcher_problem: str | None
    recent_failures: tuple[LaunchFailure, ...]
    launched_total: int
    last_launched_at: float | None  # wall clock of the latest successful launch
    memory_waits_total: int  # workloads that had to wait for memory
    outcomes_total: Mapping[str, int]  # OutcomeKind value (or "ok") -> count
    recent_finished: tuple[FinishedWorkload, ...] = ()  # the latest last
    launcher_state: str | None = None  # the launch path in words (which fork server, say)
    launcher_pid: int | None = None  # the fork server's helper, while one runs
    preload: PreloadSummary | None = None  # what the fork server preloads and refused (learned)
    # The descriptor table when a launch found it full, while launches are held back for it; else None.
    descriptors_full: Table | None = None
    descriptor_waits_total: int = 0  # launches that found the descriptor table full and waited
    paused: bool = False  # pausable workloads are held back (a pause or a drain)
    held: int = 0  # workloads holding a slot: launching or running (adopted ones too)
    limit: int | None = None  # the executor-wide limit in force; None: none
    group_limits: Mapping[str, int] = field(default_factory=dict)  # each group's limit in force


class Tally:
    """Counts kept since the supervisor started: launches, outcomes by kind, the latest launch failures."""

    def __init__(self) -> None:
        self.failures: collections.deque[LaunchFailure] = collections.deque(maxlen=RECENT_FAILURES)
        self.finished_recently: collections.deque[FinishedWorkload] = collections.deque(
            maxlen=RECENT_FINISHED
        )
        self.launched_total = 0
        self.last_launched_at: float | None = None  # wall clock
        self.outcomes_total: collections.Counter[str] = collections.Counter()

    def launched(self, at: float) -> None:
        self.launched_total += 1
        self.last_launched_at = at

    def finished(self, outcome: Outcome, label: str, at: float) -> None:
        kind = "ok" if outcome.ok else outcome.kind.value
        self.outcomes_total[kind] += 1
        times = outcome.times
        ran = None
        if times is not None and times.launched is not None and times.ended is not None:
            ran = round(times.ended - times.launched, 1)
        self.finished_recently.append(
            FinishedWorkload(at, label, kind, outcome.returncode, outcome.reason, ran)
        )
        if outcome.kind is OutcomeKind.LAUNCH_FAILED:
            self.failures.append(LaunchFailure(at, label, outcome.reason))


def snapshot(
    *,
    running: tuple[RunningWorkload, ...],
    waiting: int,
    oldest_waiting_since: float | None,
    admission: Admission,
    tally: Tally,
    launcher: LauncherReport,
) -> SupervisorState:
    """The supervisor's state now, from its own records and its launcher's report."""
    return SupervisorState(
        running=running,
        waiting=waiting,
        oldest_waiting_since=oldest_waiting_since,
        memory_low=admission.memory_low,
        memory_floor=admission.memory_floor,
        available_memory=admission.last_available,
        launcher_problem=launcher.problem,
        recent_failures=tuple(tally.failures),
        launched_total=tally.launched_total,
        last_launched_at=tally.last_launched_at,
        memory_waits_total=admission.memory_waits_total,
        outcomes_total=dict(tally.outcomes_total),
        recent_finished=tuple(tally.finished_recently),
        launcher_state=launcher.description,
        launcher_pid=launcher.pid,
        preload=launcher.preload,
        descriptors_full=admission.descriptors_full,
        descriptor_waits_total=admission.descriptor_waits_total,
        paused=admission.paused,
        held=admission.held,
        limit=admission.limit,
        group_limits=admission.group_limits,
    )
