"""Which DAG file a workload's process will parse, as the fork server learns its imports from it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from async_local_executor.adapter import dag_files


def test_the_dag_file_of_a_task_comes_from_its_local_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundles = [
        {
            "name": "dags-folder",
            "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
            "kwargs": {},
        },
        {
            "name": "team",
            "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
            "kwargs": {"path": str(tmp_path)},
        },
        {"name": "git", "classpath": "airflow.providers.git.bundles.git.GitDagBundle", "kwargs": {}},
    ]
    monkeypatch.setenv("AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST", json.dumps(bundles))
    from airflow import settings

    def workload(bundle: str) -> object:
        return SimpleNamespace(dag_rel_path=Path("sub/my_dag.py"), bundle_info=SimpleNamespace(name=bundle))

    assert dag_files.airflow3(workload("dags-folder")) == f"{settings.DAGS_FOLDER}/sub/my_dag.py"
    assert dag_files.airflow3(workload("team")) == f"{tmp_path}/sub/my_dag.py"
    assert dag_files.airflow3(workload("git")) is None  # learned from the task's own process instead
    assert dag_files.airflow3(SimpleNamespace()) is None  # a callback or a connection test


def test_the_dag_file_of_an_airflow2_command_is_its_subdir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__CORE__DAGS_FOLDER", "/opt/dags")
    command = ["airflow", "tasks", "run", "d", "t", "r", "--local", "--subdir", "DAGS_FOLDER/x/my_dag.py"]
    assert dag_files.airflow2(command) == "/opt/dags/x/my_dag.py"
    assert dag_files.airflow2(["airflow", "tasks", "run", "d", "t", "r", "-S", "/abs/d.py"]) == "/abs/d.py"
    assert dag_files.airflow2(["airflow", "tasks", "run", "d", "t", "r"]) is None
