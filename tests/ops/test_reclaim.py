"""ops.reclaim: what a dead executor instance's journal names beyond its workloads.

A dead journal is one no process holds locked: written here by hand, as a scheduler killed outright
leaves it. The companions are real processes.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest

from async_local_executor.core.proc_identity import start_ticks
from async_local_executor.ops.journal import SUFFIX, Companion, LaunchJournal
from async_local_executor.ops.journal_file import COMPANIONS_KEY
from async_local_executor.ops.reclaim import reclaim
from tests.processes import exits

# Starts a worker, says so, and sleeps.
MASTER = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(flush=True)
time.sleep(600)
"""


def _dead_journal(directory: Path, companions: object) -> Path:
    instance = uuid.uuid4().hex
    header = {
        "instance": instance,
        "owner": "scheduler pid 1",
        "pid": 1,
        "opened": 0,
        COMPANIONS_KEY: companions,
    }
    path = directory / f"{instance}{SUFFIX}"
    path.write_text(json.dumps(header) + "\n")
    path.chmod(0o600)
    return path


def _sleeper(spawned: list[int]) -> tuple[subprocess.Popen[bytes], int]:
    """A process to be a companion, and its start."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    spawned.append(proc.pid)
    start = start_ticks(proc.pid)
    assert start is not None
    return proc, start


def _live_journal(directory: Path, pid: int, start: int) -> LaunchJournal:
    """A journal held (locked) by this process, naming ``pid`` as its companion."""
    return LaunchJournal.open(directory, owner="scheduler pid 2", companions=[Companion(pid, start, "x")])


def test_a_dead_journal_s_companion_still_running_is_killed_and_said(
    tmp_path: Path, spawned: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    helper, start = _sleeper(spawned)
    path = _dead_journal(tmp_path, [Companion(helper.pid, start, "airflow serve-logs").encode()])

    with caplog.at_level(logging.WARNING, logger="async_local_executor"):
        reclaim(tmp_path)

    assert helper.wait(10) == -9
    assert not path.exists()
    assert any(
        f"stopped airflow serve-logs (pid {helper.pid}), which scheduler pid 1 had started" in r.getMessage()
        for r in caplog.records
    ), caplog.text


def test_a_companion_s_pid_taken_by_another_process_is_left_alone(tmp_path: Path, spawned: list[int]) -> None:
    other, start = _sleeper(spawned)
    # The recorded process started at another moment: the pid is now someone else's.
    _dead_journal(tmp_path, [Companion(other.pid, start - 1, "airflow serve-logs").encode()])

    reclaim(tmp_path)

    assert not exits(other.pid, guard=0.2)


@pytest.mark.parametrize(
    "companions",
    [
        None,
        "airflow",
        [1],
        [{"pid": "2"}],
        [{"pid": 2, "start_ticks": 1.5, "what": "x"}],
        [{"pid": 1, "start_ticks": 1, "what": "init"}],
    ],
)
def test_companions_that_are_not_any_are_skipped(tmp_path: Path, companions: object) -> None:
    path = _dead_journal(tmp_path, companions)

    reclaim(tmp_path)

    assert not path.exists()


def test_a_journal_records_its_companions_for_the_next_reclaim(tmp_path: Path, spawned: list[int]) -> None:
    helper, start = _sleeper(spawned)
    journal = _live_journal(tmp_path, helper.pid, start)
    try:
        header = json.loads((tmp_path / f"{journal.instance}{SUFFIX}").read_text().splitlines()[0])
    finally:
        journal.close()
    assert header[COMPANIONS_KEY] == [{"pid": helper.pid, "start_ticks": start, "what": "x"}]


def test_a_live_journal_s_companions_are_left_alone(tmp_path: Path, spawned: list[int]) -> None:
    helper, start = _sleeper(spawned)
    journal = _live_journal(tmp_path, helper.pid, start)
    try:
        reclaim(tmp_path)
        assert not exits(helper.pid, guard=0.2)
    finally:
        journal.close()


def test_a_handed_on_journal_s_companions_are_left_while_its_scheduler_still_runs(
    tmp_path: Path, spawned: list[int]
) -> None:
    # A stop hands its journal on (unlocked) before its process exits: a reclaim meanwhile (a second
    # scheduler's) takes the journal, but the helpers are still the running scheduler's to stop.
    helper, start = _sleeper(spawned)
    journal = _live_journal(tmp_path, helper.pid, start)
    journal.hand_on()

    reclaim(tmp_path)

    assert not exits(helper.pid, guard=0.2)


def test_a_companion_s_descendants_are_killed_with_it(tmp_path: Path, spawned: list[int]) -> None:
    # A log server with workers of its own (Airflow 2's gunicorn): they hold its port too.
    master = subprocess.Popen([sys.executable, "-c", MASTER], stdout=subprocess.PIPE)
    spawned.append(master.pid)
    assert master.stdout is not None
    master.stdout.readline()
    [worker] = psutil.Process(master.pid).children()
    spawned.append(worker.pid)
    start = start_ticks(master.pid)
    assert start is not None
    _dead_journal(tmp_path, [Companion(master.pid, start, "gunicorn: master").encode()])

    reclaim(tmp_path)

    assert master.wait(10) == -9
    assert exits(worker.pid)
    master.stdout.close()


def test_a_companion_two_dead_journals_name_is_killed_once(
    tmp_path: Path, spawned: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    # Teams: every executor of one scheduler records the same helpers in a journal of its own.
    helper, start = _sleeper(spawned)
    for _ in range(2):
        _dead_journal(tmp_path, [Companion(helper.pid, start, "airflow serve-logs").encode()])

    with caplog.at_level(logging.WARNING, logger="async_local_executor"):
        reclaim(tmp_path)

    assert helper.wait(10) == -9
    stopped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stopped ")]
    assert len(stopped) == 1, stopped
    assert stopped[0].startswith(f"stopped airflow serve-logs (pid {helper.pid}), which scheduler pid 1 had")
    assert list(tmp_path.glob(f"*{SUFFIX}")) == []
