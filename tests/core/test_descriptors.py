"""A full descriptor table is a capacity: launches wait for room, workloads get the limit they had.

The table is filled for real in a process of its own (tests/core/launchers/descriptor_driver.py): its free
descriptors taken, a real workload running, real launches on both paths. EMFILE at one given call of a
launch (the pidfd, the control socket, a cgroup's files) is raised by replacing that call alone, while
the rest of the launch runs for real: a launch closes the two descriptors its child took before it opens
the pidfd, so no fill of a real table fails that call and not the ones before it. The fork server's
own table is filled for real (its limit lowered to what it holds), so the request's descriptors do not
reach it.
"""

from __future__ import annotations

import errno
import itertools
import json
import logging
import os
import resource
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from async_local_executor.core import descriptors
from async_local_executor.core.admission import Admission
from async_local_executor.core.cgroups import Containment
from async_local_executor.core.errors import DescriptorsFull
from async_local_executor.core.launchers.base import Launcher, LaunchRequest, prepare
from async_local_executor.core.launchers.contained import ContainedLauncher
from async_local_executor.core.launchers.forkserver.launcher import ForkServerLauncher
from async_local_executor.core.launchers.subprocess import SubprocessLauncher
from async_local_executor.core.outcome import OutcomeKind
from async_local_executor.core.supervisor import Supervisor
from tests.core.cgroups import helpers as cgroup_helpers
from tests.core.cgroups.helpers import Scratch
from tests.core.fakes import FakeLauncher
from tests.core.helpers import GUARD, FakeClock, Recorder, Said
from tests.core.launchers.descriptor_driver import BLOCKER, LIMIT
from tests.core.supervising import TARGET, request, serving

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def box() -> Iterator[Scratch]:
    """A scratch cgroup root, removed with everything in it (tests/core/cgroups/helpers.py)."""
    with cgroup_helpers.scratch() as made:
        yield made


def drive(*args: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.core.launchers.descriptor_driver", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3 * GUARD,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.mark.parametrize("path", ["forkserver", "subprocess"])
def test_a_full_table_holds_a_launch_back_until_a_workload_ends_and_fails_one_only_when_none_runs(
    path: str,
) -> None:
    held, resumed, alone, after = drive("fill", path)
    assert "launches held back: descriptor table full (" in held["held"]
    assert "Too many open files" in held["held"]
    assert held["full"]
    [reason] = [r for r in held["health"] if "descriptor table full" in r]
    assert reason.startswith("launches held back: descriptor table full (")
    assert " open, limit " in reason
    assert "descriptors_full" in held["codes"]
    assert held["dropped"] == OutcomeKind.NOT_STARTED.value  # stopped while held: ended at once, unlaunched
    assert held["launched"] == ["blocker", "warm"]  # not the held one, while the table was full
    assert "launching again: the descriptor table has room" in resumed["again"]
    assert resumed["held_ok"]
    assert resumed["after_blocker"]  # it launched once the running workload had ended
    assert not resumed["full"]
    assert resumed["waits"] == 2
    assert alone["alone_kind"] == OutcomeKind.LAUNCH_FAILED.value
    assert "Too many open files" in alone["alone_reason"]
    assert "and no other workload runs to free one" in alone["alone_reason"]
    assert after["after_ok"]  # and the executor serves on


@pytest.mark.parametrize("path", ["forkserver", "subprocess"])
def test_room_is_made_for_parallelism_and_each_workload_gets_the_limit_back(path: str) -> None:
    made, ran = drive("room", path, "128", "200")
    assert made["before"] == 128
    assert made["after"] == made["needed"] > 128 + 3 * 200
    assert made["enough"]
    assert made["said"] == (
        f"descriptors: soft limit raised from 128 to {made['after']} ({made['needed']} needed; "
        "workloads get 128 back)"
    )
    assert ran["own"][0] == made["after"]
    assert ran["workload"] == [128, ran["own"][1]]


def test_a_hard_limit_below_what_parallelism_needs_is_said_with_the_numbers() -> None:
    [made] = drive("short", "200", "300")
    assert made["after"] == 200
    assert not made["enough"]
    assert made["said"] == (
        f"descriptors: {made['needed']} needed, the hard limit allows 200 (soft limit 200); launches wait "
        f"while the table is full: raise the hard limit (LimitNOFILE= in the systemd unit, ulimit -Hn) to at "
        f"least {made['needed']}"
    )


# ------------------------------------------------------------------ EMFILE at one call of a launch


class Full:
    """``owner.name`` raising EMFILE once :meth:`fill` was called, and doing what it does otherwise."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> None:
        real: Callable[..., Any] = getattr(owner, name)
        self.on = False
        self.failed = 0

        def full(*args: Any, **kwargs: Any) -> Any:
            if self.on:
                self.failed += 1
                raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, full)

    def fill(self) -> None:
        self.on = True

    def unfill(self) -> None:
        self.on = False


async def _held_then_launched(
    recorder: Recorder, supervisor: Supervisor, fill: Callable[[], None], unfill: Callable[[], None]
) -> None:
    """The blocker runs; a launch made once the table is full waits until the blocker ends, then runs."""
    said = Said()
    logger = logging.getLogger("async_local_executor.core.admission")
    logger.addHandler(said)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        supervisor.submit(LaunchRequest(key="blocker", argv=BLOCKER))
        await recorder.until(lambda: ("blocker", "blocking") in recorder.lines)
        fill()
        supervisor.submit(LaunchRequest(key="held", argv=LIMIT))
        await said.until("workload held held back")
        assert supervisor.state().descriptors_full is not None
        assert "held" not in recorder.pids
        supervisor.stop("blocker", "done")
        await recorder.until(lambda: any(o.key == "blocker" for o in recorder.outcomes))
        unfill()  # after the blocker's end: the held one's own retries cannot get ahead of it
        await recorder.until(lambda: any(o.key == "held" for o in recorder.outcomes))
    finally:
        logger.removeHandler(said)
        logger.setLevel(level)
    assert [o.key for o in recorder.outcomes if o.key in ("blocker", "held")] == ["blocker", "held"]
    assert recorder.outcome("held").ok, recorder.outcome("held")
    state = supervisor.state()
    assert state.descriptors_full is None
    assert state.descriptor_waits_total == 1


def _launcher(path: str, recorder: Recorder) -> Launcher:
    if path == "forkserver":
        return ForkServerLauncher(target=TARGET, output=recorder.output)
    return SubprocessLauncher(output=recorder.output)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("path", "owner", "name"),
    [
        ("forkserver", os, "pipe2"),  # its output pipe
        ("forkserver", socket, "socketpair"),  # its control socket
        ("forkserver", os, "pidfd_open"),  # the pidfd it is reaped through
        ("subprocess", os, "pipe2"),  # its stdin and output pipes
        ("subprocess", os, "pidfd_open"),
    ],
)
async def test_emfile_at_each_descriptor_a_launch_opens_holds_it_back(
    monkeypatch: pytest.MonkeyPatch, path: str, owner: object, name: str
) -> None:
    recorder = Recorder()
    full = Full(monkeypatch, owner, name)
    async with serving(recorder, _launcher(path, recorder)) as supervisor:
        await _held_then_launched(recorder, supervisor, full.fill, full.unfill)
    assert full.failed >= 1


@pytest.mark.asyncio
@pytest.mark.skipif(bool(cgroup_helpers.unusable()), reason=cgroup_helpers.unusable())
async def test_emfile_at_a_cgroup_s_files_holds_the_launch_back(
    monkeypatch: pytest.MonkeyPatch, box: Scratch, kind: str
) -> None:
    recorder = Recorder()
    containment: Containment = box.open()
    full = Full(monkeypatch, containment, "create")
    async with serving(recorder, ContainedLauncher(_launcher(kind, recorder), containment)) as supervisor:
        await _held_then_launched(recorder, supervisor, full.fill, full.unfill)
    assert full.failed >= 1


@pytest.mark.asyncio
async def test_a_fork_server_whose_own_table_is_full_holds_the_launch_back() -> None:
    recorder = Recorder()
    launcher = ForkServerLauncher(target=TARGET, output=recorder.output)
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(LaunchRequest(key="warm", argv=LIMIT))
        await recorder.until(lambda: recorder.outcomes)
        helper = launcher.report().pid
        assert helper is not None
        soft, hard = resource.prlimit(helper, resource.RLIMIT_NOFILE)

        def fill() -> None:
            # Its limit at its lowest free descriptor number (the limit bounds the numbers, not how many
            # are open): a request's two descriptors cannot be installed in its table.
            used = {int(fd) for fd in os.listdir(f"/proc/{helper}/fd")}
            lowest = next(n for n in itertools.count() if n not in used)
            resource.prlimit(helper, resource.RLIMIT_NOFILE, (lowest, hard))

        def unfill() -> None:
            resource.prlimit(helper, resource.RLIMIT_NOFILE, (soft, hard))

        await _held_then_launched(recorder, supervisor, fill, unfill)
        assert launcher.report().pid == helper  # the same fork server: it was full, not broken


def test_the_table_reads_what_this_process_holds() -> None:
    table = descriptors.table()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert (table.soft, table.hard) == (soft, hard)
    assert 3 <= table.open <= soft
    with open(os.devnull) as extra:
        assert descriptors.open_count() == table.open + 1
        assert extra.fileno() >= 0


# ------------------------------------------------------------------ holds, counted (fake launcher and clock)

FULL = "cannot create the workload's output pipe: Too many open files"


async def _requested(launcher: FakeLauncher, key: str, times: int) -> None:
    await launcher.until(lambda: sum(1 for r in launcher.requests if r.key == key) >= times)
    await anyio.wait_all_tasks_blocked()  # its hold has begun


@pytest.mark.asyncio
async def test_a_held_launch_that_fails_later_leaves_no_hold_behind() -> None:
    launcher, recorder, clock = FakeLauncher(), Recorder(), FakeClock()
    supervisor = Supervisor(launcher, recorder, limit=None, clock=clock)
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.serve)
        supervisor.submit(request("a"))
        await launcher.until(lambda: "a" in launcher.children)
        launcher.refuse["b"] = DescriptorsFull(FULL)
        supervisor.submit(request("b"))
        await _requested(launcher, "b", 1)
        assert supervisor.state().descriptors_full is not None
        launcher.children["a"].exit(0)  # b tries again, finds the table full with nothing else running
        await recorder.until(lambda: len(recorder.outcomes) == 2)
        failed = recorder.outcome("b")
        assert failed.kind is OutcomeKind.LAUNCH_FAILED
        assert "and no other workload runs to free one" in failed.reason
        assert supervisor.state().descriptors_full is None
        # The next hold begins and ends as any: the count is not left below zero.
        supervisor.submit(request("c"))
        await launcher.until(lambda: "c" in launcher.children)
        launcher.refuse["d"] = DescriptorsFull(FULL)
        supervisor.submit(request("d"))
        await _requested(launcher, "d", 1)
        assert supervisor.state().descriptors_full is not None
        del launcher.refuse["d"]
        launcher.children["c"].exit(0)
        await launcher.until(lambda: "d" in launcher.children)
        assert supervisor.state().descriptors_full is None
        assert supervisor.state().descriptor_waits_total == 2
        launcher.children["d"].exit(0)
        await recorder.until(lambda: len(recorder.outcomes) == 4)
        await supervisor.shutdown(0)


@pytest.mark.asyncio
async def test_a_launch_held_back_when_a_handover_stop_begins_ends_unlaunched() -> None:
    launcher, recorder, clock = FakeLauncher(), Recorder(), FakeClock()
    supervisor = Supervisor(launcher, recorder, limit=None, clock=clock)
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.serve)
        supervisor.submit(request("running"))
        await launcher.until(lambda: "running" in launcher.children)
        launcher.refuse["held"] = DescriptorsFull(FULL)
        supervisor.submit(request("held"))
        await _requested(launcher, "held", 1)
        del launcher.refuse["held"]  # room again: it must still not launch during the stop
        with anyio.fail_after(GUARD):
            handovers = await supervisor.release(grace=0)
    assert [h.key for h in handovers] == ["running"]
    assert {o.key: o.kind for o in recorder.outcomes} == {"held": OutcomeKind.NOT_STARTED}
    assert "held" not in launcher.children


def test_where_a_reserve_is_kept_launches_stop_short_of_a_full_table() -> None:
    tables = [descriptors.Table(59, 64, 64), descriptors.Table(60, 64, 64)]
    admission = Admission(limit=None, descriptor_table=lambda: tables[0], descriptor_reserve=4)
    assert admission.short_of_descriptors() is None  # 5 free
    tables.pop(0)
    short = admission.short_of_descriptors()
    assert isinstance(short, DescriptorsFull)
    assert "the last 4 descriptors are kept for the scheduler itself" in str(short)
    assert Admission(limit=None, descriptor_table=lambda: tables[0]).short_of_descriptors() is None
    assert [descriptors.reserve(n) for n in (48, 1024, 65536)] == [4, 64, 64]


@pytest.mark.asyncio
async def test_a_full_table_in_a_launch_s_preparation_holds_it_back_too() -> None:
    async def join(pid: int) -> None:  # as a cgroup's join or a CPU share's would, opening a file
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    with pytest.raises(DescriptorsFull, match="cannot prepare the workload process"):
        await prepare(LaunchRequest(key="k", argv=["true"], before_start=join), os.getpid())
