"""Workloads handed over across a scheduler restart, as the next reclaim finds them (``reclaim.py``): held
instead of killed (with what belongs to them) while their handover holds, killed like any survivor once
it does not, and held by one reclaimer only.

Real processes throughout: the dead executors are child processes that wrote their journal and exited
(or were killed, tests/ops/handed_over.py), the workloads are real process trees.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from async_local_executor.core.proc_identity import start_ticks
from async_local_executor.ops.journal import SUFFIX, Held, reclaim
from tests.core.helpers import alive
from tests.ops.handed_over import TIMEOUT, dead_owner
from tests.processes import SLEEP, exits


@pytest.mark.parametrize("how", ["handover", "crash"])
def test_a_handed_over_workload_is_held_with_what_belongs_to_it_and_the_rest_is_killed(
    tmp_path: Path, spawned: list[int], how: str
) -> None:
    pids = dead_owner(tmp_path, how, spawned)
    held_pid, other = int(pids["held"]), int(pids["other"])
    belonging = [held_pid, *(int(pids[name]) for name in ("member", "escaped", "orphan", "straggler"))]
    assert all(alive(pid) for pid in [*belonging, other])
    # Marked or in its group, each of them: without the handover, the reclaim would kill all of it.
    assert os.getpgid(int(pids["escaped"])) != held_pid != os.getpgid(int(pids["orphan"]))
    assert os.getpgid(int(pids["straggler"])) == held_pid
    assert psutil.Process(int(pids["straggler"])).ppid() != held_pid
    before = time.clock_gettime(time.CLOCK_BOOTTIME)

    result = reclaim(tmp_path)

    assert [(s.pid, s.label) for s in result.killed] == [(other, "dag.other try 1")]
    assert exits(other)
    assert all(alive(pid) for pid in belonging)
    [held] = result.held
    start = start_ticks(held_pid)
    assert start is not None
    assert (held.pid, held.start, held.key) == (held_pid, start, "dag.held try 1")
    assert (held.instance, held.owner, held.timeout, held.cgroup) == (
        pids["instance"],
        "test owner",
        TIMEOUT,
        None,
    )
    if how == "handover":
        assert held.info == {"ti": "dag.held", "ti_id": "abc"}
        assert not held.crashed
        assert held.boot <= before
    else:
        # After a crash: the launch line's info, and its time counted from now.
        assert held.info == {"ti": "dag.held"}
        assert held.crashed
        assert held.boot >= before
    assert held.descendants == ((int(pids["orphan"]), start_ticks(int(pids["orphan"]))),)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A workload process, leading its own group (unmarked: only a journal line names it)."""
    proc = subprocess.Popen(SLEEP, start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def write_journal(directory: Path, lines: list[dict[str, object]], instance: str = "dead") -> Path:
    """A dead instance's journal (no one holds its lock)."""
    path = directory / f"{instance}{SUFFIX}"
    header: dict[str, object] = {"instance": instance, "owner": "gone", "pid": 1, "opened": 0}
    path.write_text("".join(json.dumps(line) + "\n" for line in [header, *lines]))
    return path


def handover_line(pid: int, start: int, *, ago: float, timeout: float = TIMEOUT) -> dict[str, object]:
    boot = time.clock_gettime(time.CLOCK_BOOTTIME) - ago
    return {
        "handover": pid,
        "start_ticks": start,
        "info": {},
        "cgroup": None,
        "at": time.time() - ago,
        "boot": boot,
        "timeout": timeout,
    }


@pytest.mark.parametrize(("ago", "timeout"), [(TIMEOUT + 1, TIMEOUT), (0.0, 0.0)])
def test_a_handover_past_its_timeout_is_killed_like_any_survivor(
    tmp_path: Path,
    sleeper: subprocess.Popen[bytes],
    caplog: pytest.LogCaptureFixture,
    ago: float,
    timeout: float,
) -> None:
    start = start_ticks(sleeper.pid)
    assert start is not None
    launch = {"+": sleeper.pid, "start_ticks": start, "key": "late", "handover_timeout": TIMEOUT}
    write_journal(tmp_path, [launch, handover_line(sleeper.pid, start, ago=ago, timeout=timeout)])
    caplog.set_level(logging.WARNING, "async_local_executor.ops.journal")

    result = reclaim(tmp_path)

    assert result.held == []
    assert [(s.pid, s.label) for s in result.killed] == [(sleeper.pid, "late")]
    assert sleeper.wait(60) == -signal.SIGKILL
    assert any(
        "handover_timeout" in (m := r.getMessage()) and m.endswith("it is not held") for r in caplog.records
    )


def test_a_handover_whose_pid_runs_another_process_now_is_neither_held_nor_killed(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    start = start_ticks(sleeper.pid)
    assert start is not None
    wrong = start + 1  # the workload that was handed over under this pid, long gone
    launch = {"+": sleeper.pid, "start_ticks": wrong, "key": "gone", "handover_timeout": TIMEOUT}
    write_journal(tmp_path, [launch, handover_line(sleeper.pid, wrong, ago=1.0)])

    result = reclaim(tmp_path)

    assert (result.held, result.killed) == ([], [])
    assert alive(sleeper.pid)
    assert list(tmp_path.iterdir()) == []


def test_a_handover_line_for_another_start_than_the_launchs_is_no_handover(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    start = start_ticks(sleeper.pid)
    assert start is not None
    launch = {"+": sleeper.pid, "start_ticks": start, "key": "recorded"}
    write_journal(tmp_path, [launch, handover_line(sleeper.pid, start + 1, ago=1.0)])

    result = reclaim(tmp_path)

    assert result.held == []
    assert [s.pid for s in result.killed] == [sleeper.pid]


# Reclaims the directory it is given from another process, and says what it held and killed.
RECLAIMER = """
import json, sys
from pathlib import Path
from async_local_executor.ops.reclaim import reclaim
result = reclaim(Path(sys.argv[1]))
print(json.dumps({"held": [h.pid for h in result.held], "killed": [s.pid for s in result.killed]}), flush=True)
"""


def test_of_two_reclaimers_at_once_exactly_one_holds_a_workload(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    start = start_ticks(sleeper.pid)
    assert start is not None
    launch = {"+": sleeper.pid, "start_ticks": start, "key": "handed over", "handover_timeout": TIMEOUT}
    path = write_journal(tmp_path, [launch, handover_line(sleeper.pid, start, ago=1.0)])
    others: list[dict[str, list[int]]] = []

    def hold(held: list[Held]) -> None:
        # Another scheduler starting on this host, its reclaim in the window before the dead journal goes.
        assert path.exists()
        other = subprocess.run(
            [sys.executable, "-c", RECLAIMER, str(tmp_path)],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        others.append(json.loads(other.stdout))

    result = reclaim(tmp_path, hold=hold)

    assert others == [{"held": [], "killed": []}]
    assert [each.pid for each in result.held] == [sleeper.pid]
    assert reclaim(tmp_path).held == []  # and none after
    assert alive(sleeper.pid)


def test_handover_fields_not_in_the_format_leave_the_launch_recorded_for_killing(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    start = start_ticks(sleeper.pid)
    assert start is not None
    launch = {"+": sleeper.pid, "start_ticks": start, "key": "odd", "handover_timeout": "300"}
    bad = [
        {**handover_line(sleeper.pid, start, ago=1.0), "boot": "yesterday"},
        {**handover_line(sleeper.pid, start, ago=1.0), "info": []},
        {**handover_line(sleeper.pid, start, ago=1.0), "timeout": float("nan")},
        {**handover_line(sleeper.pid, start, ago=1.0), "cgroup": 3},
        handover_line(sleeper.pid + 1, start, ago=1.0),  # of no launch: nothing to hold, not foreign
    ]
    path = write_journal(tmp_path, [launch, *bad])
    caplog.set_level(logging.WARNING, "async_local_executor.ops.journal")

    result = reclaim(tmp_path)

    assert result.held == []
    assert [s.pid for s in result.killed] == [sleeper.pid]
    assert f"skipped 5 line(s) of the launch journal {path}" in caplog.records[0].getMessage()
