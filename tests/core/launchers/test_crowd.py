"""A workload that starts in a crowd gets a low CPU share until the crowd ends, through both launch paths.

Real children under a real supervisor: the crowd is two holders, the crowded workload starts a
grandchild, and the test reads each process's scheduling class (or its cgroup's CPU weight) from
outside, through the kernel. Mocked: nothing; the unprivileged case runs as ``nobody`` without
capabilities (setpriv), with the RLIMIT_NICE a systemd unit would give it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from async_local_executor.core.cgroups import Containment, cgroup2_mount
from async_local_executor.core.cgroups.discovery import directory_of, mount_root, v1_mounts
from async_local_executor.core.launchers import crowd
from async_local_executor.core.launchers.base import Launcher, LaunchRequest
from async_local_executor.core.launchers.contained import ContainedLauncher
from async_local_executor.core.launchers.crowd import Choice, CrowdLauncher, How
from async_local_executor.core.supervisor import Supervisor
from tests.core.cgroups import helpers as cgroup_helpers
from tests.core.cgroups.helpers import Scratch
from tests.core.helpers import Recorder
from tests.core.helpers import payload_py as py
from tests.core.test_supervisor import make_launcher, serving

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


@pytest.mark.skipif(bool(cgroup_helpers.unusable()), reason=cgroup_helpers.unusable())
async def test_a_crowded_start_gets_its_cgroup_cpu_weight_back_when_the_crowd_ends(
    box: Scratch, kind: str
) -> None:
    recorder = Recorder()
    containment: Containment = box.open()
    if not containment.weighs_cpu:
        pytest.skip(f"no cpu controller for workload cgroups here: {containment.describe()}")
    choice = crowd.choose(containment.weighs_cpu)
    assert choice.how is How.CGROUP
    launcher = CrowdLauncher(ContainedLauncher(make_launcher(kind, recorder), containment), choice, crowd=2)
    v1 = containment.controllers["cpu"] != "cgroup2"
    home, default = _cpu_share(os.getpid())

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
