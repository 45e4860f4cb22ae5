"""Without cgroups, what the status walk saw under a task is still killed by the next scheduler.

With ``containment = off`` (as on a host without usable cgroups), the escapers DAG's sleepers, in a
session of their own and without the environment marker, escape every group- and marker-based search.
The status file's walk of each workload's process tree, every 2 s, journals the descendants it sees (pid
and start time); after a ``kill -9`` of the scheduler, the restarted one kills them from those records
before it launches anything.

Nothing is mocked: a real Airflow on SQLite, the default fork-server launcher, real task processes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.sandbox import AirflowSandbox
from tests.e2e.helpers import QUICK_ORPHANS, kill_and_restart, poll, run_to_the_sleepers

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.sandbox(
        config={
            "ALE_ESCAPERS_HOLD": "1",
            "AIRFLOW__ASYNC_LOCAL_EXECUTOR__CONTAINMENT": "off",
            # Tasks die with a killed scheduler (the default's crash hands them over instead: see
            # tests/e2e/test_handover.py), leaving only what escaped, for the reclaim this checks.
            "AIRFLOW__ASYNC_LOCAL_EXECUTOR__HANDOVER_TIMEOUT": "0",
            **QUICK_ORPHANS,
        }
    ),
]


def _journalled(sandbox: AirflowSandbox) -> set[int]:
    seen: set[int] = set()
    for path in (sandbox.home / "async_local_executor").glob("*.launches"):
        for line in path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line being written
            if isinstance(record, dict) and "seen" in record:
                seen.add(int(record["seen"]))
    return seen


def test_a_restarted_scheduler_kills_the_descendants_the_status_walk_saw(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    run_id, escaped = run_to_the_sleepers(sandbox, tmp_path)
    poll("the status walk to journal both", lambda: set(escaped.values()) <= _journalled(sandbox))
    assert "containment: none (containment = off)" in sandbox.process_logs["scheduler"].read_text()

    log = kill_and_restart(sandbox, tmp_path, run_id, escaped)
    for pid in escaped.values():
        assert f"killed pid {pid} (started by " in log
