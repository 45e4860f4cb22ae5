"""What the Airflow 2 fork server prepares once so that each forked `airflow tasks run` does not."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PRELOAD_PROBE = """
import json, sys
from async_local_executor.adapter.workload import airflow2
from airflow.models.taskinstance import TaskInstance
airflow2.preload()
print(json.dumps({
    "unconfigured": sorted(m.class_.__name__ for m in TaskInstance.registry.mappers if not m.configured),
    "parser": "airflow.cli.cli_parser" in sys.modules,
    "imported": sorted(m for m in ("airflow.models.serialized_dag", "setproctitle") if m in sys.modules),
}))
"""

# Also on 2.10: its ORM models differ from 2.11's (tests/airflow2/README.md).
pytestmark = pytest.mark.airflow210


def test_preload_configures_every_mapper_a_forked_task_would_configure_again() -> None:
    # A fresh interpreter, as the fork server is: the stock scheduler has queried (so configured its
    # mappers) before it forks a task; without this each child paid for it on its first query.
    done = subprocess.run(
        [sys.executable, "-c", PRELOAD_PROBE],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "AIRFLOW__CORE__LOAD_EXAMPLES": "False"},
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {
        "unconfigured": [],
        "parser": True,
        "imported": ["airflow.models.serialized_dag", "setproctitle"],
    }
