"""Real Airflow workload objects, built the way the scheduler builds them, minus the database rows."""

from __future__ import annotations

import uuid
from typing import Any

from airflow.executors.workloads import (
    BundleInfo,
    ExecuteCallback,
    ExecuteTask,
    TaskInstanceDTO,
    TestConnection,
)
from airflow.executors.workloads.callback import CallbackDTO, CallbackFetchMethod

TOKEN = "jwt-that-must-stay-off-the-command-line"


def task(
    task_id: str,
    *,
    map_index: int = -1,
    try_number: int = 1,
    executor_config: dict[str, object] | None = None,
    queue: str = "default",
    log_path: str | None = None,
) -> ExecuteTask:
    ti = TaskInstanceDTO(
        id=uuid.uuid4(),
        task_id=task_id,
        dag_id="adapter_dag",
        run_id="manual__1",
        try_number=try_number,
        dag_version_id=uuid.uuid4(),
        map_index=map_index,
        pool_slots=1,
        priority_weight=1,
        executor_config=executor_config,
        queue=queue,
    )
    return ExecuteTask(
        ti=ti,
        dag_rel_path="adapter_dag.py",  # type: ignore[arg-type]
        token=TOKEN,
        log_path=log_path,
        bundle_info=BundleInfo(name="dags-folder"),
    )


def callback(path: str = "tests.adapter.callbacks.ok") -> ExecuteCallback:
    return ExecuteCallback(
        callback=CallbackDTO(
            id=str(uuid.uuid4()), fetch_method=CallbackFetchMethod.IMPORT_PATH, data={"path": path}
        ),
        dag_rel_path="adapter_dag.py",  # type: ignore[arg-type]
        token=TOKEN,
        log_path=None,
        bundle_info=BundleInfo(name="dags-folder"),
    )


def connection_test(conn_id: str = "my_conn") -> TestConnection:
    return TestConnection(connection_test_id=uuid.uuid4(), connection_id=conn_id, timeout=10, token=TOKEN)


class Revoked:
    """What revoke_task reads of a TaskInstance: its key (an ORM row needs a database; tests/e2e has one)."""

    def __init__(self, key: object) -> None:
        self.key = key


def with_config(task_id: str, executor_config: object, map_index: int = -1) -> Any:
    """A task carrying ``executor_config`` as it is: the DTO validates at construction, not assignment,
    and a pickled executor_config from the database reaches an executor unvalidated on Airflow 2."""
    item = task(task_id, map_index=map_index)
    item.ti.executor_config = executor_config  # type: ignore[assignment]
    return item
