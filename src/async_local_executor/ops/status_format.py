"""The status file's format: one definition, which :mod:`~async_local_executor.ops.status` fills (mypy
checks every key it writes) and :mod:`~async_local_executor.ops.status_read` checks every file against.

Each record is a :class:`~typing.TypedDict` that its writer fills whole. ``Required[...]`` marks the
fields without which a reader cannot use the record at all: it then skips the record (or, for the file's
own, the file). Any other field that is missing is simply absent, and one that is malformed is left out
and reported. What a plain type cannot say is said by an :data:`~typing.Annotated` rule: :data:`PID`,
:data:`COUNT`, :data:`SAMPLE`. Numbers must be finite, since a reader shows them and writes them back as JSON.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from typing_extensions import Required, TypedDict

from async_local_executor.core.field_rules import COUNT, PID, SAMPLE, Rule
from async_local_executor.core.health import HealthFields
from async_local_executor.core.launchers.base import PreloadSummary

__all__ = [
    "ADOPTION_ADOPTED",
    "ADOPTION_HELD",
    "COUNT",
    "PID",
    "PREFIX",
    "SAMPLE",
    "START_TICKS_KEY",
    "SUFFIX",
    "Adoption",
    "ContainmentFields",
    "DescriptorFields",
    "FailureRow",
    "FinishedRow",
    "MemoryFields",
    "Rule",
    "RunningRow",
    "StatusFile",
]

PREFIX: Final = "status."  # status.<instance>.json in the state directory
SUFFIX: Final = ".json"
# The writer's process start, in clock ticks since boot, which a clock step does not move.
START_TICKS_KEY: Final = "pid_start_ticks"

# A running workload a stopped predecessor handed over is held until its task instance is claimed, then
# adopted; one its own executor launched has no ``adoption``.
Adoption = Literal["held", "adopted"]
ADOPTION_HELD: Final[Adoption] = "held"
ADOPTION_ADOPTED: Final[Adoption] = "adopted"


class RunningRow(TypedDict):
    key: Required[str]  # the task's label
    pid: Required[Annotated[int, PID]]
    queue: str | None
    age_s: float
    adoption: Adoption | None
    memory_mb: float | None
    peak_mb: float | None
    cpu_s: float | None
    memory_from: Literal["cgroup", "proc"]


class FinishedRow(TypedDict):
    at: Required[float]
    key: Required[str]
    outcome: Required[str]
    returncode: int | None
    reason: str | None
    ran_s: float | None


class FailureRow(TypedDict):
    at: Required[float]
    key: Required[str]
    reason: str | None


class MemoryFields(TypedDict):
    guard_holding: bool
    floor_mb: float
    available_mb: float | None


class DescriptorFields(TypedDict):
    open: Annotated[int, COUNT]
    limit: Annotated[int | None, COUNT]  # None: unlimited
    holding: bool  # launches are held back for a full table


class ContainmentFields(TypedDict):
    mode: str
    detail: str


class ControlFields(TypedDict):
    """The live control an executor applied (:mod:`~async_local_executor.ops.control`)."""

    mode: Required[str]  # running, paused, draining or drained
    by: str | None
    at: float | None
    deadline: float | None  # a drain's, wall clock
    overdue: bool  # a drain past its deadline with workloads still running then
    still_running: list[str]  # those workloads
    serial: Required[Annotated[int, COUNT]]  # of the change applied
    parallelism: Annotated[int, COUNT]  # in force
    configured_parallelism: Annotated[int, COUNT]
    queue_limits: dict[str, Annotated[int, COUNT]]  # in force
    configured_queue_limits: dict[str, Annotated[int, COUNT]]
    note: str | None  # for people: "paused by alice at ..."; None when nothing was ever set


class StatusFile(TypedDict):
    # Who wrote it: without its host, its pid, its start and the time of writing, neither its writer nor
    # its age can be told.
    pid: Required[Annotated[int, PID]]
    pid_start_ticks: Required[Annotated[int | None, COUNT]]  # None: its writer could not read its own
    written_at: Required[float]
    hostname: Required[str]
    instance: str
    team: str | None
    executor: str
    parallelism: Annotated[int, COUNT]
    launcher: str
    containment: ContainmentFields | None
    # What its latest health report said.
    health: HealthFields
    loop_lag_ms: float
    peak_loop_lag_ms: float
    running: list[RunningRow]
    waiting: Annotated[int, COUNT]
    oldest_wait_s: float | None
    memory: MemoryFields
    descriptors: DescriptorFields
    launcher_problem: str | None
    launcher_state: str | None
    launcher_pid: Annotated[int | None, PID]
    preload: PreloadSummary | None
    recent_finished: list[FinishedRow]  # the latest first
    history: list[Annotated[list[float], SAMPLE]]  # the oldest first
    recent_launch_failures: list[FailureRow]
    totals: dict[str, Annotated[int, COUNT]]  # launched, memory and descriptor waits, outcomes by kind
    control: ControlFields | None  # live control as applied; None: not known (an older writer)
