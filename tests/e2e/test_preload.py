"""With default options, a real Airflow's tasks teach the fork server what to preload, and edits still count.

The DAG file imports a library (markdown-it-py) and a module of the DAGs folder at its top, and its task
imports another library (termcolor) inside its function. After the first run, the status file lists
both libraries as preloaded and the DAGs-folder module as refused (never preloaded: it is the user's
code). Then the DAG file and that module are edited, and the second run's task returns what the new
code returns. Nothing is mocked: SQLite, the default fork-server launcher, real task processes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.sandbox import AirflowSandbox
from tests.e2e.helpers import LEARNED_DAG_ID, poll, preloaded, refused, write_learned_dag

pytestmark = [
    pytest.mark.e2e,
    # What the task imports is learned after the DAG file's imports: the second fork server may follow
    # the first after 5 s here (60 s by default).
    pytest.mark.sandbox(config={"AIRFLOW__ASYNC_LOCAL_EXECUTOR__PRELOAD_INTERVAL": "5"}),
]


@pytest.fixture
def sandbox_dags(tmp_path: Path) -> Path:
    dags = tmp_path / "dags"
    dags.mkdir()
    write_learned_dag(dags, 1)
    return dags


def run_once(sandbox: AirflowSandbox) -> object:
    run_id = sandbox.trigger(LEARNED_DAG_ID)
    assert sandbox.wait_for_run(LEARNED_DAG_ID, run_id) == "success"
    return sandbox.xcom(LEARNED_DAG_ID, run_id, "show")


def test_tasks_teach_the_fork_server_what_to_preload_and_an_edited_dag_file_runs_its_new_code(
    sandbox: AirflowSandbox,
) -> None:
    sandbox.wait_for_dag(LEARNED_DAG_ID)
    assert run_once(sandbox) == "1-1-termcolor"
    poll("the learned libraries preloaded", lambda: {"markdown_it", "termcolor"} <= preloaded(sandbox))
    reasons = refused(sandbox)
    assert "not a module of an installed distribution" in reasons["learned_helper"]
    assert not any(m.startswith("unusual_prefix") for m in preloaded(sandbox))
    write_learned_dag(sandbox.dags_folder, 2)
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
