"""Nothing a task starts escapes: each workload runs in a cgroup of its own, on a real Airflow.

The escapers DAG's tasks leave a ``sleep 600`` behind in a session of their own, one with an empty
environment and one from a BashOperator with ``env={...}``: no process group, session or environment
marker ties them to their task. With containment they are killed when their task ends, and after a
``kill -9`` of the scheduler, by the restarted scheduler before it launches anything.

Runs where this host lets the sandbox make cgroups (root, a writable cgroup2 mount; the sandbox gives the
executor a cgroup root of its own and removes it, see harness/cgroups.py); skipped elsewhere, saying why.
Nothing is mocked: a real Airflow on SQLite, the default fork-server launcher, real task processes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import cgroups
from harness.sandbox import AirflowSandbox
from tests.core.helpers import alive
from tests.e2e.helpers import QUICK_ORPHANS, escaped_sleepers, kill_and_restart, poll, run_to_the_sleepers

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not cgroups.usable(), reason="this host does not let the sandbox make cgroups"),
    # handover_timeout = 0: a crash leaves only what escaped the parent-death chain, for the reclaim.
    pytest.mark.sandbox(config={**QUICK_ORPHANS, "AIRFLOW__ASYNC_LOCAL_EXECUTOR__HANDOVER_TIMEOUT": "0"}),
]


def test_what_a_task_leaves_behind_ends_with_it(sandbox: AirflowSandbox, tmp_path: Path) -> None:
    sandbox.wait_for_dag("escapers", timeout=120)
    run_id = sandbox.trigger("escapers")
    poll("the run to finish", lambda: sandbox.run_state("escapers", run_id) in ("success", "failed"))
    rows = sandbox.task_instances("escapers", run_id)
    assert sandbox.run_state("escapers", run_id) == "success", rows
    assert [row.try_number for row in rows] == [1, 1]
    sleepers = escaped_sleepers(tmp_path, 1)
    assert sorted(sleepers) == ["detach", "shell"]
    # The run succeeds when the tasks report success; their workloads end (and the executor kills what
    # they left) a moment later, when Airflow's supervisor in each has finished.
    killed = "process(es) the task left running were killed"
    poll("both workloads to end", lambda: _scheduler_log(sandbox).count(killed) == 2)
    assert {task: pid for task, pid in sleepers.items() if alive(pid)} == {}
    assert "containment: cgroup2 at " in _scheduler_log(sandbox)


def _scheduler_log(sandbox: AirflowSandbox) -> str:
    return sandbox.process_logs["scheduler"].read_text(errors="replace")


@pytest.mark.sandbox(config={"ALE_ESCAPERS_HOLD": "1"})
def test_a_restarted_scheduler_kills_what_tasks_left_before_it_launches(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    run_id, escaped = run_to_the_sleepers(sandbox, tmp_path)
    log = kill_and_restart(sandbox, tmp_path, run_id, escaped)
    assert "process(es) left in cgroup" in log
    assert "of a stopped executor" in log
