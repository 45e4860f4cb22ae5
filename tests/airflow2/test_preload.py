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
from tests.e2e.helpers import LEARNED_DAG_ID, poll, preloaded, refused, write_learned_dag

pytestmark = pytest.mark.e2e


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[Airflow2Sandbox]:
    dags = tmp_path / "dags"
    dags.mkdir()
    write_learned_dag(dags, 1)
    config = {"AIRFLOW__ASYNC_LOCAL_EXECUTOR__PRELOAD_INTERVAL": "5"}  # 60 s by default
    executor = "async_local_executor.AsyncLocalExecutor"
    with Airflow2Sandbox(executor=executor, dags_folder=dags, extra_config=config) as sb:
        yield sb


def run_once(sandbox: Airflow2Sandbox) -> object:
    run_id = sandbox.trigger(LEARNED_DAG_ID)
    assert sandbox.wait_for_run(LEARNED_DAG_ID, run_id, timeout=300) == "success"
    return sandbox.xcom(LEARNED_DAG_ID, run_id, "show")


def test_airflow2_tasks_teach_the_fork_server_and_an_edited_dag_file_runs_its_new_code(
    sandbox: Airflow2Sandbox,
) -> None:
    sandbox.wait_for_dag(LEARNED_DAG_ID, timeout=120)
    assert run_once(sandbox) == "1-1-termcolor"
    poll("the learned libraries preloaded", lambda: {"markdown_it", "termcolor"} <= preloaded(sandbox))
    assert "not a module of an installed distribution" in refused(sandbox)["learned_helper"]
    write_learned_dag(sandbox.dags_folder, 2)
    assert run_once(sandbox) == "2-2-termcolor"
