"""Throwaway, real Airflow 3.3 deployment for demos, end-to-end tests and benchmarks.

``AirflowSandbox`` writes a fresh ``AIRFLOW_HOME``, gives it a fresh, migrated metadata database
(SQLite file or a newly created PostgreSQL database, copied from one migrated once per process, see
:mod:`harness.templates`), starts ``api-server``, ``scheduler`` and
``dag-processor`` as separate process groups and offers helpers to trigger a DAG and inspect the
outcome. All Airflow configuration goes through environment variables of the child processes;
nothing is read from, or written to, the caller's own Airflow configuration.

Typical use::

    with AirflowSandbox(executor="async_local_executor.AsyncLocalExecutor") as sb:
        sb.wait_for_dag("async_local_executor_demo")
        run_id = sb.trigger("async_local_executor_demo")
        assert sb.wait_for_run("async_local_executor_demo", run_id, timeout=180) == "success"

This module is the harness's public surface; the parts live in :mod:`harness.lifecycle` (setup and
teardown), :mod:`harness.environment`, :mod:`harness.postgres`, :mod:`harness.templates`,
:mod:`harness.processes`, :mod:`harness.rest`, :mod:`harness.metadata` and :mod:`harness.waits`.
"""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from harness import waits
from harness.environment import (
    DEFAULT_DAGS_FOLDER,
    DEMO_CALLBACK_DIR_ENV,
    SANDBOX_MARKER_ENV,
    free_port,
    installed_airflow_major,
)
from harness.lifecycle import PROCESS_NAMES, SandboxLifecycle
from harness.metadata import CallbackRow, TaskInstanceRow
from harness.postgres import PostgresDatabase
from harness.waits import TERMINAL_CALLBACK_STATES, TERMINAL_RUN_STATES, SandboxError, SandboxTimeout

__all__ = [
    "DEFAULT_DAGS_FOLDER",
    "DEMO_CALLBACK_DIR_ENV",
    "PROCESS_NAMES",
    "SANDBOX_MARKER_ENV",
    "TERMINAL_CALLBACK_STATES",
    "TERMINAL_RUN_STATES",
    "AirflowSandbox",
    "CallbackRow",
    "PostgresDatabase",
    "SandboxError",
    "SandboxTimeout",
    "TaskInstanceRow",
    "free_port",
    "installed_airflow_major",
]


class AirflowSandbox(SandboxLifecycle):
    """A real, throwaway Airflow: fresh home, fresh database, api-server + scheduler + dag-processor.

    The constructor's parameters are :class:`harness.lifecycle.SandboxLifecycle`'s. This class adds
    what a test does with the running deployment: crash, stop and restart its processes, change the
    configuration of those started next, trigger and clear runs, and read the outcome.
    """

    # ------------------------------------------------------------------ processes and CLI

    @property
    def pids(self) -> dict[str, int]:
        return self._processes.pids

    def reconfigure(self, values: Mapping[str, str]) -> None:
        """Change configuration (``AIRFLOW__...`` variables) for the processes started from now on.

        What editing airflow.cfg is to a deployment: running processes keep what they read.
        """
        self._env.update(values)

    def kill(self, name: str) -> int:
        """SIGKILL one Airflow process (not its group): a crash, as the kernel's OOM killer does it.

        :return: the pid it had
        """
        return self._processes.kill(name)

    def signal_and_wait(self, name: str, sig: signal.Signals, timeout: float) -> int:
        """Send ``sig`` to one Airflow process (not its group), as Kubernetes does, and wait for its exit.

        :return: its exit status
        :raises SandboxError: if it is still running after ``timeout`` seconds
        """
        return self._processes.signal_and_wait(name, sig, timeout)

    def send_signal(self, name: str, sig: signal.Signals) -> int:
        """Send ``sig`` to one Airflow process (not its group) and return at once, with its pid.

        With :meth:`wait_exited`, a caller can watch the deployment while the process shuts down.
        """
        return self._processes.send_signal(name, sig)

    def wait_exited(self, name: str, timeout: float) -> int | None:
        """Wait up to ``timeout`` seconds for one Airflow process to exit.

        :return: its exit status, or None while it still runs
        """
        return self._processes.wait_exited(name, timeout)

    def restart(self, name: str) -> None:
        """Start a process of this kind again (after :meth:`kill`)."""
        self._processes.restart(name)

    def start_another(self, name: str, args: Sequence[str]) -> int:
        """Start one more long-running Airflow process beside the others (``airflow <args>``), in a process
        group and a log (``proc_logs_dir/<name>.log``) of its own, with the same environment: a second
        ``scheduler`` on the same database and state directory, as a high-availability deployment runs
        two. From then on it is signalled, killed and restarted by ``name`` like the others, and
        :meth:`stop` stops it with them.

        :return: its pid
        """
        if name in ("db-migrate", *PROCESS_NAMES, *self.extra_processes) or not name or "/" in name:
            raise SandboxError(f"invalid or existing process name: {name!r}")
        self.extra_processes[name] = tuple(args)
        self._processes.add(name, self.extra_processes[name], self._layout.process_log(name))
        self._processes.spawn(name)
        return self.pids[name]

    def live_pids(self) -> list[int]:
        """Every live process this sandbox started, directly or not (task processes included)."""
        return self._processes.live_pids()

    def airflow(
        self, *args: str, timeout: float = 120.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run an ``airflow`` CLI command with the sandbox environment and capture its output."""
        return self._processes.run_cli(args, timeout, check)

    # ------------------------------------------------------------------ REST API

    def token(self, username: str) -> str:
        """A JWT for one of the sandbox's ``users``, from the auth manager's ``POST /auth/token``."""
        return self._rest.token(username, self.passwords[username])

    def api(self, method: str, path: str, body: object | None = None, timeout: float = 30.0) -> Any:
        """Call the public REST API (``path`` relative to ``/api/v2``) and return decoded JSON."""
        return self._rest.api(method, path, body, timeout)

    def unpause(self, dag_id: str) -> None:
        self._rest.unpause(dag_id)

    def trigger(
        self,
        dag_id: str,
        conf: Mapping[str, Any] | None = None,
        *,
        run_id: str | None = None,
        unpause: bool = True,
    ) -> str:
        """Unpause ``dag_id`` and create a manual run; return its run_id."""
        if unpause:
            self.unpause(dag_id)
        # Our own run_id keeps log paths free of ':' and '+', unlike the default manual__<iso>.
        run_id = run_id or f"sandbox__{time.strftime('%Y%m%dT%H%M%S')}_{uuid.uuid4().hex[:8]}"
        return self._create_run(dag_id, run_id, dict(conf or {}))

    def _create_run(self, dag_id: str, run_id: str, conf: dict[str, Any]) -> str:
        return self._rest.create_run(dag_id, run_id, conf)

    def clear(self, dag_id: str, run_id: str, task_id: str, map_indexes: Sequence[int]) -> None:
        """Clear some mapped task instances of a run (they run again), as the UI's Clear does."""
        self._rest.clear(dag_id, run_id, task_id, map_indexes)

    def xcom(
        self, dag_id: str, run_id: str, task_id: str, *, key: str = "return_value", map_index: int = -1
    ) -> Any:
        """Deserialized XCom value via the REST API."""
        return self._rest.xcom(dag_id, run_id, task_id, key=key, map_index=map_index)

    # ------------------------------------------------------------------ metadata database

    @property
    def engine(self) -> sa.Engine:
        """Read-side engine on the metadata DB (NullPool: holds no connection between calls)."""
        return self._db.engine

    def query(self, sql: str, **params: Any) -> list[tuple[Any, ...]]:
        """Run read-only SQL against the metadata DB and return plain tuples."""
        return self._db.query(sql, **params)

    def dag_is_parsed(self, dag_id: str) -> bool:
        return self._db.dag_is_parsed(dag_id)

    def import_errors(self) -> list[tuple[str, str]]:
        return self._db.import_errors()

    def wait_for_dag(self, dag_id: str, timeout: float | None = None) -> None:
        """Wait until the dag-processor has serialized ``dag_id`` into the metadata DB."""
        waits.wait_for_dag(self, dag_id, timeout)

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        return self._db.run_state(dag_id, run_id)

    def wait_for_run(
        self, dag_id: str, run_id: str, timeout: float = 300.0, poll_interval: float = 0.2
    ) -> str:
        """Poll the metadata DB until the run is success/failed; return that state."""
        return waits.wait_for_run(self, dag_id, run_id, timeout, poll_interval)

    def task_instances(self, dag_id: str, run_id: str) -> list[TaskInstanceRow]:
        return self._db.task_instances(dag_id, run_id)

    def task_log_path(
        self, dag_id: str, run_id: str, task_id: str, try_number: int, map_index: int = -1
    ) -> Path:
        """Local log file of one try, per the default 3.x ``[logging] log_filename_template``."""
        return self._layout.task_log(dag_id, run_id, task_id, try_number, map_index)

    def missing_task_logs(self, dag_id: str, run_id: str) -> list[Path]:
        """Log files absent for any try (1..try_number) of any task instance that ran."""
        missing: list[Path] = []
        for ti in self.task_instances(dag_id, run_id):
            for attempt in range(1, ti.try_number + 1):
                path = self.task_log_path(dag_id, run_id, ti.task_id, attempt, ti.map_index)
                if not path.is_file():
                    missing.append(path)
        return missing

    def callback_log_path(self, dag_id: str, run_id: str, callback_id: str) -> Path:
        """Log file of an executor callback (``ExecuteCallback.log_path``)."""
        return self._layout.callback_log(dag_id, run_id, callback_id)

    def callbacks(self, dag_id: str | None = None, run_id: str | None = None) -> list[CallbackRow]:
        """Rows of the ``callback`` table; with dag_id/run_id only deadline callbacks of that run."""
        return self._db.callbacks(dag_id, run_id)

    def wait_for_callbacks(
        self,
        dag_id: str,
        run_id: str,
        *,
        count: int = 1,
        timeout: float = 120.0,
        states: Iterable[str] = TERMINAL_CALLBACK_STATES,
    ) -> list[CallbackRow]:
        """Wait until at least ``count`` deadline callbacks of the run are in one of ``states``."""
        return waits.wait_for_callbacks(self, dag_id, run_id, count=count, timeout=timeout, states=states)
