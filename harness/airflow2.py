"""The throwaway deployment of :mod:`sandbox`, for Airflow 2.10/2.11.

An Airflow 2 deployment is a scheduler (which parses DAG files itself) and a webserver nobody here
needs: runs are triggered with the CLI and read from the database. Airflow 2 refuses SQLite for any
executor that runs tasks in parallel, so the database is PostgreSQL.

    with Airflow2Sandbox(executor="async_local_executor.executor.AsyncLocalExecutor") as sb:
        sb.wait_for_dag("demo")
        assert sb.wait_for_run("demo", sb.trigger("demo")) == "success"
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from typing import Any

from harness.sandbox import AirflowSandbox, SandboxError, SandboxTimeout

__all__ = ["Airflow2Sandbox"]

# How recent the scheduler job's heartbeat must be for the deployment to count as up.
_HEARTBEAT_FRESH = 10.0
# Airflow 2's CLI cannot clear single map indexes; its own clear_task_instances can.
_CLEAR = """
import json, sys
from airflow.models.taskinstance import TaskInstance, clear_task_instances
from airflow.utils.session import create_session
from airflow.utils.state import DagRunState
dag_id, run_id, task_id, indexes = json.loads(sys.argv[1])
with create_session() as session:
    tis = session.query(TaskInstance).filter(
        TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id, TaskInstance.task_id == task_id,
        TaskInstance.map_index.in_(indexes),
    ).all()
    clear_task_instances(tis, session, dag_run_state=DagRunState.QUEUED)
"""


class Airflow2Sandbox(AirflowSandbox):
    """:class:`AirflowSandbox` for Airflow 2: the scheduler alone, PostgreSQL by default."""

    process_names = ("scheduler",)

    def __init__(self, *, database: str = "postgres", **kwargs: Any) -> None:
        super().__init__(database=database, **kwargs)

    def _build_env(self) -> dict[str, str]:
        env = super()._build_env()
        # Airflow 3's auth manager does not exist in 2 (whose webserver has its own, and is not run).
        for key in [k for k in env if k.startswith("AIRFLOW__CORE__") and "AUTH_MANAGER" in k]:
            del env[key]
        env.update(
            {
                # The scheduler's own DAG file processor: it finds a new file within 5 s (a test does not
                # wait), and parses each file again every 30 s, Airflow's default (more often costs each
                # idle deployment CPU that the suite's others need).
                "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "30",
                "AIRFLOW__SCHEDULER__DAG_DIR_LIST_INTERVAL": "5",
                "AIRFLOW__SCHEDULER__STANDALONE_DAG_PROCESSOR": "False",
                "AIRFLOW__WEBSERVER__SECRET_KEY": env["AIRFLOW__API__SECRET_KEY"],
            }
        )
        env.update(self._extra_config)
        return env

    def wait_healthy(self, timeout: float = 120.0) -> dict[str, Any]:
        """Wait until the scheduler's job heartbeats in the database."""
        age: float | None = None

        def probe() -> bool:
            nonlocal age
            rows = self.query(
                "SELECT EXTRACT(EPOCH FROM (now() - latest_heartbeat)) FROM job "
                "WHERE job_type = 'SchedulerJob' AND state = 'running' ORDER BY latest_heartbeat DESC"
            )
            age = float(rows[0][0]) if rows else None
            return age is not None and age < _HEARTBEAT_FRESH

        try:
            self._wait("a heartbeating scheduler", probe, timeout, "scheduler", interval=0.2)
        except SandboxTimeout:
            raise SandboxTimeout(
                f"timed out after {timeout:.0f}s waiting for the scheduler's heartbeat (last age {age})\n"
                f"scheduler log tail:\n{self.log_tail('scheduler')}"
            ) from None
        return {"scheduler": {"status": "healthy", "heartbeat_age": age}}

    def dag_is_parsed(self, dag_id: str) -> bool:
        rows = self.query(
            "SELECT d.is_active FROM dag d JOIN serialized_dag s ON s.dag_id = d.dag_id "
            "WHERE d.dag_id = :dag_id",
            dag_id=dag_id,
        )
        return any(bool(row[0]) for row in rows)

    def unpause(self, dag_id: str) -> None:
        self.airflow("dags", "unpause", dag_id)

    def _create_run(self, dag_id: str, run_id: str, conf: dict[str, Any]) -> str:
        self.airflow("dags", "trigger", dag_id, "--run-id", run_id, "--conf", json.dumps(conf))
        return run_id

    def clear(self, dag_id: str, run_id: str, task_id: str, map_indexes: Sequence[int]) -> None:
        """Clear some mapped task instances of a run with Airflow's own function (what the UI calls)."""
        result = subprocess.run(
            [str(self.python), "-c", _CLEAR, json.dumps([dag_id, run_id, task_id, list(map_indexes)])],
            env=self._env,
            cwd=self.home,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if result.returncode != 0:
            raise SandboxError(f"clearing {dag_id}/{run_id}/{task_id} failed:\n{result.stderr[-3000:]}")

    def xcom(
        self, dag_id: str, run_id: str, task_id: str, *, key: str = "return_value", map_index: int = -1
    ) -> Any:
        """The XCom value, as Airflow 2's default backend stores it (JSON)."""
        rows = self.query(
            "SELECT value FROM xcom WHERE dag_id = :dag_id AND run_id = :run_id AND task_id = :task_id "
            "AND key = :key AND map_index = :map_index",
            dag_id=dag_id,
            run_id=run_id,
            task_id=task_id,
            key=key,
            map_index=map_index,
        )
        return json.loads(bytes(rows[0][0])) if rows else None
