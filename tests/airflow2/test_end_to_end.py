"""Airflow 2.11 with this executor: a real scheduler on PostgreSQL runs real `airflow tasks run` commands.

Both launch paths, both spellings of the executor's path (with exactly one dot, Airflow 2 first looks
for a plugin of that name, then imports the module path), and parallelism 0 (unlimited).

Its Airflow 3 counterpart, tests/e2e/test_demo_dag.py, runs another DAG, with the workloads only Airflow 3
gives an executor (a deadline callback, a connection test), and reads other things of its run: the two
share no steps.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.airflow2 import Airflow2Sandbox
from harness.sandbox import TaskInstanceRow
from tests.e2e.helpers import poll

pytestmark = pytest.mark.e2e

DAGS = Path(__file__).with_name("dags")


@pytest.fixture(
    params=[
        # Also on 2.10: the unlaunched task's log file name, its audit record, `tasks run` forked from a
        # helper that preloaded 2.10 and the status command differ from 2.11 (tests/airflow2/README.md).
        pytest.param(
            ("async_local_executor.AsyncLocalExecutor", "forkserver", "4"),
            id="forkserver-p4",
            marks=pytest.mark.airflow210,
        ),
        pytest.param(
            ("async_local_executor.executor.AsyncLocalExecutor", "subprocess", "0"), id="subprocess-p0"
        ),
    ]
)
def sandbox(request: pytest.FixtureRequest) -> Iterator[Airflow2Sandbox]:
    executor, launcher, parallelism = request.param
    sb = Airflow2Sandbox(
        executor=executor,
        dags_folder=DAGS,
        extra_config={
            "AIRFLOW__CORE__PARALLELISM": parallelism,
            "AIRFLOW__ASYNC_LOCAL_EXECUTOR__LAUNCHER": launcher,
        },
    )
    with sb:
        yield sb


def _max_overlap(rows: list[TaskInstanceRow]) -> int:
    edges = sorted(
        [(r.start_date, 1) for r in rows if r.start_date and r.end_date]
        + [(r.end_date, -1) for r in rows if r.start_date and r.end_date]
    )
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


def test_a_dag_runs_to_the_states_it_asks_for(sandbox: Airflow2Sandbox) -> None:
    sandbox.wait_for_dag("demo2", timeout=120)
    run_id = sandbox.trigger("demo2")
    assert sandbox.wait_for_run("demo2", run_id, timeout=300) == "failed"  # `fail` fails on purpose

    rows = sandbox.task_instances("demo2", run_id)
    states = {(r.task_id, r.map_index): r.state for r in rows}
    assert states == {
        **{("sleep", i): "success" for i in range(6)},
        ("total", -1): "success",
        ("fail", -1): "failed",
        ("flaky", -1): "success",
        ("bad_config", -1): "failed",
        ("shell", -1): "success",
    }
    assert sandbox.xcom("demo2", run_id, "total") == 21
    assert sandbox.xcom("demo2", run_id, "flaky") == "second try"
    assert {r.try_number for r in rows if r.task_id == "flaky"} == {2}

    # The task that was never launched says why in its own log, the scheduler log and the audit log.
    [bad] = [r for r in rows if r.task_id == "bad_config"]
    own_log = sandbox.task_log_path("demo2", run_id, "bad_config", bad.try_number).read_text()
    assert (
        'The executor could not run this task: not launched: executor_config["async_local_executor"]'
        in own_log
    )
    assert "workload demo2.bad_config try 1 failed: not launched" in sandbox.log_tail("scheduler", 100_000)

    def audit() -> list[tuple[object, ...]]:
        return sandbox.query(
            "SELECT extra FROM log WHERE event = 'executor launch failed' AND dag_id = 'demo2' "
            "AND task_id = 'bad_config'"
        )

    # The scheduler saves executors' audit records in its next loop.
    poll("the audit record", lambda: bool(audit()), guard=60)
    assert len(audit()) == 1

    # Every try has its log (the unlaunched one, the executor's line).
    assert sandbox.missing_task_logs("demo2", run_id) == []

    # The operator's view through Airflow 2's CLI, which loads the configured executor's commands.
    out = sandbox.airflow("async-local-executor", "status", "--json").stdout
    [status] = json.loads(out[out.index("[\n") :])  # after any log line Airflow prints first
    assert status["pid"] == sandbox.pids["scheduler"]
    assert status["stale"] is None

    parallelism = int(sandbox.env["AIRFLOW__CORE__PARALLELISM"])
    if parallelism:
        assert _max_overlap(rows) <= parallelism
