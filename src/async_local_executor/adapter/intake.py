"""The intake of Airflow's workloads: what differs between the majors in taking a workload in, what runs
it, and telling its task what happened.

Airflow 3 hands the executor workload objects (tasks, callbacks, connection tests) out of three queues
(``_process_workloads``), each run by :mod:`~async_local_executor.adapter.workload.airflow3`; Airflow 2
hands it ``airflow tasks run ...`` command lists (``_process_tasks``, ``execute_async``), each run by
:mod:`~async_local_executor.adapter.workload.airflow2`. Either becomes an :class:`Incoming`, which the
executor accepts, checks and launches the same way.

Rule: nothing here holds executor state. These are plain functions of what the scheduler handed over;
the executor owns what it keeps and calls them.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow.models.taskinstancekey import TaskInstanceKey
from airflow.utils.state import TaskInstanceState

from async_local_executor.adapter import tasklog, validation
from async_local_executor.adapter.compat import AIRFLOW_V3
from async_local_executor.adapter.metadata_db import airflow2_audit, airflow2_log_path
from async_local_executor.adapter.submissions import describe
from async_local_executor.adapter.workload import airflow2, airflow3, entry

if TYPE_CHECKING:
    from airflow.executors.workloads import ExecutorWorkload
    from airflow.executors.workloads.types import WorkloadState

log = logging.getLogger(__name__)

# What runs one workload on this major: `python -m` of it, or its `forked_main` in a fork-server child.
ENTRY_MODULE = airflow3.__name__ if AIRFLOW_V3 else airflow2.__name__


@dataclass(frozen=True)
class Incoming:
    """One workload as the scheduler handed it in, in the terms both majors share.

    :ivar log_path: the task's log file, relative to ``[logging] base_log_folder`` (Airflow 3 only)
    :ivar checked: what it launches with, or why it cannot (:mod:`~async_local_executor.adapter.validation`)
    """

    key: Any
    label: str
    running: WorkloadState | None
    success: WorkloadState
    failure: WorkloadState
    log_path: str | None
    checked: validation.Checked | str
    ti_id: str | None = None  # Airflow 3: the task instance's id, recorded if the workload is handed over


def entry_argv(
    parent_pid: int,
    cpu_priority: str,
    learn_dir: str,
    path0: str | None,
    *,
    handover_timeout: float = 0.0,
    custody_dir: str = "",
) -> tuple[str, ...]:
    """The command that runs one workload; it reads the workload (or Airflow 2 command) from stdin.

    :param handover_timeout: how long it outlives a stopped executor waiting for adoption; 0 = not at all
    :param custody_dir: where it learns who owns it, and records its exit status once handed over
    """
    flags = entry.argv_flags(
        parent_pid, cpu_priority, learn_dir, path0, handover_timeout=handover_timeout, custody_dir=custody_dir
    )
    return (sys.executable, "-m", ENTRY_MODULE, *flags)


def fork_target() -> str:
    """What a fork-server child runs: ``module:function`` taking ``(argv, stdin_bytes)``."""
    return f"{ENTRY_MODULE}:forked_main"


def dequeue(key: Any, *queues: dict[Any, Any]) -> None:
    """Airflow 3: take a workload out of the one queue that holds it (each holds one kind of key)."""
    for queue in queues:
        if queue.pop(key, None):
            return
    raise KeyError(f"Workload {key} was not found in any queue")


def from_workload(
    workload: ExecutorWorkload,
    label: str,
    log_path: str | None,
    *,
    default_timeout: float,
    server: str,
    prefix: str,
) -> Incoming:
    """Airflow 3: a workload object, checked.

    :param server: where its task process reaches the execution API
    :param prefix: its process title's start; the workload's display name follows
    """
    key = workload.key
    checked = validation.airflow3(
        workload,
        is_task=isinstance(key, TaskInstanceKey),
        default_timeout=default_timeout,
        server=server,
        prefix=prefix,
    )
    ti = getattr(workload, "ti", None)
    ti_id = getattr(ti, "id", None)
    return Incoming(
        key,
        label,
        workload.running_state,
        workload.success_state,
        workload.failure_state,
        log_path,
        checked,
        str(ti_id) if ti_id is not None else None,
    )


def from_command(
    key: Any,
    label: str,
    command: list[str],
    queue: str | None,
    executor_config: Any,
    *,
    default_timeout: float,
    prefix: str,
) -> Incoming:
    """Airflow 2: an ``airflow tasks run`` command, checked. Its task has no running state to report."""
    checked = validation.airflow2(
        command, queue, executor_config, default_timeout=default_timeout, title=f"{prefix} {label}"
    )
    return Incoming(key, label, None, TaskInstanceState.SUCCESS, TaskInstanceState.FAILED, None, checked)


def tell_the_task(folder: str, relative: str | None, key: Any, message: str, audit: str = "") -> None:
    """Append ``message`` to the task's own log; on Airflow 2 also to its audit log as ``audit``.

    Runs in a worker thread of the loop: on Airflow 2 this reads and writes the database. Never raises:
    an exception here would end the loop's task group, and every workload with it.

    :param relative: the task's log file under ``folder`` (Airflow 3); Airflow 2 renders it itself
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
