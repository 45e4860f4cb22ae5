"""The prefetch through a real scheduler: tasks wait inside the executor while every slot is taken.

Airflow's scheduler queues no more than [core] parallelism minus what executors hold; the executor's
prefetched workloads do not count there, so with parallelism 2 and prefetch_multiplier 1 two tasks run
and two more are queued, waiting for a slot inside the executor rather than in the scheduler.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.sandbox import AirflowSandbox
from tests.e2e.helpers import poll

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.sandbox(parallelism=2, config={"AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "16"}),
]


def test_prefetched_tasks_are_queued_behind_full_slots_and_never_run_beyond_them(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    sandbox.wait_for_dag("switch", timeout=120)
    run_id = sandbox.trigger("switch")

    def states() -> list[str]:
        return sorted(str(r.state) for r in sandbox.task_instances("switch", run_id))

    def started() -> int:
        return len(list(tmp_path.glob("started.*")))

    # Running in the database once the task process has reported; started once its body runs.
    poll(
        "two tasks running and two prefetched",
        lambda: states() == ["queued", "queued", "running", "running"] and started() == 2,
    )
    # Both slots are taken until the gate opens: the prefetched two stay queued, unstarted.
    assert states() == ["queued", "queued", "running", "running"]
    assert started() == 2
    (tmp_path / "gate").touch()
    assert sandbox.wait_for_run("switch", run_id, timeout=180) == "success"
    # Every file of the shared e2e DAG folder imports on a deployment of ours alone.
    assert sandbox.import_errors() == []
    rows = sandbox.task_instances("switch", run_id)
    edges = sorted([(r.start_date, 1) for r in rows] + [(r.end_date, -1) for r in rows])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    assert peak <= 2
