"""The launch journal's handover lines (``journal.py``): a stop that handed nothing over leaves no journal,
a handover survives compaction until its workload's exit ends it, and the listener journals what a crash
would hand over."""

from __future__ import annotations

import os
import time
from collections.abc import Hashable
from pathlib import Path

import pytest

from async_local_executor.core.outcome import Outcome
from async_local_executor.core.proc_identity import start_ticks
from async_local_executor.ops import journal as registry
from async_local_executor.ops import journal_file
from async_local_executor.ops.journal import LaunchJournal, RecordingListener
from async_local_executor.ops.journal_file import Handover

TIMEOUT = 300.0  # a launch's handover_timeout


def test_a_stopping_executor_that_handed_nothing_over_removes_its_journal(tmp_path: Path) -> None:
    journal = LaunchJournal.open(tmp_path, owner="stopping")
    journal.started(os.getpid(), "dag.task try 1", handover_timeout=TIMEOUT)
    journal.handed_over(os.getppid(), {}, None, TIMEOUT)  # not a launch of its: ignored, so nothing keeps it
    journal.close()
    assert list(tmp_path.iterdir()) == []
    kept = LaunchJournal.open(tmp_path, owner="handing on")
    kept.hand_on()  # let go of unconditionally, for whatever the next reclaim finds in it
    assert [p.name for p in tmp_path.iterdir()] == [kept.path.name]


def test_handovers_survive_compaction_and_an_exit_ends_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry, "_COMPACT_SLACK", 4)
    journal = LaunchJournal.open(tmp_path, owner="compacting")
    me = os.getpid()
    journal.started(me, "stays", handover_timeout=TIMEOUT)
    journal.handed_over(me, {"ti": "x"}, "/sys/fs/cgroup/ale-x/w1", TIMEOUT)
    for _ in range(10):
        journal.started(os.getppid(), "comes and goes")
        journal.ended(os.getppid())

    def handovers() -> journal_file.Handovers:
        fd = os.open(journal.path, os.O_RDONLY)
        try:
            return journal_file.read_all(fd)[3]
        finally:
            os.close(fd)

    assert len(journal.path.read_bytes().splitlines()) <= 1 + 2 + 4 + 1
    [handover] = handovers().values()
    assert (handover.info, handover.cgroup, handover.timeout) == (
        {"ti": "x"},
        "/sys/fs/cgroup/ale-x/w1",
        TIMEOUT,
    )
    assert handover.boot is not None
    assert handover.boot <= time.clock_gettime(time.CLOCK_BOOTTIME)
    assert list(handovers()) == [me]
    journal.ended(me)
    assert handovers() == {}
    journal.close()
    assert list(tmp_path.iterdir()) == []


class Inner:
    """The listener behind the journal's: what it was told."""

    def __init__(self) -> None:
        self.started_keys: list[Hashable] = []

    def started(self, key: Hashable, pid: int) -> None:
        self.started_keys.append(key)

    def finished(self, outcome: Outcome) -> None:
        raise AssertionError("nothing finishes here")


def test_the_listener_journals_as_handed_over_after_a_crash_only_what_has_data_to_adopt_it_by(
    tmp_path: Path,
) -> None:
    journal = LaunchJournal.open(tmp_path, owner="listening")
    inner = Inner()
    listener = RecordingListener(
        inner, journal, str, handover_timeout=TIMEOUT, info=lambda key: {"ti": key} if key == "task" else None
    )
    me, parent = os.getpid(), os.getppid()

    listener.started("task", me)
    listener.started("callback", parent)

    fd = os.open(journal.path, os.O_RDONLY)
    try:
        _, live, _, handovers = journal_file.read_all(fd)
    finally:
        os.close(fd)
    assert inner.started_keys == ["task", "callback"]
    assert set(live) == {me, parent}
    assert handovers == {me: Handover(start_ticks(me) or 0, TIMEOUT, info={"ti": "task"})}
    journal.close()
