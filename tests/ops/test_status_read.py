"""Status files that are stale, foreign or planted, as ``status_read`` reads them: judged by their writer's
journal lock and start time, skipped when unreadable or not a regular file. What the writer writes is
test_status.py's."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from async_local_executor.core.proc_identity import start_ticks
from async_local_executor.ops import cli, recovery
from async_local_executor.ops.journal import LaunchJournal
from async_local_executor.ops.journal_file import SUFFIX
from async_local_executor.ops.status import START_TICKS_KEY, StatusWriter, read_all, status_path
from tests.core.clock_step import step_wall_clock
from tests.core.helpers import GUARD
from tests.processes import SLEEP, read_line
from tests.states import meta
from tests.states import quiet_report as report

# Above the kernel's largest pid (pid_max is at most 2**22): a pid of another namespace, not of ours.
FOREIGN_PID = 2**22 + 7

# An executor stand-in elsewhere (another container sharing the state directory): it holds a journal
# and prints its instance.
HOLDER = """
import sys, time
from pathlib import Path
from async_local_executor.ops.journal import LaunchJournal
journal = LaunchJournal.open(Path(sys.argv[1]), owner="other namespace")
print(journal.instance, flush=True)
time.sleep(600)
"""


def write(directory: Path, instance: str, **fields: Any) -> Path:
    writer = StatusWriter(status_path(directory, instance), meta(instance, **fields))
    writer.write(report())
    return writer.path


@pytest.fixture
def stranger() -> Iterator[psutil.Process]:
    proc = subprocess.Popen(SLEEP)
    yield psutil.Process(proc.pid)
    proc.kill()
    proc.wait()


def test_a_live_writer_without_a_journal_stays_alive_when_the_wall_clock_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No journal to ask (its executor is closing it, say): the file's start time alone tells.
    write(tmp_path, "me")
    step_wall_clock(monkeypatch, 1.0)
    [found] = read_all(tmp_path)
    assert (found.gone, found.stale) == (False, None)


@pytest.mark.parametrize("reused_by", ["this scheduler", "another process"])
def test_a_crashed_schedulers_file_goes_though_its_pid_now_runs_another_process(
    tmp_path: Path, stranger: psutil.Process, reused_by: str
) -> None:
    # A container restarted with its filesystem kept: the crashed scheduler's pid is reused.
    pid = os.getpid() if reused_by == "this scheduler" else stranger.pid
    started = start_ticks(pid)
    assert started is not None
    path = write(tmp_path, "crashed", pid=pid, **{START_TICKS_KEY: started - 1000})

    [found] = read_all(tmp_path)
    assert found.gone
    assert found.stale == f"scheduler pid {pid} is not running"
    recovery.reclaim_then_open(tmp_path, owner="successor").journal.close()
    assert not path.exists()
    assert cli.main(["status", "--check", "--state-dir", str(tmp_path)]) == 2


def test_a_live_executor_in_another_pid_namespace_keeps_its_file_until_it_dies(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        instance = read_line(holder).strip()
        # Its pid means nothing here: only its journal's lock tells that it lives.
        path = write(tmp_path, instance, pid=FOREIGN_PID, **{START_TICKS_KEY: 1})
        [found] = read_all(tmp_path)
        assert (found.gone, found.stale) == (False, None)
        recovery.reclaim_then_open(tmp_path, owner="neighbour").journal.close()
        assert path.exists()
    finally:
        holder.kill()
        holder.wait(GUARD)
    [found] = read_all(tmp_path)
    assert found.gone
    recovery.reclaim_then_open(tmp_path, owner="successor").journal.close()
    assert list(tmp_path.iterdir()) == [tmp_path / "custody"]


def without_start(directory: Path, instance: str, pid: int) -> Path:
    """A status file whose writer could not read its own start time."""
    path = status_path(directory, instance)
    path.write_text(
        json.dumps(
            {
                "instance": instance,
                "pid": pid,
                START_TICKS_KEY: None,
                "written_at": time.time(),
                "hostname": socket.gethostname(),
            }
        )
    )
    return path


@pytest.mark.parametrize(
    ("journal", "pid", "alive"),
    [
        ("none", "stranger", True),
        ("none", "foreign", False),
        ("none", "mine", False),  # this process reads its own start: the file is a predecessor's
        ("locked", "stranger", True),
        ("locked", "foreign", False),  # cannot tell from another namespace's: taken for dead
        ("unlocked", "stranger", False),
    ],
)
def test_a_file_whose_writer_had_no_start_time_is_alive_only_while_its_pid_runs_and_its_journal_is_held(
    tmp_path: Path, stranger: psutil.Process, journal: str, pid: str, alive: bool
) -> None:
    pids = {"stranger": stranger.pid, "foreign": FOREIGN_PID, "mine": os.getpid()}
    instance = "old"
    held = None
    if journal == "locked":
        held = LaunchJournal.open(tmp_path, owner="old")
        instance = held.instance
    elif journal == "unlocked":
        (tmp_path / f"{instance}{SUFFIX}").write_text("{}\n")
    without_start(tmp_path, instance, pids[pid])
    [found] = read_all(tmp_path)
    assert found.gone is not alive
    if held is not None:
        held.close()


@pytest.mark.parametrize(
    "content",
    ["[]", "3", '"x"', "null", "{}", '{"pid": "7", "written_at": 1}', '{"pid": 7, "written_at": "x"}',
     '{"pid": 7, "written_at": 1e999}', '{"pid": 7, "written_at": NaN}', '{"written_at": 1}',
     '{"pid": 7, "written_at": 1}',
     '{"pid": 7, "written_at": 1, "pid_start_ticks": "x"}', '{"pid": 7, "written_at": 1, "pid_start_ticks": 5}',
     '{"pid": 7, "written_at": 1, "pid_start_ticks": 5, "hostname": []}', "[" * 100_000, "\x00\xff"],
)  # fmt: skip
# A file with the pid and time of a writer but another field of the wrong kind is read without that
# field (test_status_read_malformed.py).
def test_a_file_that_is_not_a_status_file_is_skipped_with_one_warning(
    tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    path = status_path(tmp_path, "bad")
    path.write_text(content)
    caplog.set_level(logging.WARNING, "async_local_executor.ops.status")

    assert read_all(tmp_path) == []
    recovery.reclaim_then_open(tmp_path, owner="unbothered").journal.close()
    assert cli.main(["status", "--check", "--state-dir", str(tmp_path)]) == 2
    assert "no executor status found" in capsys.readouterr().out

    [warning] = [r.getMessage() for r in caplog.records]
    assert str(path) in warning
    assert path.exists()  # whose it is cannot be told: left alone


@pytest.mark.parametrize("kind", ["directory", "fifo", "link"])
def test_what_is_not_a_regular_file_under_a_status_files_name_is_skipped_without_blocking(
    tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = status_path(tmp_path, kind)
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)  # opened for reading without a writer, an ordinary open would block for ever
    else:
        write(tmp_path, "target")
        path.symlink_to(status_path(tmp_path, "target"))
    caplog.set_level(logging.WARNING, "async_local_executor.ops.status")

    assert [f.path for f in read_all(tmp_path)] == (
        [status_path(tmp_path, "target")] if kind == "link" else []
    )
    assert any(str(path) in r.getMessage() for r in caplog.records)
