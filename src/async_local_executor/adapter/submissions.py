"""What the executor keeps per submitted workload, and the mailbox the loop thread hands events back in."""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow.models.taskinstancekey import TaskInstanceKey

from async_local_executor.adapter.compat import CallbackKey, ConnectionTestKey
from async_local_executor.core.clock import SYSTEM, Clock
from async_local_executor.core.outcome import Outcome

if TYPE_CHECKING:
    from airflow.executors.workloads.types import WorkloadState


@dataclass(frozen=True)
class Started:
    key: Hashable
    pid: int
    at: float  # wall clock, when the loop learnt the pid


@dataclass(frozen=True)
class Ticket:
    """One submission of a workload: the loop's key for it.

    Airflow's key names the try, not the submission: after a revoke the scheduler may queue the same
    key again while the revoked process is still being stopped, and that process's outcome must not
    be taken for the new one's.
    """

    key: Hashable
    serial: int


@dataclass(frozen=True)
class Submission:
    """What the executor keeps of one accepted workload until its final event: its submission and the
    states Airflow is told as it starts, succeeds or fails."""

    ticket: Ticket
    running: WorkloadState | None
    success: WorkloadState
    failure: WorkloadState
    label: str
    log_path: str | None = None  # the task's log file, relative to [logging] base_log_folder
    accepted: float = 0.0  # wall clock, when the scheduler handed it over
    ti_id: str | None = None  # Airflow 3: its task instance's id, recorded if it is handed over
    timeout: float | None = None  # its run-time limit, recorded for a successor that adopts it


class Mailbox:
    """The supervisor's listener: runs on the loop thread and only appends to a deque."""

    def __init__(self, clock: Clock = SYSTEM) -> None:
        self.events: deque[Started | Outcome] = deque()
        self._clock = clock

    def started(self, key: Hashable, pid: int) -> None:
        self.events.append(Started(key, pid, self._clock.time()))

    def finished(self, outcome: Outcome) -> None:
        self.events.append(outcome)


def describe(key: object) -> str:
    """A short name for a workload key, for log lines."""
    if isinstance(key, Ticket):
        key = key.key
    if isinstance(key, TaskInstanceKey):
        mapped = f"[{key.map_index}]" if key.map_index >= 0 else ""
        return f"{key.dag_id}.{key.task_id}{mapped} try {key.try_number}"
    if isinstance(key, CallbackKey):
        return f"callback {key.id}"
    if isinstance(key, ConnectionTestKey):
        return f"connection-test {key.id}"
    return str(key)
