"""Airflow 3's hand-over: workload objects (tasks, callbacks, connection tests) instead of commands.

Each is checked (:mod:`~async_local_executor.adapter.validation`) and becomes a launch of
:mod:`~async_local_executor.adapter.child`, which reads the workload from stdin. Airflow 2 never calls this.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.models.taskinstancekey import TaskInstanceKey

from async_local_executor.adapter import validation
from async_local_executor.adapter.executor_base import ExecutorBase
from async_local_executor.adapter.submissions import describe
from async_local_executor.core.launchers.base import LaunchRequest

if TYPE_CHECKING:
    from airflow.executors.workloads import ExecutorWorkload


class Airflow3Workloads(ExecutorBase):
    """Turns Airflow 3's workloads into launch requests; an invalid one fails alone, unlaunched."""

    def _process_workloads(self, workload_items: Sequence[ExecutorWorkload]) -> None:
        if self._runtime is None:  # before any leaves its queue, so none is lost
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
            label, log_path = describe(key), getattr(workload, "log_path", None)
            with self._last_resort(key, label, workload.failure_state, log_path):
                if (request := self._workload_request(key, label, log_path, workload)) is not None:
                    requests.append(request)
        self._submit(requests)

    def _workload_request(
        self, key: Any, label: str, log_path: str | None, workload: ExecutorWorkload
    ) -> LaunchRequest | None:
        """What launches ``workload``; None when it is invalid (it is then failed, unlaunched, with why)."""
        checked = self._checked(
            key,
            label,
            workload.failure_state,
            log_path,
            validation.airflow3(
                workload,
                is_task=isinstance(key, TaskInstanceKey),
                default_timeout=self._config.task_timeout,
                server=self._server,
                prefix=self._title_prefix,
            ),
        )
        if checked is None:
            return None
        ticket = self._accept(
            key, workload.running_state, workload.success_state, workload.failure_state, label, log_path
        )
        return self._request(ticket, label, checked)
