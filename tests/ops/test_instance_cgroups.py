"""An executor's cgroups at start: named after their owner, a dead instance's reclaimed, limits checked.

Whether an instance is dead is its launch journal's lock's to say; its name's pid and start time only
decide when there is no journal to ask.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from uuid import uuid4

import pytest

from async_local_executor.core.cgroups import Limits, Mode, WorkloadCgroup
from async_local_executor.core.proc_identity import start_ticks
from async_local_executor.ops import custody_dir
from async_local_executor.ops.instance_cgroups import (
    LimitsUnavailable,
    instance_lives,
    instance_name,
    open_containment,
    owner_lives,
    status_of,
)
from async_local_executor.ops.journal_file import INSTANCE_ENV, SUFFIX
from async_local_executor.ops.reclaim import reclaim
from tests.core.cgroups import helpers as cgroup_helpers
from tests.core.cgroups.helpers import MiB, Scratch, gone, read_line
from tests.core.clock_step import step_wall_clock
from tests.core.handing import Handed
from tests.core.helpers import GUARD, alive
from tests.processes import exits

cgroups = pytest.mark.skipif(bool(cgroup_helpers.unusable()), reason=cgroup_helpers.unusable())


@pytest.fixture
def box() -> Iterator[Scratch]:
    with cgroup_helpers.scratch() as made:
        yield made


# Another executor instance, alive: it holds its launch journal in the directory it is given.
HOLDER = """
import sys, time
from pathlib import Path
from async_local_executor.ops.journal import LaunchJournal
journal = LaunchJournal.open(Path(sys.argv[1]), owner="live neighbour")
print(journal.instance, flush=True)
time.sleep(600)
"""


@pytest.fixture
def neighbour(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A live instance holding its journal in ``tmp_path``, and its instance id."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        yield holder, read_line(holder).strip()
    finally:
        holder.kill()
        holder.wait(GUARD)
        if holder.stdout is not None:
            holder.stdout.close()


def _dead_pid() -> int:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True
    )
    return int(proc.stdout)


def test_an_instance_is_named_after_the_process_that_owns_it() -> None:
    name = instance_name("0123456789abcdef0123")
    pid, started, instance = name.split("-")
    assert (int(pid), started, instance) == (os.getpid(), f"t{start_ticks(os.getpid())}", "0123456789ab")
    assert owner_lives(name)
    assert not owner_lives(instance_name("0123456789abcdef", pid=_dead_pid()))
    # Same pid, another start: a later process under a recycled pid owns nothing of it.
    assert not owner_lives(f"{pid}-t{int(started[1:]) - 1}-0123456789ab")
    assert owner_lives("someone-else")  # not named by this scheme: never reclaimed


@pytest.mark.parametrize("step", [1.0, -1.0])
def test_a_wall_clock_step_does_not_make_a_live_owner_look_dead(
    monkeypatch: pytest.MonkeyPatch, step: float
) -> None:
    name = instance_name("0123456789abcdef0123")
    step_wall_clock(monkeypatch, step)
    assert owner_lives(name)


def test_an_instance_whose_journal_is_locked_lives_whatever_its_name_says(
    tmp_path: Path, neighbour: tuple[subprocess.Popen[str], str]
) -> None:
    holder, instance = neighbour
    # Its name's pid runs no more (in this namespace, at least): by the name alone it would be dead.
    name = instance_name(instance, pid=_dead_pid())
    assert not owner_lives(name)
    assert instance_lives(name, tmp_path)

    holder.kill()
    holder.wait(GUARD)
    assert not instance_lives(name, tmp_path)
    # Free, its lock says dead even where the name's pid and start time are a running process's.
    assert not instance_lives(instance_name(instance), tmp_path)


def test_without_a_journal_an_instance_is_judged_by_its_owner_process(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Another deployment's (its journal is in a state directory of its own), or a crashed or stopped
    # instance's whose journal was reclaimed before its cgroups are looked at. A live one is left alone,
    # and a predecessor whose journal this executor has just reclaimed is no news: only at DEBUG. Any
    # other dead one is reclaimed here: said at INFO.
    predecessor = "0123456789abcdef"
    with caplog.at_level(logging.DEBUG, logger="async_local_executor.ops.instance_cgroups"):
        assert instance_lives(instance_name("0123456789ab"), tmp_path)
        assert not instance_lives(instance_name("0123456789ab", pid=_dead_pid()), tmp_path)
        assert not instance_lives(
            instance_name(predecessor, pid=_dead_pid()), tmp_path, reclaimed=frozenset({predecessor})
        )
    judged = [
        (record.levelname, record.getMessage().rpartition(", which ")[2])
        for record in caplog.records
        if "no launch journal" in record.getMessage()
    ]
    assert judged == [("DEBUG", "still runs"), ("INFO", "runs no more"), ("DEBUG", "runs no more")]


def test_a_journal_that_cannot_be_opened_keeps_its_instances_cgroups(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / f"0123456789abcdef{SUFFIX}").mkdir()  # whatever it is, it may be a live one's
    with caplog.at_level(logging.WARNING, logger="async_local_executor.ops.instance_cgroups"):
        assert instance_lives(instance_name("0123456789abcdef", pid=_dead_pid()), tmp_path)
    [warning] = [record.getMessage() for record in caplog.records]
    assert "left alone" in warning


def test_off_makes_no_cgroup_and_refuses_limits(tmp_path: Path) -> None:
    containment = open_containment("a" * 32, enabled=False, root="", limits=Limits(), journals=tmp_path)
    assert (containment.mode, containment.why) == (Mode.NONE, "containment = off")
    assert status_of(containment) == {"mode": "none", "detail": "none: containment = off"}
    with pytest.raises(
        LimitsUnavailable, match="task_pids_limit needs a cgroup per task, and there are none here"
    ):
        open_containment("a" * 32, enabled=False, root="", limits=Limits(pids=10), journals=tmp_path)


@cgroups
def test_start_kills_what_a_dead_instance_left_and_says_so(
    box: Scratch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    dead = instance_name("deadbeef", pid=_dead_pid())
    box.instances.append(dead)
    left = box.open(dead).create("w1")
    assert left is not None
    survivor = box.start("print('ready', flush=True)\nimport time\ntime.sleep(600)\n", left)
    assert read_line(survivor) == "ready"

    with caplog.at_level(logging.INFO, logger="async_local_executor.ops.instance_cgroups"):
        containment = open_containment(
            "c0ffee", enabled=True, root=box.root, limits=Limits(), journals=tmp_path
        )
    box.instances.append(containment.instance)
    try:
        survivor.wait(cgroup_helpers.EMPTY_GUARD)
        assert gone(survivor.pid)
        messages = [record.getMessage() for record in caplog.records]
        assert f"killed 1 process(es) left in cgroup w1 of a stopped executor (instance {dead})" in messages
        assert messages[-1] == f"containment: {containment.describe()}"
        assert status_of(containment)["mode"] == "cgroup2"
    finally:
        containment.close()


@cgroups
def test_a_global_limit_the_host_cannot_enforce_stops_the_start(box: Scratch, tmp_path: Path) -> None:
    # Only the cgroup2 mount is listed: the cgroup v1 controllers of a hybrid host are out of sight.
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("\n".join(line for line in lines if " - cgroup2 " in line) + "\n")
    probe = box.open(mountinfo=str(mountinfo))
    probe.close()
    missing = [name for name in ("memory", "cpu", "pids") if name not in probe.controllers]
    if not missing:
        pytest.skip(f"cgroup2 gives every controller here ({probe.describe()})")
    limits = {"memory": Limits(memory=64 * MiB), "cpu": Limits(cpu=1), "pids": Limits(pids=10)}[missing[0]]
    option = f"task_{missing[0]}_limit"
    with pytest.raises(LimitsUnavailable, match=f"{option} needs the {missing[0]} controller"):
        open_containment(
            "f00d", enabled=True, root=box.root, limits=limits, mountinfo=str(mountinfo), journals=tmp_path
        )
    box.instances.append(instance_name("f00d"))
    assert not (box.directory / f"ale-{instance_name('f00d')}").exists()  # refused: nothing left made


@cgroups
def test_a_live_instances_cgroups_are_reclaimed_only_once_its_journal_lock_is_free(
    box: Scratch, tmp_path: Path, neighbour: tuple[subprocess.Popen[str], str]
) -> None:
    holder, instance = neighbour
    # Named after a pid that runs no more: only its lock tells that it lives.
    name = instance_name(instance, pid=_dead_pid())
    box.instances.append(name)
    workload = box.open(name).create("w1")
    assert workload is not None
    task = box.start("print('ready', flush=True)\nimport time\ntime.sleep(600)\n", workload)
    assert read_line(task) == "ready"

    first = open_containment("c0ffee", enabled=True, root=box.root, limits=Limits(), journals=tmp_path)
    box.instances.append(first.instance)
    first.close()
    assert alive(task.pid)
    assert workload.path.is_dir()

    holder.kill()
    holder.wait(GUARD)
    second = open_containment("c0ffe2", enabled=True, root=box.root, limits=Limits(), journals=tmp_path)
    box.instances.append(second.instance)
    try:
        task.wait(cgroup_helpers.EMPTY_GUARD)
        assert gone(task.pid)
        assert not (box.directory / f"ale-{name}").exists()
    finally:
        second.close()


def start_in(box: Scratch, cgroup: WorkloadCgroup, env: Mapping[str, str]) -> subprocess.Popen[str]:
    """A workload process leading its own group, in ``cgroup`` before it runs; it says ``ready``."""
    code = "import sys, time\nsys.stdin.readline()\nprint('ready', flush=True)\ntime.sleep(600)\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(env),
        start_new_session=True,
    )
    box.processes.append(proc)
    cgroup.join(proc.pid)
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert read_line(proc) == "ready"
    return proc


@cgroups
def test_a_held_workloads_cgroup_is_spared_while_another_dead_instances_is_reclaimed(
    box: Scratch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    journal_id = uuid4().hex
    holding = instance_name(journal_id, pid=_dead_pid())
    holding_cgroups = box.open(holding)
    held_cgroup = holding_cgroups.create("w1")
    dead = instance_name(uuid4().hex, pid=_dead_pid())
    left_cgroup = box.open(dead).create("w1")
    assert held_cgroup is not None
    assert left_cgroup is not None
    marked = {**os.environ, INSTANCE_ENV: journal_id}
    workload = start_in(box, held_cgroup, marked)
    # Marked, and neither a descendant of the workload's nor in its group: only its cgroup holds it.
    stray = start_in(box, held_cgroup, marked)
    left = box.start("print('ready', flush=True)\nimport time\ntime.sleep(600)\n", left_cgroup)
    assert read_line(left) == "ready"
    start = start_ticks(workload.pid)
    lines = [
        {"instance": journal_id, "owner": "stopped", "pid": 1, "opened": 0},
        {"+": workload.pid, "start_ticks": start, "key": "dag.held try 1", "handover_timeout": 300},
        {
            "handover": workload.pid,
            "start_ticks": start,
            "info": {},
            "cgroup": str(held_cgroup.path),
            "at": time.time(),
            "boot": time.clock_gettime(time.CLOCK_BOOTTIME),
            "timeout": 300,
        },
    ]
    (tmp_path / f"{journal_id}{SUFFIX}").write_text("".join(json.dumps(line) + "\n" for line in lines))

    result = reclaim(tmp_path)

    assert result.killed == []
    [held] = result.held
    assert (held.pid, held.cgroup) == (workload.pid, str(held_cgroup.path))
    assert alive(stray.pid)
    with caplog.at_level(logging.DEBUG, logger="async_local_executor"):
        containment = open_containment(
            "c0ffee",
            enabled=True,
            root=box.root,
            limits=Limits(),
            journals=tmp_path,
            spare=frozenset({str(held_cgroup.path)}),
            reclaimed=frozenset(result.instances),
        )
    box.instances.append(containment.instance)
    try:
        assert [r.getMessage() for r in caplog.records if r.levelno == logging.INFO] == [
            (
                f"no launch journal in {tmp_path} for the executor instance of cgroup {dead}: judged by its owner "
                f"process, pid {dead.split('-')[0]}, which runs no more"
            ),
            f"containment: {containment.describe()}",
        ]
        # Left alone on purpose (the executor says what it holds): above DEBUG only what was killed.
        assert [
            (r.levelname, r.getMessage()) for r in caplog.records if str(held_cgroup.path) in r.getMessage()
        ] == [
            (
                "DEBUG",
                f"cgroup {held_cgroup.path} of a stopped executor is left as it is: its workload was handed over",
            )
        ]
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
            f"killed 1 process(es) left in cgroup w1 of a stopped executor (instance {dead})"
        ]
        left.wait(cgroup_helpers.EMPTY_GUARD)
        assert gone(left.pid)
        assert not (box.directory / f"ale-{dead}").exists()
        assert alive(workload.pid)
        assert alive(stray.pid)
        assert sorted(held_cgroup.members()) == sorted([workload.pid, stray.pid])
        assert holding_cgroups.path is not None
        assert holding_cgroups.path.is_dir()
    finally:
        containment.close()


@cgroups
@pytest.mark.parametrize("judged_here", [False, True], ids=["another deployment's", "reclaimed here"])
def test_a_workload_waiting_in_custody_is_spared_unless_its_instance_was_reclaimed_here(
    box: Scratch, tmp_path: Path, caplog: pytest.LogCaptureFixture, judged_here: bool
) -> None:
    # A crashed scheduler's instance with no journal left to ask: one of its workloads waits in custody,
    # another process of the same instance is a plain survivor. Either another deployment's (its journal
    # is in a state directory of its own): the waiting workload is its own successor's to adopt and its
    # own watchdog's to end. Or this state directory's, whose journal this executor has just reclaimed
    # without holding that workload: then it is not ours to keep, in custody or not.
    journal_id = uuid4().hex
    dead = instance_name(journal_id, pid=_dead_pid())
    dead_cgroups = box.open(dead)
    waiting_cgroup, left_cgroup = dead_cgroups.create("w1"), dead_cgroups.create("w2")
    assert waiting_cgroup is not None
    assert left_cgroup is not None
    elsewhere = tmp_path / "custody"
    elsewhere.mkdir(mode=0o700)
    waiting = Handed(elsewhere, timeout=600.0)
    try:
        waiting_cgroup.join(waiting.pid)
        waiting.kill_owner()
        left = box.start("print('ready', flush=True)\nimport time\ntime.sleep(600)\n", left_cgroup)
        assert read_line(left) == "ready"
        journals = tmp_path / "this-deployment"
        journals.mkdir()

        with caplog.at_level(logging.DEBUG, logger="async_local_executor"):
            containment = open_containment(
                "c0ffee",
                enabled=True,
                root=box.root,
                limits=Limits(),
                journals=journals,
                reclaimed=frozenset({journal_id}) if judged_here else frozenset(),
            )
        box.instances.append(containment.instance)
        try:
            left.wait(cgroup_helpers.EMPTY_GUARD)
            assert gone(left.pid)
            assert not left_cgroup.path.exists()
            spared = (
                f"cgroup {waiting_cgroup.path} of a stopped executor is left as it is: its workload "
                f"(pid {waiting.pid}) waits to be adopted, and ends itself if it is not"
            )
            if judged_here:
                assert exits(waiting.pid, cgroup_helpers.EMPTY_GUARD)
                assert spared not in caplog.text
                assert dead_cgroups.path is not None
                assert not dead_cgroups.path.exists()
            else:
                assert alive(waiting.pid)
                assert waiting_cgroup.members() == [waiting.pid]
                assert dead_cgroups.path is not None
                assert dead_cgroups.path.is_dir()
                # Another deployment's, left alone on purpose: nothing for this one's operators above DEBUG.
                assert [r.levelname for r in caplog.records if r.getMessage() == spared] == ["DEBUG"]
        finally:
            containment.close()
    finally:
        waiting.cleanup()


@cgroups
def test_a_stop_leaves_the_cgroups_of_what_it_handed_over_without_a_warning(
    box: Scratch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    containment = open_containment("c0ffee", enabled=True, root=box.root, limits=Limits(), journals=tmp_path)
    box.instances.append(containment.instance)
    assert containment.path is not None
    handed, left, ended = (containment.create(name) for name in ("w1", "w2", "w3"))
    assert handed is not None
    assert left is not None
    assert ended is not None
    # The handed-over workload and a task process it started; and what a workload that ended left behind
    # (kill_leftover_processes off), which nobody was handed.
    workload, task = start_in(box, handed, os.environ), start_in(box, handed, os.environ)
    start_in(box, left, os.environ)
    # As the stop does for each workload it hands over, before it closes its cgroups.
    custody = custody_dir.path(tmp_path)
    custody.mkdir(mode=0o700)
    start = start_ticks(workload.pid)
    assert start is not None
    custody_dir.name_owner(custody, workload.pid, start)

    with caplog.at_level(logging.DEBUG, logger="async_local_executor"):
        containment.close()

    assert alive(workload.pid)
    assert alive(task.pid)
    assert all(directory.is_dir() for directory in [handed.path, *handed.v1.values(), containment.path])
    assert not any(directory.exists() for directory in [ended.path, *ended.v1.values()])
    warnings = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    # Only the leftover nobody was handed is news, in each hierarchy it is in.
    left_dirs = [left.path, *left.v1.values()]
    assert sorted(warnings) == sorted(
        f"cannot remove cgroup {directory}: Device or resource busy" for directory in left_dirs
    )
    assert f"w1: pid {workload.pid}" in caplog.text
