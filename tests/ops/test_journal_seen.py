"""Descendants the status walk saw, journalled, and reclaimed after a crash by pid and start time."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from async_local_executor.core.proc_identity import start_ticks
from async_local_executor.ops import journal as registry
from async_local_executor.ops import journal_file
from async_local_executor.ops.journal import INSTANCE_ENV, SUFFIX, LaunchJournal, reclaim
from tests.core.helpers import alive
from tests.processes import SLEEP, read_line

# A workload that starts a process which escapes everything but the journal: no mark in its environment
# (env -i), a session and group of its own (setsid). It prints that process's pid once the process runs
# sleep: before that it is still env (or setsid), whose environment still holds the mark. The kernel
# says nothing when a process execs, so its name is read until it changes.
WORKLOAD = """
import subprocess, time
escaped = subprocess.Popen(["env", "-i", "setsid", "sleep", "600"])
deadline = time.monotonic() + 60
while open(f"/proc/{escaped.pid}/comm").read().strip() != "sleep" and time.monotonic() < deadline:
    time.sleep(0.01)
print(escaped.pid, flush=True)
time.sleep(600)
"""

# An executor stand-in: launches the workload, writes its status file once (whose walk journals what it
# sees), then loses the workload (its lifeline killed it, say) before it is itself killed.
OWNER = f"""
import json, os, subprocess, sys, time
from pathlib import Path
from async_local_executor.core.admission import MB
from async_local_executor.core.health import Health, Report, Verdict
from async_local_executor.core.state import RunningWorkload, SupervisorState
from async_local_executor.ops.journal import LaunchJournal
from async_local_executor.ops.status import Meta, StatusWriter
journal = LaunchJournal.open(Path(sys.argv[1]), owner="test owner")
workload = subprocess.Popen(
    [sys.executable, "-c", {WORKLOAD!r}],
    env=journal.child_env(os.environ), start_new_session=True, stdout=subprocess.PIPE, text=True,
)
journal.started(workload.pid, "dag.task try 1")
escaped = int(workload.stdout.readline())
state = SupervisorState(
    running=(RunningWorkload("dag.task try 1", workload.pid, time.time(), "default"),),
    waiting=0, oldest_waiting_since=None, memory_low=False, memory_floor=256 * MB,
    available_memory=None, launcher_problem=None, recent_failures=(), launched_total=1,
    last_launched_at=None, memory_waits_total=0, outcomes_total={{}},
)
meta = Meta(journal.instance, "host", None, "AsyncLocalExecutor", 1, "subprocess", None)
writer = StatusWriter(Path(sys.argv[2]) / "status.json", meta, on_seen=journal.seen)
writer.write(Report(time.monotonic(), 0.0, 0.0, Health(Verdict.HEALTHY), state))
workload.kill()
workload.wait()
print(json.dumps({{"workload": workload.pid, "escaped": escaped}}), flush=True)
time.sleep(600)
"""


def test_a_descendant_that_dropped_the_mark_and_left_the_session_is_killed_by_the_successor(
    tmp_path: Path,
    spawned: list[int],
) -> None:
    state, elsewhere = tmp_path / "state", tmp_path / "status"
    state.mkdir()
    elsewhere.mkdir()
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(state), str(elsewhere)], stdout=subprocess.PIPE, text=True
    )
    spawned.append(owner.pid)
    pids = json.loads(read_line(owner))
    spawned.extend(pids.values())
    owner.kill()
    owner.wait()
    escaped = psutil.Process(pids["escaped"])
    # Nothing but the journal ties it to the dead executor: no mark, not in the workload's group or
    # session, and no longer in its tree (the workload is gone).
    assert INSTANCE_ENV not in escaped.environ()
    assert os.getsid(escaped.pid) == os.getpgid(escaped.pid) == escaped.pid
    assert not alive(pids["workload"])

    survivors = reclaim(state).killed

    assert {s.pid: s.label for s in survivors} == {escaped.pid: "started by dag.task try 1"}
    assert not alive(escaped.pid)
    assert list(state.iterdir()) == []


def test_a_seen_pid_is_killed_only_while_it_runs_as_the_process_that_was_seen(
    tmp_path: Path,
    spawned: list[int],
) -> None:
    matching, stranger, of_an_ended_launch = (subprocess.Popen(SLEEP) for _ in range(3))
    spawned += [matching.pid, stranger.pid, of_an_ended_launch.pid]
    gone = subprocess.Popen(SLEEP)
    gone.kill()
    gone.wait()  # the launches' own processes: no longer running

    def start(proc: subprocess.Popen[bytes]) -> int:
        ticks = start_ticks(proc.pid)
        assert ticks is not None
        return ticks

    lines = [
        {"instance": "dead", "owner": "gone", "pid": 1, "opened": 0},
        {"+": gone.pid, "start_ticks": 1, "key": "running try"},
        {"seen": matching.pid, "start_ticks": start(matching), "of": gone.pid},
        # Its pid was reused: the process seen under it started long before this one.
        {"seen": stranger.pid, "start_ticks": start(stranger) - 1000, "of": gone.pid},
        {"+": 2, "start_ticks": 1, "key": "ended try"},
        {"seen": of_an_ended_launch.pid, "start_ticks": start(of_an_ended_launch), "of": 2},
        {"-": 2},
    ]
    (tmp_path / f"dead{SUFFIX}").write_text("".join(json.dumps(line) + "\n" for line in lines))

    survivors = reclaim(tmp_path).killed

    assert [s.pid for s in survivors] == [matching.pid]
    assert matching.wait() == -9
    assert alive(stranger.pid)
    assert alive(of_an_ended_launch.pid)


def read_back(journal: LaunchJournal) -> tuple[journal_file.Records, journal_file.Seen]:
    fd = os.open(journal.path, os.O_RDONLY)
    try:
        _, live, seen, _ = journal_file.read_all(fd, journal.path)
    finally:
        os.close(fd)
    return live, seen


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[LaunchJournal]:
    opened = LaunchJournal.open(tmp_path, owner="seeing")
    try:
        yield opened
    finally:
        opened.close()


def test_only_new_descendants_of_running_launches_are_recorded_and_an_exit_drops_them(
    journal: LaunchJournal,
) -> None:
    me = os.getpid()
    journal.started(me, "dag.task try 1")
    journal.seen({me: [(11, 15), (12, 25)], 999_999: [(13, 35)]})  # 999999 was never launched
    journal.seen({me: [(11, 15), (11, 75)]})  # 11 again, and a later process under pid 11
    lines = journal.path.read_bytes().splitlines()

    assert len(lines) == 1 + 1 + 3
    assert read_back(journal)[1] == {me: {11: 75, 12: 25}}
    journal.ended(me)
    assert read_back(journal) == ({}, {})
    journal.seen({me: [(14, 45)]})  # a walk that saw it before it ended
    assert read_back(journal) == ({}, {})


def test_a_launchs_descendants_are_bounded_and_those_gone_make_room(
    journal: LaunchJournal,
    monkeypatch: pytest.MonkeyPatch,
    spawned: list[int],
) -> None:
    monkeypatch.setattr(registry, "_SEEN_PER_LAUNCH", 2)
    me = os.getpid()
    journal.started(me, "dag.task try 1")
    running = subprocess.Popen(SLEEP)
    spawned.append(running.pid)
    start = start_ticks(running.pid)
    assert start is not None
    not_init = (start_ticks(1) or 0) + 1
    journal.seen({me: [(running.pid, start), (1, not_init)]})  # pid 1 did not start then: gone
    journal.seen({me: [(21, 15), (22, 25)]})

    # The gone one's line stays until a compaction; it made room for one more, not two.
    assert read_back(journal)[1] == {me: {running.pid: start, 1: not_init, 21: 15}}


def test_descendants_survive_compaction_and_lines_from_two_threads_never_interleave(
    journal: LaunchJournal,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(registry, "_COMPACT_SLACK", 16)
    me = os.getpid()
    journal.started(me, "stays")
    done = threading.Event()

    def status_writer() -> None:
        for i in range(2000):
            journal.seen({me: [(100 + i % 200, i % 200)]})
        done.set()

    thread = threading.Thread(target=status_writer)
    thread.start()
    try:
        while not done.is_set():
            journal.started(os.getppid(), "comes and goes")
            journal.ended(os.getppid())
    finally:
        thread.join()

    with caplog.at_level(logging.WARNING):
        live, seen = read_back(journal)
    assert not caplog.records  # every line whole and in this format
    assert {pid: key for pid, (_, key) in live.items()} == {me: "stays"}
    assert seen == {me: {100 + i: i for i in range(200)}}
    assert len(journal.path.read_bytes().splitlines()) <= 1 + 2 + 200 + 16 + 1
