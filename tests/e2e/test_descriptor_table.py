"""A scheduler with a low ``RLIMIT_NOFILE``, on a real Airflow 3 (PostgreSQL): a full descriptor table
holds launches back instead of failing them, and the soft limit is raised to what parallelism needs
while each task gets the original one back.

Measured (``python -m benchmarks.descriptors``): an idle scheduler running this executor holds about 19
descriptors with the fork server (14 with the subprocess launcher), and each running workload 2 more (its
output pipe and its pidfd). With soft and hard limit at :data:`LIMIT`, about 14 of the :data:`TASKS`
tasks held at the gate fit. Without back-pressure each of the others would fail at once ("not launched:
cannot create the workload's control socket: Too many open files"); they wait, the health and the status
file say so, and they run once running ones end.
"""

from __future__ import annotations

import json
import re
import resource
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from async_local_executor.ops.status_read import read_all
from harness.sandbox import AirflowSandbox
from tests.e2e.helpers import poll

pytestmark = [pytest.mark.e2e, pytest.mark.sandbox(database="postgres")]

DAG_ID = "descriptor_table"
TASKS = 24
LIMIT = 48  # soft and hard: room for about 14 running workloads (module docstring)
LOW_SOFT = 256
# The hard limit of the second test: this process's, which anyone may give a child (raising it needs
# privilege).
HARD = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
# The second test's parallelism: it needs more than LOW_SOFT (3 per workload + 256 over what is open).
ROOMY = 16
HELD_BACK = "launches held back: descriptor table full ("
LAUNCHING_AGAIN = re.compile(r"launching again: the descriptor table has room \(\d+ open, limit (\d+)\)")


@pytest.fixture
def sandbox_dags() -> Path:
    return Path(__file__).with_name("dags_descriptors")


def status(sandbox: AirflowSandbox) -> dict[str, Any]:
    """The running executor's status file (empty until it has one)."""
    for found in read_all(sandbox.home / "async_local_executor"):
        if not found.stale:
            return found.data
    return {}


def public_health(sandbox: AirflowSandbox) -> dict[str, Any]:
    """The executor's health on the api-server (``/async-local-executor/health``, public)."""
    # Always the sandbox's own http://127.0.0.1 api-server.
    with urllib.request.urlopen(f"{sandbox.api_url}/async-local-executor/health", timeout=30) as response:  # noqa: S310
        body = json.loads(response.read())
    assert isinstance(body, dict)
    return body


def held(sandbox: AirflowSandbox) -> bool:
    return bool(status(sandbox).get("descriptors", {}).get("holding"))


def scheduler_log(sandbox: AirflowSandbox) -> str:
    return sandbox.process_logs["scheduler"].read_text(errors="replace")


def started(folder: Path) -> dict[int, dict[str, Any]]:
    """What each task that started wrote: its pid and its ``RLIMIT_NOFILE`` (soft, hard)."""
    return {
        int(mark.name.removeprefix("started.")): json.loads(mark.read_text())
        for mark in folder.glob("started.*")
        if mark.suffix != ".tmp"
    }


@pytest.mark.sandbox(
    parallelism=TASKS,
    nofile={"scheduler": (LIMIT, LIMIT)},
    config={"ALE_DESCRIPTORS_TASKS": str(TASKS)},
)
def test_a_full_descriptor_table_holds_launches_back_until_running_tasks_end(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    sandbox.wait_for_dag(DAG_ID, timeout=120)
    run_id = sandbox.trigger(DAG_ID)

    def failed() -> list[tuple[int, str | None]]:
        rows = sandbox.task_instances(DAG_ID, run_id)
        return [(r.map_index, r.state) for r in rows if r.state in ("failed", "upstream_failed")]

    # The table fills while every task holds at the gate: the rest wait, none fails.
    poll("launches held back, or a task failed", lambda: held(sandbox) or bool(failed()), guard=120)
    not_launched = [line for line in scheduler_log(sandbox).splitlines() if "not launched" in line]
    assert not failed(), (failed(), not_launched[:3])
    now = status(sandbox)
    assert now["descriptors"]["limit"] == LIMIT, now["descriptors"]
    reasons = [r for r in now["health"]["reasons"] if r.startswith(HELD_BACK)]
    assert reasons, now["health"]
    assert re.fullmatch(rf"{re.escape(HELD_BACK)}\d+ open, limit {LIMIT}\)", reasons[0]), reasons
    # The api-server's health endpoint says so too (the reason's code, its words withheld).
    [instance] = public_health(sandbox)["instances"]
    assert "descriptors_full" in instance["reason_codes"], instance
    assert len(started(tmp_path)) < TASKS  # the held-back ones have not run

    (tmp_path / "gate").touch()
    assert sandbox.wait_for_run(DAG_ID, run_id, timeout=180) == "success"
    rows = sandbox.task_instances(DAG_ID, run_id)
    assert sorted((r.map_index, r.state, r.try_number) for r in rows) == [
        (i, "success", 1) for i in range(TASKS)
    ]
    assert sorted(started(tmp_path)) == list(range(TASKS))

    log = scheduler_log(sandbox)
    held_back = re.search(
        rf"{re.escape(HELD_BACK)}\d+ open, limit {LIMIT}\); workload {DAG_ID}\.hold\[\d+\] try 1 and the ones "
        r"after it wait for a running workload to end \([^)]*Too many open files\)",
        log,
    )
    assert held_back, log
    again = LAUNCHING_AGAIN.search(log, held_back.end())
    assert again, log
    assert int(again.group(1)) == LIMIT
    assert "not launched" not in log
    # The start line says the hard limit is too low, by how much, and what to do; so does a warning.
    start = re.search(
        rf"AsyncLocalExecutor started: parallelism={TASKS},.*, descriptors: (\d+) needed, the hard limit "
        rf"allows {LIMIT} \(soft limit {LIMIT}\); launches wait while the table is full: raise the hard "
        r"limit \(LimitNOFILE= in the systemd unit, ulimit -Hn\) to at least (\d+)",
        log,
    )
    assert start, log
    needed = int(start.group(1))
    assert int(start.group(2)) == needed
    assert needed >= 256 + 3 * TASKS
    assert re.search(rf"\[warning\s*\] descriptors: {needed} needed, the hard limit allows {LIMIT} ", log)
    # Once they all ran: nothing held any more, and the status file counts the launches that waited.
    poll(
        "the status after the hold",
        lambda: (
            status(sandbox).get("descriptors", {}).get("holding") is False
            and status(sandbox).get("totals", {}).get("descriptor_waits", 0) > 0
        ),
        guard=60,
    )
    assert not [r for r in status(sandbox)["health"]["reasons"] if r.startswith(HELD_BACK)]


@pytest.mark.sandbox(
    parallelism=ROOMY,
    nofile={"scheduler": (LOW_SOFT, HARD)},
    config={"ALE_DESCRIPTORS_TASKS": "4"},
)
def test_the_soft_limit_is_raised_for_parallelism_and_tasks_get_the_original_back(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    sandbox.wait_for_dag(DAG_ID, timeout=120)
    (tmp_path / "gate").touch()  # nothing to hold: the tasks only say their limit
    run_id = sandbox.trigger(DAG_ID)
    assert sandbox.wait_for_run(DAG_ID, run_id, timeout=180) == "success"
    rows = sandbox.task_instances(DAG_ID, run_id)
    assert sorted((r.map_index, r.state, r.try_number) for r in rows) == [(i, "success", 1) for i in range(4)]

    log = scheduler_log(sandbox)
    start = re.search(
        rf"AsyncLocalExecutor started: parallelism={ROOMY},.*, descriptors: soft limit raised from "
        rf"{LOW_SOFT} to (\d+) \((\d+) needed; workloads get {LOW_SOFT} back\)",
        log,
    )
    assert start, log
    raised, needed = int(start.group(1)), int(start.group(2))
    assert raised == needed >= 256 + 3 * ROOMY > LOW_SOFT
    assert _soft_limit(sandbox.pids["scheduler"]) == raised
    # Each task runs with the soft limit the scheduler started with, and the hard limit it has.
    marks = started(tmp_path)
    assert sorted(marks) == [0, 1, 2, 3]
    assert {tuple(mark["nofile"]) for mark in marks.values()} == {(LOW_SOFT, HARD)}
    assert HELD_BACK not in log
    assert not re.search(r"\[warning\s*\] descriptors:", log)
    poll("a status file", lambda: "totals" in status(sandbox), guard=60)
    assert status(sandbox)["totals"].get("descriptor_waits") == 0


def _soft_limit(pid: int) -> int:
    """The soft ``RLIMIT_NOFILE`` of process ``pid``, as ``/proc/<pid>/limits`` says it."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError(f"no open files limit for {pid}")
