"""Airflow 2.11/2.10: the `tasks run --local` child teaches the fork server what to preload, as on Airflow 3.

The DAG file (named by the command's ``--subdir``) imports a library (markdown-it-py) and a module of the
DAGs folder at its top; its task imports another library (termcolor) inside its function. The task's
raw process, forked by ``tasks run --local``, inherits the record of what it loads. After the first run
the status file lists both libraries as preloaded and the DAGs-folder module as refused; the edited DAG
file and module then run their new code. A real scheduler on PostgreSQL, the default fork-server launcher.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.airflow2 import Airflow2Sandbox
from tests.e2e.helpers import poll, preloaded, refused

DAG_ID = "learned_imports"

pytestmark = pytest.mark.e2e

DAG = """
from datetime import datetime

import markdown_it
from learned_helper import helper_value

from airflow.decorators import dag, task

FILE_VALUE = {value}


@dag(dag_id="{dag_id}", schedule=None, start_date=datetime(2024, 1, 1), catchup=False)
def learned_imports():
    @task(retries=0)
    def show():
        import termcolor

        return f"{{FILE_VALUE}}-{{helper_value()}}-{{termcolor.__name__}}"

    show()


learned_imports()
"""


def write(dags: Path, value: int) -> None:
    (dags / "learned_helper.py").write_text(f"def helper_value():\n    return {value}\n")
    (dags / "learned_dag.py").write_text(DAG.format(value=value, dag_id=DAG_ID))


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[Airflow2Sandbox]:
    dags = tmp_path / "dags"
    dags.mkdir()
    write(dags, 1)
    with Airflow2Sandbox(executor="async_local_executor.AsyncLocalExecutor", dags_folder=dags) as sb:
        yield sb


def run_once(sandbox: Airflow2Sandbox) -> object:
    run_id = sandbox.trigger(DAG_ID)
    assert sandbox.wait_for_run(DAG_ID, run_id, timeout=300) == "success"
    return sandbox.xcom(DAG_ID, run_id, "show")


def test_airflow2_tasks_teach_the_fork_server_and_an_edited_dag_file_runs_its_new_code(
    sandbox: Airflow2Sandbox,
) -> None:
    sandbox.wait_for_dag(DAG_ID, timeout=120)
    assert run_once(sandbox) == "1-1-termcolor"
    poll("the learned libraries preloaded", lambda: {"markdown_it", "termcolor"} <= preloaded(sandbox))
    assert "not a module of an installed distribution" in refused(sandbox)["learned_helper"]
    write(sandbox.dags_folder, 2)
    assert run_once(sandbox) == "2-2-termcolor"
