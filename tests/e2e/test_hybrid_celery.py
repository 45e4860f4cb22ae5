"""AsyncLocalExecutor beside CeleryExecutor in one deployment: each runs its own tasks, and they hand work on.

A real Airflow on PostgreSQL with ``[core] executor = async_local_executor.AsyncLocalExecutor,CeleryExecutor``,
a real ``airflow celery worker`` (Redis broker, PostgreSQL result backend, a queue of its own), and a DAG
whose tasks alternate between the two executors. Every task reports who ran it; the test checks that
each ran where it was routed, and never on the other executor.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from async_local_executor.ops.journal import INSTANCE_ENV
from harness.demo import EXECUTOR
from harness.sandbox import AirflowSandbox
from tests.e2e.helpers import poll

pytestmark = pytest.mark.e2e

# A folder of its own: its tasks name CeleryExecutor, an import error wherever that is not configured.
DAGS = Path(__file__).with_name("dags_celery")
DAG_ID = "hybrid_celery"
# Redis on this machine; this database number is this test's alone, flushed at start.
BROKER = "redis://127.0.0.1:6379/11"
WORKER = "celery-worker"
CELERY_TASKS = frozenset({"celery_a", "celery_b", "celery_last"})
# task_id -> the TI row's executor column: None for the default executor, else what the task named.
EXECUTOR_COLUMN: dict[str, str | None] = {
    "local_first": None,
    "local_side": None,
    "local_join": EXECUTOR,
    **dict.fromkeys(CELERY_TASKS, "CeleryExecutor"),
}
RUN_GUARD = 300.0


@pytest.fixture
def sandbox() -> Iterator[AirflowSandbox]:
    """The conftest's sandbox, less simple: Celery's settings name the sandbox's own database."""
    redis.Redis.from_url(BROKER).flushdb()
    sb = AirflowSandbox(
        executor=f"{EXECUTOR},CeleryExecutor",
        database="postgres",
        dags_folder=DAGS,
        parallelism=4,
        extra_config={
            "AIRFLOW__CELERY__BROKER_URL": BROKER,
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": "2",
        },
        extra_processes={
            # The scheduler's log server already holds [logging] worker_log_server_port; the worker
            # writes task logs into the same folder, so the api-server reads them without it.
            WORKER: ("celery", "worker", "--skip-serve-logs", "--without-mingle", "--without-gossip"),
        },
    )
    assert sb.postgres is not None
    sb.reconfigure(
        {
            # Celery's database backend: "db+" and a SQLAlchemy URL; it creates its own tables there.
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{sb.sql_alchemy_conn}",
            # Tasks go to, and the worker listens on, this queue only: no other worker takes them.
            "AIRFLOW__OPERATORS__DEFAULT_QUEUE": f"hybrid-{sb.postgres.name}",
        }
    )
    with sb:
        yield sb


def test_tasks_run_on_the_executor_they_are_routed_to_and_hand_work_across(sandbox: AirflowSandbox) -> None:
    assert INSTANCE_ENV == "ASYNC_LOCAL_EXECUTOR_INSTANCE"  # the variable the DAG file reads
    sandbox.wait_for_dag(DAG_ID, timeout=120)
    # Tasks wait in Redis until the worker consumes, so this only makes a broken worker fail early.
    poll("the celery worker ready", lambda: " ready." in _worker_log(sandbox), guard=120)
    run_id = sandbox.trigger(DAG_ID)

    assert sandbox.wait_for_run(DAG_ID, run_id, timeout=RUN_GUARD) == "success"

    rows = sandbox.query(
        "SELECT task_id, state, executor, queue FROM task_instance WHERE dag_id = :dag_id AND run_id = :run_id",
        dag_id=DAG_ID,
        run_id=run_id,
    )
    assert {r[0]: r[1] for r in rows} == dict.fromkeys(EXECUTOR_COLUMN, "success")
    assert {r[0]: r[2] for r in rows} == EXECUTOR_COLUMN
    assert {r[3] for r in rows} == {sandbox.env["AIRFLOW__OPERATORS__DEFAULT_QUEUE"]}

    worker_pid = sandbox.pids[WORKER]
    scheduler_pid = sandbox.pids["scheduler"]
    evidence = {task_id: sandbox.xcom(DAG_ID, run_id, task_id) for task_id in EXECUTOR_COLUMN}
    for task_id, seen in evidence.items():
        ancestors = [a["pid"] for a in seen["ancestors"]]
        titles = " | ".join(a["cmdline"] for a in seen["ancestors"])
        where = f"{task_id}: {_describe(seen)}"
        if task_id in CELERY_TASKS:
            # Task process <- Celery pool process (the task supervisor) <- the worker we started.
            assert worker_pid in ancestors, where
            assert scheduler_pid not in ancestors, where
            assert "celeryd" in titles, where
            assert "AsyncLocalExecutor" not in titles, where
            assert seen["instance"] is None, where
        else:
            # Task process <- our workload process <- the scheduler (our fork server forks it as the
            # scheduler's own child).
            assert scheduler_pid in ancestors, where
            assert worker_pid not in ancestors, where
            assert "AsyncLocalExecutor" in titles, where
            assert "celeryd" not in titles, where
            assert seen["instance"], where
    # One executor instance launched every default-executor task.
    assert len({seen["instance"] for task_id, seen in evidence.items() if task_id not in CELERY_TASKS}) == 1

    # Work handed across: each task received its upstream's result, computed on the other executor.
    assert evidence["celery_a"]["upstream_pids"] == [evidence["local_first"]["pid"]]
    assert evidence["local_join"]["upstream_pids"] == [
        evidence["celery_a"]["pid"],
        evidence["celery_b"]["pid"],
    ]
    assert evidence["celery_last"]["upstream_pids"] == [evidence["local_join"]["pid"]]

    # The worker's own log names exactly the Celery tasks of the run.
    executed = set(re.findall(r"Executing workload in Celery: .*?task_id='(\w+)'", _worker_log(sandbox)))
    assert executed == CELERY_TASKS


def _worker_log(sandbox: AirflowSandbox) -> str:
    return sandbox.process_logs[WORKER].read_text(errors="replace")


def _describe(seen: dict[str, Any]) -> str:
    chain = " <- ".join(f"{a['pid']} {a['cmdline'][:80]}" for a in seen["ancestors"])
    return f"pid {seen['pid']}, {INSTANCE_ENV}={seen['instance']}, ancestors: {chain}"
