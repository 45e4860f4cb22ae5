"""With default options, a real Airflow's tasks teach the fork server what to preload, and edits still count.

The DAG file imports a library (markdown-it-py) and a module of the DAGs folder at its top, and its task
imports another library (termcolor) inside its function. After the first run, the status file lists
both libraries as preloaded and the DAGs-folder module as refused (never preloaded: it is the user's
code). Then the DAG file and that module are edited, and the second run's task returns what the new
code returns. Nothing is mocked: SQLite, the default fork-server launcher, real task processes.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.demo import EXECUTOR
from harness.sandbox import AirflowSandbox
from tests.e2e.helpers import poll, preloaded, refused

pytestmark = pytest.mark.e2e

DAG_ID = "learned_imports"
DAG = """
import markdown_it
from learned_helper import helper_value

from airflow.sdk import dag, task

FILE_VALUE = {file_value}


@dag(dag_id="{dag_id}", schedule=None, catchup=False, tags=["e2e"])
def learned_imports():
    @task(retries=0)
    def show():
        import termcolor

        return f"{{FILE_VALUE}}-{{helper_value()}}-{{termcolor.__name__}}"

    show()


learned_imports()
"""
HELPER = "def helper_value():\n    return {value}\n"


def write(dags: Path, value: int) -> None:
    (dags / "learned_helper.py").write_text(HELPER.format(value=value))
    (dags / "learned_dag.py").write_text(textwrap.dedent(DAG.format(file_value=value, dag_id=DAG_ID)))


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[AirflowSandbox]:
    dags = tmp_path / "dags"
    dags.mkdir()
    write(dags, 1)
    with AirflowSandbox(executor=EXECUTOR, dags_folder=dags, parallelism=4) as sb:
        yield sb


def run_once(sandbox: AirflowSandbox) -> object:
    run_id = sandbox.trigger(DAG_ID)
    assert sandbox.wait_for_run(DAG_ID, run_id) == "success"
    return sandbox.xcom(DAG_ID, run_id, "show")


def test_tasks_teach_the_fork_server_what_to_preload_and_an_edited_dag_file_runs_its_new_code(
    sandbox: AirflowSandbox,
) -> None:
    sandbox.wait_for_dag(DAG_ID)
    assert run_once(sandbox) == "1-1-termcolor"
    poll("the learned libraries preloaded", lambda: {"markdown_it", "termcolor"} <= preloaded(sandbox))
    reasons = refused(sandbox)
    assert "not a module of an installed distribution" in reasons["learned_helper"]
    assert not any(m.startswith("unusual_prefix") for m in preloaded(sandbox))
    write(sandbox.dags_folder, 2)
    # The task process parses the file as it is now (the DAG's shape is unchanged, so it may run before
    # the dag-processor has seen the edit): nothing of the user's code was preloaded.
    assert run_once(sandbox) == "2-2-termcolor"
    took_over = [
        line
        for line in sandbox.process_logs["scheduler"].read_text(errors="replace").splitlines()
        if "took over:" in line
    ]
    assert took_over, "the scheduler log says when the preloaded set changes"
    assert any("markdown_it" in line for line in took_over)
