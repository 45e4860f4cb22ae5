from __future__ import annotations

import os

from tests.airflow_home import use_throwaway_home

# Before any test module imports Airflow, which reads AIRFLOW_HOME then (and its SQLite file there).
use_throwaway_home("ale-airflow2-")
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")


import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.airflow2 import Airflow2Sandbox
from tests.executor_cgroups import cgroup_root  # noqa: F401 - a fixture, after AIRFLOW_HOME is set

DAGS = Path(__file__).with_name("dags")
EXECUTOR = "async_local_executor.executor.AsyncLocalExecutor"


@pytest.fixture
def gated_sandbox(tmp_path: Path) -> Iterator[Airflow2Sandbox]:
    """A 2.11 deployment of this executor (parallelism 4, PostgreSQL) over tests/airflow2/dags, whose
    gated DAGs record their executions in the test's ``tmp_path`` (``ALE_HANDOVER_DIR``)."""
    sb = Airflow2Sandbox(
        executor=EXECUTOR, dags_folder=DAGS, parallelism=4, extra_config={"ALE_HANDOVER_DIR": str(tmp_path)}
    )
    sb.start()
    try:
        yield sb
    finally:
        # What a failure is read from outlives the sandbox's home: the scheduler's log, the tasks' logs.
        for name, path in sb.process_logs.items():
            if path.exists():
                shutil.copyfile(path, tmp_path / f"{name}.log")
        if (sb.home / "logs").is_dir():
            shutil.copytree(sb.home / "logs", tmp_path / "home" / "logs", dirs_exist_ok=True)
        sb.stop()
