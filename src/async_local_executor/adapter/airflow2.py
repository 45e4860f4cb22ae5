"""Airflow 2's hand-over: ``airflow tasks run ...`` command lists instead of workloads.

The 2.x base class's ``trigger_tasks`` hands them over in batches (``_process_tasks``); ``execute_async``
takes one. Each becomes a launch of :mod:`~async_local_executor.adapter.child_cli`, which runs the
command. Airflow 3 never calls these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.utils.state import TaskInstanceState

from async_local_executor.adapter import validation
from async_local_executor.adapter.executor_base import ExecutorBase
from async_local_executor.adapter.submissions import describe
from async_local_executor.core.launchers.base import LaunchRequest

if TYPE_CHECKING:
    from airflow.models.taskinstance import TaskInstance


class Airflow2Commands(ExecutorBase):
    """Turns Airflow 2's commands into launch requests, and its deprecated stuck-in-queued hook."""

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
        """What launches the command; None when it is invalid (it is then failed, unlaunched, with why)."""
        self.running.add(key)
        label = describe(key)
        with self._last_resort(key, label, TaskInstanceState.FAILED):
            checked = self._checked(
                key,
                label,
                TaskInstanceState.FAILED,
                None,
                validation.airflow2(
                    command,
                    queue,
                    executor_config,
                    default_timeout=self._config.task_timeout,
                    title=f"{self._title_prefix} {label}",
                ),
            )
            if checked is None:
                return None
            ticket = self._accept(key, None, TaskInstanceState.SUCCESS, TaskInstanceState.FAILED, label, None)
            return self._request(ticket, label, checked)
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
