"""Workloads handed over across a scheduler restart: journalled, held by the next reclaim instead of
killed (with what belongs to them), recorded in the new journal, named in the custody directory.

Real processes throughout: the dead executors are child processes that wrote their journal and exited
(or were killed), the workloads are real process trees.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Hashable, Iterator
from pathlib import Path

import psutil
import pytest

from async_local_executor.core.outcome import Outcome
from async_local_executor.core.proc_identity import start_ticks
from async_local_executor.ops import custody_dir, journal_file, recovery
from async_local_executor.ops import journal as registry
from async_local_executor.ops.journal import (
    INSTANCE_ENV,
    SUFFIX,
    Held,
    LaunchJournal,
    RecordingListener,
    reclaim,
)
from async_local_executor.ops.journal_file import Handover
from tests.core.helpers import alive
from tests.processes import SLEEP, exits, read_line

TIMEOUT = 300.0

# A handed-over workload's tree: a process left in its group; a marked one that left the group (setsid);
# one whose parent exited at once, so that nothing but the journal's "seen" line ties it to the workload
# (it left the group too, and its parent chain ends at init); and one whose parent exited too, that
# stayed in the group but dropped the mark.
MIDDLE = """
import os, subprocess, sys
clean = {k: v for k, v in os.environ.items() if k != sys.argv[1]}
orphan = subprocess.Popen(sys.argv[2:], start_new_session=True)
straggler = subprocess.Popen(sys.argv[2:], env=clean)
print(orphan.pid, straggler.pid, flush=True)
"""
WORKLOAD = f"""
import json, subprocess, sys
sleep = {SLEEP!r}
member = subprocess.Popen(sleep)
escaped = subprocess.Popen(sleep, start_new_session=True)
middle = subprocess.Popen(
    [sys.executable, "-c", {MIDDLE!r}, {INSTANCE_ENV!r}, *sleep], stdout=subprocess.PIPE, text=True
)
orphan, straggler = map(int, middle.stdout.readline().split())
middle.wait()
found = {{"member": member.pid, "escaped": escaped.pid, "orphan": orphan, "straggler": straggler}}
print(json.dumps(found), flush=True)
member.wait()
"""

# An executor stand-in: launches a workload started to outlive it and another that is not, journals
# what the status walk would have seen, then either hands the first over and closes its journal as a
# stopping scheduler does ("handover"), or waits to be killed ("crash").
OWNER = f"""
import json, os, subprocess, sys, time
from pathlib import Path
from async_local_executor.core.outcome import Outcome
from async_local_executor.core.proc_identity import start_ticks
from async_local_executor.ops.journal import LaunchJournal
journal = LaunchJournal.open(Path(sys.argv[1]), owner="test owner")
env = journal.child_env(os.environ)
held = subprocess.Popen(
    [sys.executable, "-c", {WORKLOAD!r}], env=env, start_new_session=True, stdout=subprocess.PIPE, text=True
)
journal.started(held.pid, "dag.held try 1", handover_timeout={TIMEOUT}, info={{"ti": "dag.held"}})
pids = json.loads(held.stdout.readline())
journal.seen({{held.pid: [(pids["orphan"], start_ticks(pids["orphan"]))]}})
other = subprocess.Popen({SLEEP!r}, env=env, start_new_session=True)
journal.started(other.pid, "dag.other try 1")
print(json.dumps({{"held": held.pid, "other": other.pid, **pids, "instance": journal.instance}}), flush=True)
if sys.argv[2] == "handover":
    journal.handed_over(held.pid, {{"ti": "dag.held", "ti_id": "abc"}}, None, {TIMEOUT})
    journal.close()  # a launch handed over: the journal stays, unlocked, for the next executor
else:
    time.sleep(600)
"""


def dead_owner(directory: Path, how: str, spawned: list[int]) -> dict[str, int | str]:
    """Run an executor stand-in that hands over (then exits) or crashes (killed); what it left running."""
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(directory), how], stdout=subprocess.PIPE, text=True
    )
    spawned.append(owner.pid)
    found: dict[str, int | str] = json.loads(read_line(owner))
    spawned.extend(pid for name, pid in found.items() if isinstance(pid, int))
    if how == "crash":
        owner.kill()
    assert owner.wait(60) == (0 if how == "handover" else -signal.SIGKILL)
    if owner.stdout is not None:
        owner.stdout.close()
    return found


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


def test_a_stopping_executor_that_handed_nothing_over_removes_its_journal(tmp_path: Path) -> None:
    journal = LaunchJournal.open(tmp_path, owner="stopping")
    journal.started(os.getpid(), "dag.task try 1", handover_timeout=TIMEOUT)
    journal.handed_over(os.getppid(), {}, None, TIMEOUT)  # not a launch of its: ignored, so nothing keeps it
    journal.close()
    assert list(tmp_path.iterdir()) == []
    kept = LaunchJournal.open(tmp_path, owner="handing on")
    kept.hand_on()  # let go of unconditionally, for whatever the next reclaim finds in it
    assert [p.name for p in tmp_path.iterdir()] == [kept.path.name]


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


# A new executor that takes over what a dead one handed over, then crashes.
SUCCESSOR = """
import json, sys, time
from pathlib import Path
from async_local_executor.ops import recovery
recovered = recovery.reclaim_then_open(Path(sys.argv[1]), owner="successor")
print(json.dumps({"held": [h.pid for h in recovered.held], "instance": recovered.journal.instance}), flush=True)
time.sleep(600)
"""


def test_a_held_workload_is_recorded_in_the_new_journal_and_named_in_its_custody_file(
    tmp_path: Path, spawned: list[int]
) -> None:
    pids = dead_owner(tmp_path, "handover", spawned)
    held_pid, orphan = int(pids["held"]), int(pids["orphan"])
    start = start_ticks(held_pid)
    assert start is not None
    custody = custody_dir.path(tmp_path)
    stale = custody_dir.name(held_pid, start + 1)  # a workload of the same pid that no longer runs

    recovered = recovery.reclaim_then_open(tmp_path, owner="first successor")
    try:
        assert [each.pid for each in recovered.held] == [held_pid]
        assert recovered.custody == custody
        assert (custody.stat().st_mode & 0o777) == 0o700
        fd = os.open(recovered.journal.path, os.O_RDONLY)
        try:
            _, live, seen, handovers = journal_file.read_all(fd)
        finally:
            os.close(fd)
        assert live == {held_pid: (start, "dag.held try 1")}
        assert seen == {held_pid: {orphan: start_ticks(orphan)}}
        held = recovered.held[0]
        assert handovers == {
            held_pid: Handover(start, TIMEOUT, info=held.info, cgroup=None, held_from=str(pids["instance"]))
        }
        me = (os.getpid(), start_ticks(os.getpid()))
        assert custody_dir.read_owner(custody, held_pid, start) == me
        owner_file = custody / f"{held_pid}-{start}.json"
        assert json.loads(owner_file.read_text()) == {"owner_pid": me[0], "owner_start": me[1]}
        assert (owner_file.stat().st_mode & 0o777) == 0o600
        (custody / f"{stale}.exit").write_text('{"status": 0}')
        # Its supervision starts here: the launch its adopter reports keeps the line that holds it (what
        # was recorded at its real launch), which a crash of this executor leaves to the next one.
        recovered.journal.started(held_pid, "dag.held try 1", handover_timeout=TIMEOUT, info={"adopted": 1})
        fd = os.open(recovered.journal.path, os.O_RDONLY)
        try:
            assert journal_file.read_all(fd)[3] == handovers
        finally:
            os.close(fd)
    finally:
        # As if this executor died: the journal stays, unlocked, without a handover line.
        recovered.journal.hand_on()

    # The next executor holds it as one a crash handed over, and crashes too: the one after it holds it.
    successor = subprocess.Popen(
        [sys.executable, "-c", SUCCESSOR, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    spawned.append(successor.pid)
    taken = json.loads(read_line(successor))
    assert taken["held"] == [held_pid]
    assert not (custody / f"{stale}.exit").exists()  # the start removed what no longer runs
    assert custody_dir.read_owner(custody, held_pid, start) == (successor.pid, start_ticks(successor.pid))
    successor.kill()
    assert successor.wait(60) == -signal.SIGKILL
    if successor.stdout is not None:
        successor.stdout.close()

    result = reclaim(tmp_path)

    assert result.killed == []
    [again] = result.held
    assert (again.pid, again.start, again.instance, again.owner) == (
        held_pid,
        start,
        taken["instance"],
        "successor",
    )
    assert again.crashed
    assert again.info == held.info
    assert again.descendants == ((orphan, start_ticks(orphan)),)
    assert all(alive(int(pids[name])) for name in ("held", "member", "escaped", "orphan", "straggler"))


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


def test_custody_files_are_read_and_removed(tmp_path: Path) -> None:
    custody = tmp_path / "custody"
    custody.mkdir()
    assert custody_dir.read_exit(custody, 12, 34) is None
    for content, status in [('{"status": 3}', 3), ('{"status": true}', None), ("{", None), ("[]", None)]:
        (custody / "12-34.exit").write_text(content)
        assert custody_dir.read_exit(custody, 12, 34) == status
    custody_dir.name_owner(custody, 12, 34, 56, 78)
    assert custody_dir.read_owner(custody, 12, 34) == (56, 78)
    custody_dir.out_path(custody, 12, 34).write_text("output")
    (custody / "123-4.json").write_text("{}")  # another workload's

    custody_dir.remove(custody, 12, 34)

    assert [p.name for p in custody.iterdir()] == ["123-4.json"]


def test_stale_custody_files_go_unless_a_live_executor_answers_for_them(tmp_path: Path) -> None:
    custody = tmp_path / "custody"
    custody.mkdir()
    me, mine = os.getpid(), start_ticks(os.getpid())
    assert mine is not None
    running = f"{me}-{mine}"  # still runs: kept
    ended_adopted = f"{me}-{mine + 1}"  # ended, its owner (this process) lives and has yet to read it: kept
    ended = f"{me}-{mine + 2}"  # ended, its owner is gone: removed
    for name in (running, ended_adopted, ended):
        (custody / f"{name}.exit").write_text('{"status": 0}')
        (custody / f"{name}.out").write_text("")
    custody_dir.name_owner(custody, me, mine + 1)
    custody_dir.name_owner(custody, me, mine + 2, me, mine + 3)
    (custody / f"{ended}.json.tmp-0123").write_text("")  # a write cut short
    (custody / "notes.txt").write_text("")  # not a workload's

    assert custody_dir.remove_stale(custody) == [ended]

    assert not any(p.name.startswith(f"{ended}.") for p in custody.iterdir())
    assert {p.name for p in custody.iterdir()} == {
        f"{running}.exit",
        f"{running}.out",
        f"{ended_adopted}.exit",
        f"{ended_adopted}.out",
        f"{ended_adopted}.json",
        "notes.txt",
    }


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
