"""A workload that starts in a crowd gets a low CPU share until the crowd ends, through both launch paths.

Real children under a real supervisor: the crowd is two holders, the crowded workload starts a
grandchild, and the test reads each process's scheduling class (or its cgroup's CPU weight) from
outside, through the kernel. Mocked: nothing; the unprivileged case runs as ``nobody`` without
capabilities (setpriv), with the RLIMIT_NICE a systemd unit would give it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from async_local_executor.core import cpu_priority
from async_local_executor.core.cgroups import Containment, WorkloadCgroup, cgroup2_mount
from async_local_executor.core.cgroups.discovery import directory_of, mount_root, v1_mounts
from async_local_executor.core.clock import SYSTEM, Clock
from async_local_executor.core.launchers import crowd
from async_local_executor.core.launchers.adopted import AdoptedChild
from async_local_executor.core.launchers.base import (
    Child,
    Launcher,
    LaunchRequest,
    Takeover,
    TakesOver,
    Wrapper,
)
from async_local_executor.core.launchers.contained import ContainedLauncher
from async_local_executor.core.launchers.crowd import Choice, CrowdLauncher, How
from async_local_executor.core.launchers.subprocess import SubprocessLauncher
from async_local_executor.core.proc_identity import start_ticks
from async_local_executor.core.supervisor import Supervisor
from tests.core.cgroups import helpers as cgroup_helpers
from tests.core.cgroups.helpers import Scratch, read_line
from tests.core.helpers import GUARD, FakeClock, Recorder, Said
from tests.core.helpers import payload_py as py
from tests.core.supervising import make_launcher, serving

pytestmark = [pytest.mark.asyncio, pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux only")]

HOLDER = "import os, time\nprint('up', os.getpid(), flush=True)\ntime.sleep(600)\n"
# The crowded one: what it starts after it runs inherits what it was given before.
CROWDED = (
    "import os, subprocess, time\n"
    "child = subprocess.Popen(['sleep', '600'])\n"
    "print('crowded', os.getpid(), child.pid, flush=True)\n"
    "try:\n    time.sleep(600)\nfinally:\n    child.kill()\n"
)


def _pids(recorder: Recorder, word: str) -> list[int]:
    return [int(p) for _, line in recorder.lines if line.startswith(word + " ") for p in line.split()[1:]]


async def _crowd_then_disperse(
    recorder: Recorder, supervisor: Supervisor, check_lowered: object, check_raised: object
) -> None:
    """Two holders (the crowd, at threshold 2), then the crowded one; the holders end one at a time."""
    assert callable(check_lowered)
    assert callable(check_raised)
    for key in ("h1", "h2"):
        supervisor.submit(LaunchRequest(key=key, argv=py(HOLDER)))
    await recorder.until(lambda: len(_pids(recorder, "up")) == 2)
    supervisor.submit(LaunchRequest(key="x", argv=py(CROWDED)))
    await recorder.until(lambda: _pids(recorder, "crowded"))
    workload, grandchild = _pids(recorder, "crowded")
    check_lowered(workload, grandchild, [recorder.pids["h1"], recorder.pids["h2"]])
    supervisor.stop("h1", "test")
    await recorder.until(lambda: len(recorder.outcomes) == 1)
    check_lowered(workload, grandchild, [recorder.pids["h2"]])  # two still run: a crowd at threshold 2
    supervisor.stop("h2", "test")
    # Given back before the crowd's last member's end is reported.
    await recorder.until(lambda: len(recorder.outcomes) == 2)
    check_raised(workload, grandchild)
    supervisor.stop("x", "test")
    await recorder.until(lambda: len(recorder.outcomes) == 3)


async def test_a_crowded_start_leaves_sched_idle_when_the_crowd_ends(kind: str) -> None:
    recorder = Recorder()
    launcher: Launcher = CrowdLauncher(
        make_launcher(kind, recorder), Choice(How.CLASS, "SCHED_IDLE"), crowd=2
    )

    def lowered(workload: int, grandchild: int, holders: list[int]) -> None:
        assert os.sched_getscheduler(workload) == os.SCHED_IDLE
        assert os.sched_getscheduler(grandchild) == os.SCHED_IDLE
        assert {os.sched_getscheduler(h) for h in holders} == {os.SCHED_OTHER}  # started before the crowd

    def raised(workload: int, grandchild: int) -> None:
        assert os.sched_getscheduler(workload) == os.SCHED_OTHER
        assert os.sched_getscheduler(grandchild) == os.SCHED_OTHER

    async with serving(recorder, launcher) as supervisor:
        await _crowd_then_disperse(recorder, supervisor, lowered, raised)
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the scheduler itself is never touched


START_WINDOW = 10.0


def _two_starts_make_a_crowd(kind: str, recorder: Recorder, clock: Clock = SYSTEM) -> CrowdLauncher:
    """A launcher whose crowd of starts is two within :data:`START_WINDOW`, its running crowd out of reach."""
    return CrowdLauncher(
        make_launcher(kind, recorder),
        Choice(How.CLASS, "SCHED_IDLE"),
        crowd=100,
        starts=2,
        window=START_WINDOW,
        clock=clock,
    )


async def test_a_crowd_of_starts_lowers_the_later_starts_until_it_ends(kind: str) -> None:
    """Four starts at once where two within the window make a crowd of starts (and far fewer run than a
    crowd of running ones): two keep the scheduler's class, two start in ``SCHED_IDLE``, with what they
    start, and get ``SCHED_OTHER`` back once the window has passed with no other start (on a clock the
    test moves)."""
    said = Said()
    logger = logging.getLogger("async_local_executor.core.launchers.crowd")
    logger.addHandler(said)
    logger.setLevel(logging.INFO)
    recorder = Recorder()
    clock = FakeClock()
    launcher = _two_starts_make_a_crowd(kind, recorder, clock)
    try:
        async with serving(recorder, launcher) as supervisor:
            for key in ("s1", "s2", "s3", "s4"):
                supervisor.submit(LaunchRequest(key=key, argv=py(CROWDED)))
            await recorder.until(lambda: len(_pids(recorder, "crowded")) == 8)
            workloads = _pids(recorder, "crowded")
            await clock.sleepers(1)  # the crowd's end, parked a window after its starts
            assert launcher.lowered == 2
            classes = [os.sched_getscheduler(pid) for pid in workloads]
            # Each workload and the child it started after it ran share their class.
            assert classes[0::2] == classes[1::2]
            assert sorted(classes[0::2]) == [os.SCHED_OTHER] * 2 + [os.SCHED_IDLE] * 2
            clock.advance(START_WINDOW)
            line = await said.until("got their CPU share back")
            assert "fewer than 2 starting: 2 started in the crowd" in line
            assert launcher.lowered == 0
            assert {os.sched_getscheduler(pid) for pid in workloads} == {os.SCHED_OTHER}
            for key in ("s1", "s2", "s3", "s4"):
                supervisor.stop(key, "test")
            await recorder.until(lambda: len(recorder.outcomes) == 4)
    finally:
        logger.removeHandler(said)


async def test_starts_fewer_than_a_crowd_of_starts_keep_their_class(kind: str) -> None:
    """A start after one other within the window, where two make a crowd of starts: not lowered."""
    recorder = Recorder()
    launcher = _two_starts_make_a_crowd(kind, recorder)
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(LaunchRequest(key="first", argv=py(HOLDER)))
        await recorder.until(lambda: len(_pids(recorder, "up")) == 1)
        supervisor.submit(LaunchRequest(key="second", argv=py(CROWDED)))
        await recorder.until(lambda: _pids(recorder, "crowded"))
        # One start before it within any window: under the two that make a crowd.
        assert launcher.lowered == 0
        assert {os.sched_getscheduler(pid) for pid in _pids(recorder, "crowded")} == {os.SCHED_OTHER}
        for key in ("first", "second"):
            supervisor.stop(key, "test")
        await recorder.until(lambda: len(recorder.outcomes) == 2)


def _cpu_share(pid: int) -> tuple[Path, str]:
    """The cgroup directory that weighs ``pid``'s CPU and its weight (v1 cpu.shares or cgroup2 cpu.weight)."""
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    mounts = v1_mounts()
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(",") and "cpu" in mounts:
            directory = directory_of(mounts["cpu"], mount_root(mounts["cpu"]), path)
            return directory, (directory / "cpu.shares").read_text().strip()
    mount = cgroup2_mount()
    assert mount is not None
    [path] = [line[3:] for line in lines if line.startswith("0::")]
    directory = mount / path.lstrip("/")
    return directory, (directory / "cpu.weight").read_text().strip()


def _weighing(box: Scratch) -> tuple[Containment, bool, Path, str]:
    """The box's containment, skipping where workload cgroups cannot weigh CPU; whether the cpu controller
    is cgroup v1's; and this process's cpu cgroup with its CPU share (where a workload's is back to)."""
    containment: Containment = box.open()
    if not containment.weighs_cpu:
        pytest.skip(f"no cpu controller for workload cgroups here: {containment.describe()}")
    home, default = _cpu_share(os.getpid())
    return containment, containment.controllers["cpu"] != "cgroup2", home, default


@pytest.mark.skipif(bool(cgroup_helpers.unusable()), reason=cgroup_helpers.unusable())
async def test_a_crowded_start_gets_its_cgroup_cpu_weight_back_when_the_crowd_ends(
    box: Scratch, kind: str
) -> None:
    recorder = Recorder()
    containment, v1, home, default = _weighing(box)
    choice = crowd.choose(containment.weighs_cpu)
    assert choice.how is How.CGROUP
    launcher = CrowdLauncher(ContainedLauncher(make_launcher(kind, recorder), containment), choice, crowd=2)

    def lowered(workload: int, grandchild: int, holders: list[int]) -> None:
        where, weight = _cpu_share(workload)
        assert weight == ("2" if v1 else "1")
        assert _cpu_share(grandchild) == (where, weight)
        assert {_cpu_share(h)[1] for h in holders} == {"1024" if v1 else "100"}

    def raised(workload: int, grandchild: int) -> None:
        for pid in (workload, grandchild):
            where, weight = _cpu_share(pid)
            # On v1 they move back beside the other workloads, into the scheduler's own cpu cgroup.
            assert (where, weight) == (home, default) if v1 else weight == "100"

    async with serving(recorder, launcher) as supervisor:
        await _crowd_then_disperse(recorder, supervisor, lowered, raised)


UNPRIVILEGED = """
import os, subprocess, sys
from async_local_executor.core import cpu_priority
problem = cpu_priority.leave_problem()
child = subprocess.Popen(["sleep", "600"])
try:
    cpu_priority.lower(child.pid)
    lowered = os.sched_getscheduler(child.pid) == os.SCHED_IDLE
    try:
        cpu_priority.restore([child.pid])
    except PermissionError:
        pass
    print(problem, lowered, os.sched_getscheduler(child.pid) == os.SCHED_OTHER, sep="|", flush=True)
finally:
    child.kill()
    child.wait()
"""


def _as_nobody(nice_limit: int | None, *caps: str) -> list[str]:
    src = Path(crowd.__file__).resolve().parents[3]
    limit = ["prlimit", f"--nice={nice_limit}:{nice_limit}", "--"] if nice_limit is not None else []
    keep = ",".join(f"+{cap}" for cap in caps) or "-all"
    done = subprocess.run(
        [
            *limit,
            *("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"),
            *(f"--inh-caps={keep}", *([f"--ambient-caps={keep}"] if caps else [])),
            *(sys.executable, "-c", UNPRIVILEGED),
        ],
        env={"PYTHONPATH": str(src), "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split("|")


def _can_raise_nice_limit() -> bool:
    # Raising a hard limit takes CAP_SYS_RESOURCE, which a container may not grant even to root.
    return (
        subprocess.run(["prlimit", "--nice=20:20", "true"], capture_output=True, check=False).returncode == 0
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become nobody")
async def test_a_scheduler_of_another_user_lowers_only_what_it_can_raise_again() -> None:
    # systemd's defaults for a service user (no capability, LimitNICE 0): idle could not be left; the
    # start line names the limit and how to allow it.
    problem, lowered, restored = _as_nobody(None)
    assert "RLIMIT_NICE" in problem
    assert "LimitNICE=20" in problem
    assert (lowered, restored) == ("True", "False")
    # AmbientCapabilities=CAP_SYS_NICE: it can.
    assert _as_nobody(None, "sys_nice") == ["None", "True", "True"]
    assert crowd.choose(False).how is How.CLASS  # this test runs as root: CAP_SYS_NICE


@pytest.mark.skipif(
    not _can_raise_nice_limit(), reason="this host cannot raise RLIMIT_NICE (no CAP_SYS_RESOURCE)"
)
async def test_a_nice_limit_lets_a_scheduler_without_capabilities_raise_it_again() -> None:
    # LimitNICE=20: the workload's own limit is what lets it, and its scheduler, leave idle.
    assert _as_nobody(20) == ["None", "True", "True"]


# ------------------------------------------------------------------------------------------------
# A crowd that ends while a crowded start is still being launched still gives that start its share back.
#
# The crowd gives back the shares it lowered when fewer than its threshold run; a start it lowered is on
# that list only once its launch has returned. Real children under a real supervisor, on both launch
# paths; the crowded start's launch is held (a slow fork server, say) until the crowd has ended. Mocked:
# nothing.


class Held(Wrapper):
    """Holds the launch of ``key`` until :attr:`go` is set."""

    def __init__(self, inner: Launcher, key: str) -> None:
        super().__init__(inner)
        self.key = key
        self.waiting = anyio.Event()
        self.go = anyio.Event()

    async def launch(self, request: LaunchRequest) -> Child:
        if request.key == self.key:
            self.waiting.set()
            await self.go.wait()
        return await self._inner.launch(request)


async def test_a_start_the_crowd_lowered_gets_its_share_back_when_the_crowd_ended_during_its_launch(
    kind: str,
) -> None:
    recorder = Recorder()
    held = Held(make_launcher(kind, recorder), "x")
    launcher = CrowdLauncher(held, Choice(How.CLASS, "SCHED_IDLE"), crowd=2)
    async with serving(recorder, launcher) as supervisor:
        for key in ("h1", "h2"):
            supervisor.submit(LaunchRequest(key=key, argv=py(HOLDER)))
        await recorder.until(lambda: len(_pids(recorder, "up")) == 2)
        supervisor.submit(LaunchRequest(key="x", argv=py(CROWDED)))  # two run: crowded
        with anyio.fail_after(10):
            await held.waiting.wait()
        for key in ("h1", "h2"):
            supervisor.stop(key, "test")
        await recorder.until(lambda: len(recorder.outcomes) == 2)  # the crowd has ended
        held.go.set()
        await recorder.until(lambda: _pids(recorder, "crowded"))
        workload, grandchild = _pids(recorder, "crowded")
        # Lowered as it started, and given back as its launch returned: the crowd had ended meanwhile.
        assert [os.sched_getscheduler(pid) for pid in (workload, grandchild)] == [os.SCHED_OTHER] * 2
        supervisor.stop("x", "test")
        await recorder.until(lambda: len(recorder.outcomes) == 3)


# ------------------------------------------------------------------------------------------------
# A workload handed over leaves with the CPU share it had before its crowd lowered it (core/launchers/crowd.py).
#
# A release (a stopping executor letting its running workloads go alive, for the next scheduler to adopt)
# undoes what the executor did to a workload from outside: the successor cannot tell a lowering of the old
# crowd from one of its own, and would otherwise leave the workload at the lowest share to its end. Real
# children under a real supervisor, on both launch paths and both means (the process class, the cgroup's
# CPU weight), read through the kernel once ``Supervisor.release()`` has returned. Mocked: nothing.

Check = Callable[[list[int]], None]
CROWDED_KEYS = ("x1", "x2")


async def _crowd_handed_over(launcher: Launcher, recorder: Recorder, lowered: Check) -> list[int]:
    """A holder (the crowd, at threshold 1), then two crowded ones; all three handed over alive.

    With three running and a threshold of 1, the crowd lasts while the first two of them are let go,
    whichever they are: at least one crowded one is let go while the crowd is still on.

    :returns: the crowded workloads' pids and their children's, once the release has returned
    """
    supervisor = Supervisor(launcher, recorder, limit=None)
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.serve)
        try:
            supervisor.submit(LaunchRequest(key="h", argv=py(HOLDER)))
            await recorder.until(lambda: _pids(recorder, "up"))
            for key in CROWDED_KEYS:
                supervisor.submit(LaunchRequest(key=key, argv=py(CROWDED)))
            await recorder.until(lambda: len(_pids(recorder, "crowded")) == 4)
            crowded = _pids(recorder, "crowded")
            lowered(crowded)  # what the crowd did, for the release to undo
            with anyio.fail_after(GUARD):
                handovers = await supervisor.release(grace=0)
        except BaseException:
            with anyio.fail_after(GUARD):
                await supervisor.shutdown(wait=0)
            raise
    assert {h.key for h in handovers} == {"h", *CROWDED_KEYS}
    assert recorder.outcomes == []  # handed over, not ended
    return crowded


def _end(recorder: Recorder) -> None:
    """Kill and reap the workloads handed over (ours to reap: the supervisor's children)."""
    for pid in [recorder.pids[key] for key in ("h", *CROWDED_KEYS) if key in recorder.pids]:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)  # a crowded one's child is in its group
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


async def _handed_over_leaves_sched_idle(launcher: Launcher, recorder: Recorder) -> None:
    """The crowded ones are in ``SCHED_IDLE`` before the release, in ``SCHED_OTHER`` once it has ended."""

    def lowered(crowded: list[int]) -> None:
        assert [os.sched_getscheduler(pid) for pid in crowded] == [os.SCHED_IDLE] * 4

    try:
        crowded = await _crowd_handed_over(launcher, recorder, lowered)
        assert [os.sched_getscheduler(pid) for pid in crowded] == [os.SCHED_OTHER] * 4
    finally:
        _end(recorder)


async def test_a_crowded_workload_handed_over_leaves_sched_idle_first(kind: str) -> None:
    recorder = Recorder()
    launcher = CrowdLauncher(make_launcher(kind, recorder), Choice(How.CLASS, "SCHED_IDLE"), crowd=1)
    await _handed_over_leaves_sched_idle(launcher, recorder)


async def test_a_workload_a_crowd_of_starts_lowered_leaves_sched_idle_when_handed_over(kind: str) -> None:
    """A restart meets a crowd of starts: handed over while its window has not passed (the test's clock
    stands still), the lowered one gets its class back before the release ends, as in a running crowd."""
    recorder = Recorder()
    launcher = CrowdLauncher(
        make_launcher(kind, recorder),
        Choice(How.CLASS, "SCHED_IDLE"),
        crowd=100,
        starts=1,
        window=START_WINDOW,
        clock=FakeClock(),
    )
    await _handed_over_leaves_sched_idle(launcher, recorder)


@pytest.mark.skipif(bool(cgroup_helpers.unusable()), reason=cgroup_helpers.unusable())
async def test_a_crowded_contained_workload_handed_over_gets_its_cgroup_cpu_weight_back_first(
    box: Scratch, kind: str
) -> None:
    recorder = Recorder()
    containment, v1, home, default = _weighing(box)
    choice = crowd.choose(containment.weighs_cpu)
    launcher = CrowdLauncher(ContainedLauncher(make_launcher(kind, recorder), containment), choice, crowd=1)

    def lowered(crowded: list[int]) -> None:
        assert {_cpu_share(pid)[1] for pid in crowded} == {"2" if v1 else "1"}

    try:
        for pid in await _crowd_handed_over(launcher, recorder, lowered):
            where, weight = _cpu_share(pid)
            # On v1 they move back beside the other workloads, into the scheduler's own cpu cgroup.
            assert (where, weight) == (home, default) if v1 else weight == "100"
    finally:
        _end(recorder)


# ------------------------------------------------------------------------------------------------
# Adopted workloads and the crowd's CPU share (core/launchers/crowd.py, a request's ``takeover``).
#
# An adopted workload competes for the CPU as any that runs: it counts in the crowd a start is measured
# against. One that arrives still lowered (left by a crash, which cannot undo anything) gets its share
# back when the successor takes it, unless the successor's own crowd is on then: it stays lowered until
# that crowd ends.
#
# Real processes: each predecessor's workload is started by the test in a session of its own and, where
# it arrived lowered, put in ``SCHED_IDLE`` (or its cgroup weighed down) before it starts its child, as a
# predecessor's crowd does; then it is taken as a successor takes it (:class:`AdoptedChild`). Each runs
# until the test closes its stdin. Mocked: nothing.

CLASS = Choice(How.CLASS, "SCHED_IDLE")
# A predecessor's workload: told to go once its share is set, it starts a child (which inherits the
# class), says both pids, and runs until its stdin closes.
WORKLOAD = (
    "import os, subprocess, sys\n"
    "sys.stdin.readline()\n"
    "child = subprocess.Popen(['sleep', '600'])\n"
    "print(os.getpid(), child.pid, flush=True)\n"
    "try:\n    sys.stdin.read()\nfinally:\n    child.kill()\n    child.wait()\n"
)


@dataclass
class Running:
    """A predecessor's workload process, and the pids it said: its own and its child's."""

    proc: subprocess.Popen[str]
    pids: list[int]

    def classes(self) -> list[int]:
        return [os.sched_getscheduler(pid) for pid in self.pids]


class Predecessor:
    """Workload processes a stopped executor left running, each the leader of its own session."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, *, lowered: bool = False, cgroup: WorkloadCgroup | None = None) -> Running:
        """One workload, in ``SCHED_IDLE`` (``lowered``) and ``cgroup`` before it starts anything."""
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKLOAD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.procs.append(proc)
        if cgroup is not None:
            cgroup.join(proc.pid)
        if lowered:
            cpu_priority.lower(proc.pid)
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        return Running(proc, [int(pid) for pid in read_line(proc).split()])

    def end(self, running: Running) -> None:
        assert running.proc.stdin is not None
        running.proc.stdin.close()

    def cleanup(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its child too
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()


@pytest.fixture
def predecessor() -> Iterator[Predecessor]:
    made = Predecessor()
    try:
        yield made
    finally:
        made.cleanup()


IDLE, OTHER = [os.SCHED_IDLE] * 2, [os.SCHED_OTHER] * 2


async def take(launcher: Launcher, running: Running, cgroup_dir: Path | None = None) -> Child:
    """Taken over as a successor's supervisor takes an adopted workload: through its launch path, whose
    innermost wrapper (:class:`TakesOver`) takes the process."""
    start = start_ticks(running.proc.pid)
    assert start is not None
    take = functools.partial(AdoptedChild.take, running.proc.pid, start, lambda: 0)
    takeover = Takeover(take, 0.0, None if cgroup_dir is None else str(cgroup_dir))
    with anyio.fail_after(GUARD):
        return await launcher.launch(LaunchRequest("adopted", ("adopted",), takeover=takeover))


def plain() -> Launcher:
    return TakesOver(SubprocessLauncher(output=Recorder().output))


@asynccontextmanager
async def crowd_of(threshold: int, inner: Launcher | None = None) -> AsyncIterator[CrowdLauncher]:
    launcher = CrowdLauncher(inner or plain(), CLASS, crowd=threshold)
    async with launcher:
        yield launcher


async def ended(child: Child) -> None:
    with anyio.fail_after(GUARD):
        assert await child.wait() == 0


async def test_one_that_arrives_in_sched_idle_outside_a_crowd_leaves_it_when_taken(
    predecessor: Predecessor,
) -> None:
    running = predecessor.start(lowered=True)
    assert running.classes() == IDLE
    async with crowd_of(2) as launcher:
        child = await take(launcher, running)
        assert running.classes() == OTHER
        predecessor.end(running)
        await ended(child)


async def test_one_that_arrives_in_sched_idle_in_a_crowd_keeps_it_until_the_crowd_ends(
    predecessor: Predecessor,
) -> None:
    first, second = predecessor.start(), predecessor.start()
    late = predecessor.start(lowered=True)
    assert late.classes() == IDLE
    async with crowd_of(2) as launcher:
        children = [await take(launcher, proc) for proc in (first, second)]
        lowered = await take(launcher, late)  # two adopted run: a crowd at threshold 2
        assert (first.classes(), second.classes(), late.classes()) == (OTHER, OTHER, IDLE)
        predecessor.end(first)
        await ended(children[0])
        assert late.classes() == IDLE  # two still run
        predecessor.end(second)
        await ended(children[1])
        assert late.classes() == OTHER  # the crowd ended
        predecessor.end(late)
        await ended(lowered)


async def test_adopted_workloads_count_in_the_crowd_a_start_is_measured_against(
    predecessor: Predecessor, kind: str
) -> None:
    recorder = Recorder()
    adopted = [predecessor.start(), predecessor.start()]
    statuses: list[int] = []
    async with crowd_of(2, TakesOver(make_launcher(kind, recorder))) as launcher:
        children = [await take(launcher, running) for running in adopted]
        started = await launcher.launch(LaunchRequest(key="x", argv=py(CROWDED)))

        async def reap() -> None:  # its wait() is what reads its output
            statuses.append(await started.wait())

        try:
            with anyio.fail_after(GUARD):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(reap)
                    await recorder.until(lambda: _pids(recorder, "crowded"))
                    workload, grandchild = _pids(recorder, "crowded")
                    assert workload == started.pid
                    # Started while two adopted ones ran: crowded.
                    assert [os.sched_getscheduler(pid) for pid in (workload, grandchild)] == IDLE
                    for running, child in zip(adopted, children, strict=True):
                        predecessor.end(running)
                        await ended(child)
                    # Fewer than two run: the crowd of adopted ones ended, and the start gets its share back.
                    assert [os.sched_getscheduler(pid) for pid in (workload, grandchild)] == OTHER
                    started.signal(signal.SIGKILL)
        finally:
            started.signal(signal.SIGKILL)  # a failed test leaves nothing running either
    assert statuses == [-signal.SIGKILL]


@pytest.mark.skipif(bool(cgroup_helpers.unusable()), reason=cgroup_helpers.unusable())
async def test_one_whose_cgroup_arrives_weighed_down_gets_its_cpu_weight_back_when_taken(
    box: Scratch, predecessor: Predecessor
) -> None:
    containment, v1, home, default = _weighing(box)
    cgroup = containment.create("w1", low_cpu=True)  # as a predecessor's crowd made it
    assert cgroup is not None
    running = predecessor.start(cgroup=cgroup)
    assert {_cpu_share(pid)[1] for pid in running.pids} == {"2" if v1 else "1"}
    async with crowd_of(2, ContainedLauncher(plain(), containment)) as launcher:
        child = await take(launcher, running, cgroup.path)
        for pid in running.pids:
            where, weight = _cpu_share(pid)
            # On v1 they move back beside the other workloads, into the scheduler's own cpu cgroup.
            assert (where, weight) == (home, default) if v1 else weight == "100"
        child.release()  # the box's cleanup ends it: its cgroup goes with the box


async def test_with_the_crowd_off_one_that_arrives_in_sched_idle_still_gets_its_share_back(
    predecessor: Predecessor,
) -> None:
    # workload_cpu_priority = normal (or a nice value) after a predecessor ran with auto: the wiring still
    # puts a crowd that lowers nothing in the launch path, for this (core/wiring.py).
    running = predecessor.start(lowered=True)
    launcher = CrowdLauncher(plain(), Choice(How.NONE, "off"), crowd=0)
    async with launcher:
        child = await take(launcher, running)
        assert running.classes() == OTHER
        predecessor.end(running)
        await ended(child)
