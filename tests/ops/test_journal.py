"""The launch journal and the reclaim of what a crashed executor left running, with real processes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from async_local_executor.core.proc_identity import start_ticks
from async_local_executor.ops import journal as registry
from async_local_executor.ops import journal_file
from async_local_executor.ops.journal import INSTANCE_ENV, SUFFIX, LaunchJournal, ReclaimResult, reclaim
from tests.core.clock_step import step_wall_clock
from tests.core.helpers import alive
from tests.processes import SLEEP, read_line

# A workload that escaped everything the parent-death chain covers: it runs in a session of its own
# (as a BashOperator's shell does). It starts one process that stays in its group but drops the mark,
# and one that leaves the group but keeps the mark.
WORKLOAD = f"""
import json, os, subprocess
sleep = {SLEEP!r}
clean = {{k: v for k, v in os.environ.items() if k != {INSTANCE_ENV!r}}}
member = subprocess.Popen(sleep, env=clean)
escaped = subprocess.Popen(sleep, start_new_session=True)
print(json.dumps({{"member": member.pid, "escaped": escaped.pid}}), flush=True)
member.wait()
"""

# An executor stand-in: opens a journal, launches the workload marked and records it, reports the pids.
OWNER = f"""
import json, os, subprocess, sys, time
from pathlib import Path
from async_local_executor.ops.journal import LaunchJournal
journal = LaunchJournal.open(Path(sys.argv[1]), owner="test owner")
workload = subprocess.Popen(
    [sys.executable, "-c", {WORKLOAD!r}],
    env=journal.child_env(os.environ), start_new_session=True, stdout=subprocess.PIPE, text=True,
)
journal.started(workload.pid, "dag.task try 1")
pids = json.loads(workload.stdout.readline())
print(json.dumps({{"workload": workload.pid, **pids}}), flush=True)
time.sleep(600)
"""


def test_what_a_killed_executor_left_running_is_killed_by_its_successor(
    tmp_path: Path, spawned: list[int]
) -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    spawned.append(owner.pid)
    pids = json.loads(read_line(owner))
    spawned.extend(pids.values())
    owner.kill()
    owner.wait()
    # Nothing ties these to the owner: without a successor's reclaim they would run on.
    assert all(alive(pid) for pid in pids.values())

    survivors = reclaim(tmp_path).killed

    assert {s.pid: s.label for s in survivors} == {
        pids["workload"]: "dag.task try 1",
        pids["member"]: "in the process group of dag.task try 1",
        pids["escaped"]: "",
    }
    assert {s.owner for s in survivors} == {"test owner"}
    assert not [pid for pid in pids.values() if alive(pid)]
    assert list(tmp_path.iterdir()) == []


def test_a_live_executors_journal_and_processes_are_left_alone(tmp_path: Path, spawned: list[int]) -> None:
    state = tmp_path / "state"
    journal = LaunchJournal.open(state, owner="alive")
    proc = subprocess.Popen(SLEEP, env=journal.child_env(os.environ))
    spawned.append(proc.pid)
    journal.started(proc.pid, "dag.task try 1")

    assert reclaim(state).killed == []

    assert alive(proc.pid)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert stat.S_IMODE(journal.path.stat().st_mode) == 0o600
    proc.kill()
    proc.wait()
    journal.ended(proc.pid)
    journal.close()
    assert list(state.iterdir()) == []


def test_a_recorded_pid_now_held_by_another_process_is_not_killed(tmp_path: Path, spawned: list[int]) -> None:
    stranger = subprocess.Popen(SLEEP)
    spawned.append(stranger.pid)
    started = start_ticks(stranger.pid)
    assert started is not None
    # A dead instance's journal (no one holds its lock) that recorded this pid for a process that
    # started long before: the pid was reused. Its last line was cut short by the crash.
    lines = [
        {"instance": "dead", "owner": "gone", "pid": 1, "opened": 0},
        {"+": stranger.pid, "start_ticks": started - 1000, "key": "old task"},
    ]
    text = "".join(json.dumps(line) + "\n" for line in lines) + '{"+": 12'
    (tmp_path / f"dead{SUFFIX}").write_text(text)

    assert reclaim(tmp_path).killed == []

    assert alive(stranger.pid)
    assert list(tmp_path.iterdir()) == []


# An executor stand-in whose launch only its journal line ties to it: no mark in its environment, and a
# session of its own.
UNMARKED_OWNER = f"""
import os, subprocess, sys, time
from pathlib import Path
from async_local_executor.ops.journal import LaunchJournal
journal = LaunchJournal.open(Path(sys.argv[1]), owner="test owner")
workload = subprocess.Popen({SLEEP!r}, start_new_session=True)
journal.started(workload.pid, "dag.task try 1")
print(workload.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("step", [1.0, -1.0])
def test_a_launch_is_still_recognised_after_the_wall_clock_steps(
    tmp_path: Path, spawned: list[int], monkeypatch: pytest.MonkeyPatch, step: float
) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", UNMARKED_OWNER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    spawned.append(owner.pid)
    workload = int(read_line(owner))
    spawned.append(workload)
    owner.kill()
    owner.wait()
    step_wall_clock(monkeypatch, step)  # between the crash and the successor's start, say

    survivors = reclaim(tmp_path).killed

    assert [(s.pid, s.label) for s in survivors] == [(workload, "dag.task try 1")]
    assert not alive(workload)
    assert list(tmp_path.iterdir()) == []


def test_the_journal_is_compacted_and_keeps_only_live_launches(
    tmp_path: Path, spawned: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry, "_COMPACT_SLACK", 8)
    procs = [subprocess.Popen(SLEEP) for _ in range(3)]
    spawned.extend(p.pid for p in procs)
    journal = LaunchJournal.open(tmp_path, owner="compacting")
    journal.started(procs[2].pid, "stays")
    for _ in range(50):
        for proc in procs[:2]:
            journal.started(proc.pid, "comes and goes")
            journal.ended(proc.pid)

    lines = journal.path.read_bytes().splitlines()
    assert len(lines) <= 1 + 1 + 8 + 1
    fd = os.open(journal.path, os.O_RDONLY)
    try:
        header, live = journal_file.read(fd)
    finally:
        os.close(fd)
    assert header.owner == "compacting"
    assert {pid: key for pid, (_, key) in live.items()} == {procs[2].pid: "stays"}
    journal.close()


def test_reclaim_of_a_missing_directory_finds_nothing(tmp_path: Path) -> None:
    assert reclaim(tmp_path / "never-created") == ReclaimResult()
    assert not (tmp_path / "never-created").exists()


# An executor whose process forks after opening its journal (Airflow 2's scheduler forks its DAG file
# processor): the fork outlives the owner, and must not keep the journal locked.
FORKING_OWNER = """
import os, sys, time
from pathlib import Path
from async_local_executor.ops.journal import LaunchJournal
journal = LaunchJournal.open(Path(sys.argv[1]), owner="forking owner")
if os.fork() == 0:
    # os.fork() returns here only after the at-fork hooks ran: the journal is closed in this process
    # once its pid is printed (the parent printing it would race the hook).
    print(os.getpid(), flush=True)
    time.sleep(600)
    os._exit(0)
time.sleep(600)
"""


def test_a_process_the_owner_forked_does_not_keep_its_journal_locked(
    tmp_path: Path, spawned: list[int]
) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", FORKING_OWNER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    spawned.append(owner.pid)
    forked = int(read_line(owner))
    spawned.append(forked)
    owner.kill()
    owner.wait()
    assert alive(forked)

    reclaim(tmp_path)

    # Taken for a dead executor's journal (not a live one's), reclaimed and removed.
    assert list(tmp_path.glob(f"*{SUFFIX}")) == []
