"""On the airflow.cfg Airflow generates, task processes get the executor's safe client timeout.

Airflow writes every option with its default into the airflow.cfg it generates on its first start,
``[workers] execution_api_timeout = 5.0`` among them. With 5 s, a burst of task starts against one
api-server worker loses tasks on SQLite (the task SDK's retried ``PATCH .../run`` commits after the
task finished). The executor takes that value as Airflow's default, not as the operator's choice, and
gives its task processes 60 s; a value the operator wrote is kept. Real api-server, scheduler and
dag-processor on SQLite; the tasks report the timeout their own process's client uses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest

from harness.demo import EXECUTOR
from harness.sandbox import AirflowSandbox
from tests.e2e.helpers import DAGS, stop_scheduler

pytestmark = pytest.mark.e2e

DAG_ID, TASK_ID, TASKS = "observe", "look", 4  # dags/observe.py
OPERATORS_CHOICE = 17.0
STOP_GUARD = 120.0
LINE = re.compile(r"task processes (?:get|keep) \[workers\] execution_api_timeout = [^\n]*")


@dataclass
class Seen:
    airflow_cfg: str
    # Per run: what each task reported, and the scheduler log's start lines about the timeout.
    generated: list[dict[str, Any]]
    edited: list[dict[str, Any]]
    lines: list[str]


def run_and_observe(sandbox: AirflowSandbox) -> list[dict[str, Any]]:
    run_id = sandbox.trigger(DAG_ID)
    assert sandbox.wait_for_run(DAG_ID, run_id, timeout=300) == "success"
    return [sandbox.xcom(DAG_ID, run_id, TASK_ID, map_index=i) for i in range(TASKS)]


@pytest.fixture(scope="module")
def seen() -> Seen:
    # Nothing in the environment about the timeout: the sandbox leaves airflow.cfg to Airflow.
    with AirflowSandbox(executor=EXECUTOR, dags_folder=DAGS, parallelism=TASKS) as sandbox:
        cfg = sandbox.airflow_cfg_path
        text = cfg.read_text()
        sandbox.wait_for_dag(DAG_ID)
        generated = run_and_observe(sandbox)
        # The operator edits airflow.cfg and restarts the scheduler, as a deployment does.
        cfg.write_text(
            text.replace("execution_api_timeout = 5.0\n", f"execution_api_timeout = {OPERATORS_CHOICE}\n")
        )
        stop_scheduler(sandbox, STOP_GUARD)
        sandbox.restart("scheduler")
        sandbox.wait_healthy()
        edited = run_and_observe(sandbox)
        log = sandbox.process_logs["scheduler"].read_text(errors="replace")
    return Seen(text, generated, edited, LINE.findall(log))


def test_the_home_runs_on_the_airflow_cfg_airflow_generated(seen: Seen) -> None:
    assert "\n[workers]\n" in seen.airflow_cfg
    assert "\nexecution_api_timeout = 5.0\n" in seen.airflow_cfg
    # Every option with its default, this package's own section too (its provider's options).
    assert "\n[async_local_executor]\n" in seen.airflow_cfg


def test_task_processes_get_60s_where_airflow_cfg_holds_airflow_s_default(seen: Seen) -> None:
    assert sorted(o["i"] for o in seen.generated) == list(range(TASKS))
    assert {o["api_timeout"] for o in seen.generated} == {60.0}
    assert {o["api_timeout_env"] for o in seen.generated} == {"60"}


def test_an_operators_own_value_in_airflow_cfg_is_kept(seen: Seen) -> None:
    assert {o["api_timeout"] for o in seen.edited} == {OPERATORS_CHOICE}
    assert {o["api_timeout_env"] for o in seen.edited} == {None}


def test_each_start_says_in_one_line_what_it_chose_and_why(seen: Seen) -> None:
    first, second = seen.lines
    assert first.startswith(
        "task processes get [workers] execution_api_timeout = 60s: Airflow's default of 5s"
    )
    assert "(in airflow.cfg as Airflow writes it)" in first
    assert second.startswith("task processes keep [workers] execution_api_timeout = 17s: set in airflow.cfg")
