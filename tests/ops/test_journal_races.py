"""The launch journal against another scheduler's reclaim, readers of its lock, and files not its own.

Each race is driven deterministically: the other party runs from a hook at the exact point of the window.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from async_local_executor.core.proc_identity import start_ticks
from async_local_executor.ops import journal_file, reclaim
from async_local_executor.ops.journal import LaunchJournal
from async_local_executor.ops.journal import reclaim as reclaim_all
from async_local_executor.ops.journal_file import CREATING, SUFFIX, holder_alive
from tests.core.helpers import alive
from tests.processes import SLEEP


@pytest.fixture
def sleeper() -> Iterator[int]:
    proc = subprocess.Popen(SLEEP)
    yield proc.pid
    proc.kill()
    proc.wait()


def reclaim_in_the_window(monkeypatch: pytest.MonkeyPatch, directory: Path, at_call: int = 1) -> list[int]:
    """Make another scheduler's reclaim run between a journal file's creation and its locking."""
    lock = journal_file._lock_new
    calls: list[int] = []

    def late(fd: int) -> None:
        calls.append(fd)
        if len(calls) == at_call:
            reclaim_all(directory)
        lock(fd)

    monkeypatch.setattr(journal_file, "_lock_new", late)
    return calls


def live_pids(path: Path) -> dict[int, str]:
    fd = os.open(path, os.O_RDONLY)
    try:
        _, live = journal_file.read(fd, path)
    finally:
        os.close(fd)
    return {pid: key for pid, (_, key) in live.items()}


def test_a_reclaim_between_creating_and_locking_a_new_journal_leaves_it_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sleeper: int
) -> None:
    calls = reclaim_in_the_window(monkeypatch, tmp_path)

    journal = LaunchJournal.open(tmp_path, owner="starting")

    assert calls
    assert holder_alive(journal.path) is True
    journal.started(sleeper, "dag.task try 1")
    assert reclaim_all(tmp_path).killed == []
    assert live_pids(journal.path) == {sleeper: "dag.task try 1"}
    assert [p.name for p in tmp_path.iterdir()] == [journal.path.name]
    journal.close()


def test_a_reclaim_between_creating_and_locking_a_compacted_journal_leaves_it_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sleeper: int
) -> None:
    monkeypatch.setattr("async_local_executor.ops.journal._COMPACT_SLACK", 2)
    journal = LaunchJournal.open(tmp_path, owner="compacting")
    journal.started(sleeper, "stays")
    calls = reclaim_in_the_window(monkeypatch, tmp_path)

    for _ in range(3):
        journal.started(os.getpid(), "comes and goes")
        journal.ended(os.getpid())

    assert calls  # it compacted, with a reclaim in the window
    assert not journal._broken
    assert holder_alive(journal.path) is True
    assert live_pids(journal.path) == {sleeper: "stays"}
    assert alive(sleeper)
    journal.close()
    assert list(tmp_path.iterdir()) == []


def dead_journal(directory: Path, pid: int, name: str = "dead") -> Path:
    path = directory / f"{name}{SUFFIX}"
    lines = [
        {"instance": name, "owner": "gone", "pid": 1, "opened": 0},
        {"+": pid, "start_ticks": start_ticks(pid), "key": "left running"},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_a_reader_asking_whether_a_dead_journals_writer_lives_does_not_keep_it_from_reclaim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sleeper: int
) -> None:
    path = dead_journal(tmp_path, sleeper)
    # A status reader's shared lock, held at the moment reclaim looks; it lets go while reclaim waits.
    reader = os.open(path, os.O_RDONLY)
    fcntl.flock(reader, fcntl.LOCK_SH | fcntl.LOCK_NB)
    pauses: list[None] = []

    def reader_lets_go() -> None:
        pauses.append(None)
        os.close(reader)

    monkeypatch.setattr(reclaim, "_pause", reader_lets_go)

    assert [s.pid for s in reclaim_all(tmp_path).killed] == [sleeper]
    assert pauses == [None]
    assert not alive(sleeper)
    assert not path.exists()


def test_a_live_writers_journal_is_not_waited_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    journal = LaunchJournal.open(tmp_path, owner="alive")
    monkeypatch.setattr(reclaim, "_pause", lambda: pytest.fail("waited on a live writer's lock"))
    assert reclaim_all(tmp_path).killed == []
    assert journal.path.exists()
    journal.close()


def test_a_new_journal_cut_short_before_its_rename_is_removed_once_its_writer_is_dead(tmp_path: Path) -> None:
    dead = tmp_path / f"a{SUFFIX}{CREATING}0123"
    dead.write_text("{}\n")
    live = tmp_path / f"b{SUFFIX}{CREATING}4567"
    live.write_text("{}\n")
    held = os.open(live, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        assert reclaim_all(tmp_path).killed == []
        assert [p.name for p in tmp_path.iterdir()] == [live.name]
    finally:
        os.close(held)


def test_lines_not_in_the_journals_format_are_skipped_with_one_warning_naming_it(
    tmp_path: Path, sleeper: int, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / f"odd{SUFFIX}"
    start = start_ticks(sleeper)
    lines = [
        "[]",  # a header that is not an object
        "3",
        '"x"',
        "null",
        json.dumps({"+": sleeper}),  # no start time: not to be killed by pid
        json.dumps({"+": str(sleeper), "start_ticks": start, "key": "a string pid"}),
        json.dumps({"+": -1, "start_ticks": start, "key": "a negative pid"}),
        json.dumps({"-": [sleeper]}),
        json.dumps({"launched": sleeper}),
        json.dumps({"+": sleeper, "start_ticks": start, "key": "recorded"}),
    ]
    path.write_text("\n".join(lines) + '\n{"+": 1')  # and a last line cut short by the crash
    caplog.set_level(logging.WARNING, "async_local_executor.ops.journal")

    assert [(s.pid, s.label) for s in reclaim_all(tmp_path).killed] == [(sleeper, "recorded")]

    [warning] = [r.getMessage() for r in caplog.records]
    assert f"skipped 9 line(s) of the launch journal {path}" in warning
    assert not path.exists()


@pytest.mark.parametrize("kind", ["directory", "fifo", "link"])
def test_what_is_not_a_regular_file_under_a_journals_name_is_skipped_without_blocking(
    tmp_path: Path, sleeper: int, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / f"{kind}{SUFFIX}"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)  # opened for reading without a writer, an ordinary open would block for ever
    else:
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        path.symlink_to(dead_journal(elsewhere, sleeper))  # reclaim would kill what another file names
    caplog.set_level(logging.WARNING, "async_local_executor.ops.journal")

    assert reclaim_all(tmp_path).killed == []

    assert alive(sleeper)
    assert any(str(path) in r.getMessage() for r in caplog.records)


def test_a_compaction_that_finds_the_descriptor_table_full_is_tried_again_and_loses_no_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sleeper: int
) -> None:
    # EMFILE raised at the compaction's one open: a full table cannot be made to fail that call alone.
    monkeypatch.setattr("async_local_executor.ops.journal._COMPACT_SLACK", 2)
    real = journal_file.install_locked
    full = [False]

    def install_locked(path: Path, content: bytes) -> int:
        if full[0]:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real(path, content)

    monkeypatch.setattr("async_local_executor.ops.journal.install_locked", install_locked)
    journal = LaunchJournal.open(tmp_path, owner="full")
    full[0] = True
    for _ in range(4):  # over the slack: each line tries a compaction, which fails
        journal.started(os.getpid(), "comes and goes")
        journal.ended(os.getpid())
    journal.started(sleeper, "written while the table is full")
    assert live_pids(journal.path) == {sleeper: "written while the table is full"}
    full[0] = False
    journal.started(os.getpid(), "after")
    journal.ended(os.getpid())
    assert live_pids(journal.path) == {sleeper: "written while the table is full"}
    assert len(journal.path.read_bytes().splitlines()) <= 4  # compacted once there was room
    journal.close()
