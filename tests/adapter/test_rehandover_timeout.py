"""A workload handed over twice keeps the countdown its launch gave it, whatever its adopter's own setting.

Its watchdog (core/custody.py) counts down the ``--handover-timeout`` on its command line, set once at its
launch. An adopter configured with another ``handover_timeout`` that is stopped in turn must journal that
countdown, not its own: the next executor's reclaim holds a handover only while its timeout has not passed,
and the workload is gone (or still waiting) by the one on its command line.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from async_local_executor.core.files import open_regular
from async_local_executor.ops import journal_file
from tests.adapter import workloads
from tests.adapter.driver import Scheduler

# The fixtures and steps of the handover tests, shared rather than copied.
from tests.adapter.test_handover import (  # noqa: F401 - start and state are fixtures
    StartCustody,
    _held_task,
    _queue,
    _stub_pid,
    start,
    state,
)

OPTION = "AIRFLOW__ASYNC_LOCAL_EXECUTOR__HANDOVER_TIMEOUT"


def _journalled_timeouts(state_dir: Path, pid: int) -> list[float]:
    """The timeout of each handover of ``pid`` the launch journals left in ``state_dir`` say."""
    found = []
    for path in sorted(state_dir.glob(f"*{journal_file.SUFFIX}")):
        fd = open_regular(path)
        try:
            handovers = journal_file.read_all(fd, path)[3]
        finally:
            os.close(fd)
        if pid in handovers:
            found.append(handovers[pid].timeout)
    return found


def test_a_workload_handed_over_again_is_journalled_with_the_countdown_its_launch_gave_it(
    start: StartCustody,  # noqa: F811 - the fixture imported above
    state: Path,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(OPTION, "300")
    task, gate = _held_task(tmp_path, "twice")
    first = start()
    _queue(first, task)
    Scheduler(first).run_until(lambda: any(tmp_path.glob("twice.*.started")))
    stub = _stub_pid(gate)
    first.end()
    assert _journalled_timeouts(state, stub) == [300.0]

    monkeypatch.setenv(OPTION, "60")  # the next scheduler's own setting differs
    second = start()
    assert second.try_adopt_task_instances([workloads.Revoked(task.key)]) == []  # type: ignore[list-item]
    second.until_reported(lambda: stub in second.adopted)
    second.end()
    # Its watchdog waits 300 s for a successor: journalled with 60, a successor started 61 s later
    # would refuse to hold a workload that waits for it, and its task instance would be reset.
    assert _journalled_timeouts(state, stub) == [300.0]
