"""An instance's cgroups on this host: limits enforced by the kernel, what cannot be had, dead instances reclaimed."""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from async_local_executor.core.cgroups import (
    Containment,
    ContainmentError,
    Limits,
    LimitUnavailable,
    Mode,
    Reclaimed,
    cgroup2_mount,
    workload_cgroup_of,
)
from tests.core.cgroups import helpers as cgroup_helpers
from tests.core.cgroups.helpers import MiB, Scratch, gone, read_line
from tests.core.helpers import GUARD

pytestmark = pytest.mark.skipif(bool(cgroup_helpers.unusable()), reason=cgroup_helpers.unusable())

# Bounded, so that a limit the kernel did not apply cannot turn the test into a fork bomb.
FORKER = """
import errno, os
r, w = os.pipe()
forks, failure = 0, "none"
while forks < 20:
    try:
        pid = os.fork()
    except OSError as exc:
        failure = errno.errorcode[exc.errno]
        break
    if pid == 0:
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    forks += 1
os.close(w)
for _ in range(forks):
    os.wait()
print(forks, failure, flush=True)
"""
SLEEPER = "import time\nprint('ready', flush=True)\ntime.sleep(600)\n"


@pytest.fixture
def box() -> Iterator[Scratch]:
    with cgroup_helpers.scratch() as made:
        yield made


def needs(containment: Containment, controller: str) -> None:
    if controller not in containment.controllers:
        pytest.skip(f"no {controller} controller for limits here ({containment.describe()})")


def test_open_on_this_host(box: Scratch) -> None:
    containment = box.open()
    assert containment.mode is Mode.CGROUP2
    assert containment.path == box.directory / f"ale-{containment.instance}"
    assert containment.why == str(containment.path)
    assert containment.path.is_dir()
    limits = ", ".join(f"{name} via {where}" for name, where in containment.controllers.items())
    assert containment.describe() == f"cgroup2 at {containment.path} (limits: {limits or 'none available'})"
    if cgroup_helpers.v1_usable("memory") and containment.controllers.get("memory") != "cgroup2":
        assert containment.controllers["memory"] == "cgroup v1"


def test_memory_limit_kills_only_the_workload_over_it(box: Scratch) -> None:
    containment = box.open()
    needs(containment, "memory")
    hog = containment.create("hog", Limits(memory=32 * MiB))
    neighbour = containment.create("neighbour")
    assert hog is not None
    assert neighbour is not None
    if containment.controllers["memory"] == "cgroup v1":
        written = (hog.v1["memory"] / "memory.limit_in_bytes").read_text()
        assert int(written) == 32 * MiB, "memory.limit_in_bytes cannot be set on this host"
    over = box.start("x = b'x' * (200 << 20)\nprint('survived', flush=True)\n", hog)
    under = box.start("x = b'x' * (64 << 20)\nprint('fine', flush=True)\n", neighbour)
    assert over.wait(GUARD) == -signal.SIGKILL
    assert hog.oom_kills() >= 1
    assert read_line(under) == "fine"
    assert under.wait(GUARD) == 0
    assert neighbour.oom_kills() == 0


def test_pids_limit_fails_the_fork_past_it(box: Scratch) -> None:
    containment = box.open()
    needs(containment, "pids")
    cgroup = containment.create("w", Limits(pids=5))
    assert cgroup is not None
    child = box.start(FORKER, cgroup)
    # The child is one of the five: four forks succeed, the next fails inside the child.
    assert read_line(child) == "4 EAGAIN"
    assert child.wait(GUARD) == 0


def test_cpu_limit_is_written(box: Scratch) -> None:
    containment = box.open()
    needs(containment, "cpu")
    cgroup = containment.create("w", Limits(cpu=0.5))
    assert cgroup is not None
    if containment.controllers["cpu"] == "cgroup2":
        assert (cgroup.path / "cpu.max").read_text().split() == ["50000", "100000"]
    else:
        assert (cgroup.v1["cpu"] / "cpu.cfs_quota_us").read_text().strip() == "50000"
        assert (cgroup.v1["cpu"] / "cpu.cfs_period_us").read_text().strip() == "100000"


def test_create_failing_half_way_leaves_nothing(box: Scratch) -> None:
    containment = box.open()
    needs(containment, "pids")
    assert containment.path is not None
    with pytest.raises(OSError, match="Invalid argument"):
        containment.create("w", Limits(pids=10**9))  # beyond what the kernel accepts
    assert not (containment.path / "w").exists()
    assert not any((parent / "w").exists() for parent in containment._v1.values())
    first = containment.create("w")
    assert first is not None
    with pytest.raises(FileExistsError):
        containment.create("w")
    assert first.path.is_dir()
    with pytest.raises(ValueError, match="workload name"):
        containment.create("a/b")
    with pytest.raises(ValueError, match="instance name"):
        Containment.open("no spaces", root=box.root)


def test_a_limit_without_its_controller(box: Scratch, tmp_path: Path) -> None:
    # Only the cgroup2 mount is listed: whatever v1 offers here is out of sight.
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("\n".join(line for line in lines if " - cgroup2 " in line) + "\n")
    containment = box.open(mountinfo=str(mountinfo))
    assert containment.mode is Mode.CGROUP2
    assert "cgroup v1" not in containment.controllers.values()
    missing = [name for name in ("memory", "cpu", "pids") if name not in containment.controllers]
    if not missing:
        pytest.skip("cgroup2 gives every controller here")
    assert containment.path is not None
    limit = {"memory": Limits(memory=64 * MiB), "cpu": Limits(cpu=1), "pids": Limits(pids=10)}[missing[0]]
    with pytest.raises(LimitUnavailable, match=f"{missing[0]} limit needs the {missing[0]} controller"):
        containment.create("w", limit)
    assert not (containment.path / "w").exists()
    assert containment.create("plain") is not None


def test_no_cgroup2_mount(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n")
    containment = Containment.open("x", mountinfo=str(mountinfo))
    assert containment.mode is Mode.NONE
    assert containment.why == f"no cgroup2 mount in {mountinfo}"
    assert containment.describe() == f"none: no cgroup2 mount in {mountinfo}"
    assert containment.path is None
    assert containment.create("w", Limits(memory=MiB)) is None
    assert containment.reclaim(lambda instance: False) == []
    containment.close()
    with pytest.raises(ContainmentError, match="no cgroup2 mount"):
        Containment.open("x", root="/airflow", mountinfo=str(mountinfo))


def test_a_configured_root_that_cannot_be_used(box: Scratch) -> None:
    box.open()  # makes the scratch root, which holds regular files such as cgroup.procs
    with pytest.raises(
        ContainmentError, match=r"^cgroup_root .*/cgroup.procs/x: .*/cgroup.procs is not a directory$"
    ):
        box.open(root=f"{box.root}/cgroup.procs/x")
    with pytest.raises(ContainmentError, match="must be a cgroup path below the mount"):
        box.open(root=f"{box.root}/../elsewhere")


UNPRIVILEGED = """
import json, os, sys
from async_local_executor.core.cgroups import Containment, ContainmentError
os.setgid(65534)
os.setuid(65534)
found = {}
c = Containment.open(sys.argv[1])
found["mode"], found["why"] = c.mode.value, c.why
try:
    Containment.open(sys.argv[1], root=sys.argv[2])
except ContainmentError as exc:
    found["error"] = str(exc)
print(json.dumps(found))
"""


def test_without_permission(box: Scratch) -> None:
    box.open()
    instance = box.name("nobody")
    mount = cgroup2_mount()
    assert mount is not None
    try:
        out = subprocess.run(
            [sys.executable, "-c", UNPRIVILEGED, instance, box.root],
            check=False,
            capture_output=True,
            text=True,
            timeout=GUARD,
        )
        assert out.returncode == 0, out.stderr
        found = json.loads(out.stdout)
    finally:
        with contextlib.suppress(FileNotFoundError):
            (mount / f"ale-{instance}").rmdir()  # had the kernel let it through
    assert found["mode"] == "none"
    assert found["why"].endswith(
        ": Permission denied (delegate the scheduler's cgroup, for example systemd Delegate=yes, or set cgroup_root)"
    )
    assert found["why"].startswith("cannot create ")
    assert found["error"].startswith(f"cgroup_root {box.root}: cannot create ")


def test_reclaim_kills_and_removes_only_dead_instances(box: Scratch) -> None:
    dead, live, own = box.open(box.name("dead")), box.open(box.name("live")), box.open(box.name("own"))
    procs, cgroups = {}, {}
    for containment in (dead, live, own):
        cgroup = containment.create("busy")
        assert cgroup is not None
        assert containment.create("idle") is not None
        procs[containment.instance] = box.start(SLEEPER, cgroup)
        cgroups[containment.instance] = cgroup
        assert read_line(procs[containment.instance]) == "ready"
    dead_dirs = [dead.path, *dead._v1.values()]

    # Claimed dead, this instance too: its own cgroups are never touched. Any other instance is live.
    reclaimed = own.reclaim(lambda instance: instance not in (dead.instance, own.instance))

    assert reclaimed == [Reclaimed(dead.instance, "busy", 1)]
    assert procs[dead.instance].wait(GUARD) == -signal.SIGKILL
    assert not any(directory is not None and directory.exists() for directory in dead_dirs)
    for survivor in (live, own):
        assert not gone(procs[survivor.instance].pid)
        assert cgroups[survivor.instance].members() == [procs[survivor.instance].pid]
        assert survivor.path is not None
        assert (survivor.path / "idle").is_dir()
        assert all(directory.is_dir() for directory in survivor._v1.values())


@pytest.mark.parametrize("named_by", ["directory", "cgroup path", "a cgroup below it"])
def test_reclaim_spares_the_cgroups_handed_over_and_their_instances_directories(
    box: Scratch, named_by: str
) -> None:
    holding, other, own = box.open(box.name("dead")), box.open(box.name("dead")), box.open(box.name("own"))
    held, busy = holding.create("held", low_cpu=True), holding.create("busy")
    elsewhere = other.create("held")  # the same name in another dead instance: not spared
    assert held is not None
    assert busy is not None
    assert elsewhere is not None
    procs = {cgroup.path: box.start(SLEEPER, cgroup) for cgroup in (held, busy, elsewhere)}
    assert all(read_line(proc) == "ready" for proc in procs.values())
    spare = {
        "directory": str(held.path),
        "cgroup path": held.relative,
        "a cgroup below it": f"{held.relative}/inner",
    }[named_by]

    reclaimed = own.reclaim(lambda instance: instance == own.instance, spare={spare})

    assert sorted(reclaimed, key=lambda found: found.instance) == sorted(
        [Reclaimed(holding.instance, "busy", 1), Reclaimed(other.instance, "held", 1)],
        key=lambda found: found.instance,
    )
    assert procs[busy.path].wait(GUARD) == -signal.SIGKILL
    assert procs[elsewhere.path].wait(GUARD) == -signal.SIGKILL
    assert not gone(procs[held.path].pid)
    assert held.members() == [procs[held.path].pid]
    # The held workload keeps its directories in every hierarchy, and its instance's; the rest goes.
    assert all(directory.is_dir() for directory in [held.path, *held.v1.values()])
    assert not busy.path.exists()
    assert not any(directory.exists() for directory in busy.v1.values())
    assert other.path is not None
    assert not other.path.exists()
    assert not any(directory.exists() for directory in other._v1.values())


def test_close_removes_what_is_empty_and_never_raises(box: Scratch) -> None:
    containment = box.open()
    assert containment.path is not None
    busy, idle = containment.create("busy"), containment.create("idle")
    assert busy is not None
    assert idle is not None
    child = box.start(SLEEPER, busy)
    assert read_line(child) == "ready"
    containment.close()
    assert not idle.path.exists()
    assert busy.path.is_dir()
    assert containment.path.is_dir()  # kept: a workload is still running in it
    busy.kill()
    assert busy.wait_empty(GUARD)
    containment.close()
    assert not containment.path.exists()
    assert not any(directory.exists() for directory in [*busy.v1.values(), *containment._v1.values()])


def test_no_controller_is_enabled_in_a_parent_that_holds_processes(
    box: Scratch, caplog: pytest.LogCaptureFixture
) -> None:
    # As a scheduler under systemd's Delegate=yes alone, sitting in the service's cgroup itself: enabling
    # cpu or pids there would make it a threaded domain, and no workload could join a cgroup below it.
    parent = box.directory / "service"
    parent.mkdir(parents=True)
    scheduler = box.start("print('ready', flush=True)\nimport time\ntime.sleep(600)\n")
    (parent / "cgroup.procs").write_text(str(scheduler.pid))
    with caplog.at_level(logging.DEBUG, logger="async_local_executor.core.cgroups.discovery"):
        containment = box.open(root=f"{box.root}/service")
    assert f"not enabling controllers in {parent}: it holds processes" in caplog.text
    assert (parent / "cgroup.subtree_control").read_text().split() == []
    assert (parent / "cgroup.type").read_text().strip() == "domain"
    workload = containment.create("w")
    assert workload is not None
    joined = box.start("print(open('/proc/self/cgroup').read().splitlines()[-1], flush=True)\n", workload)
    assert read_line(joined).endswith(f"/service/ale-{containment.instance}/w")


def test_the_workload_cgroup_of_a_process_is_found_from_where_it_is(box: Scratch) -> None:
    # As an executor that adopts a workload finds the cgroup its predecessor made for it.
    made = box.open().create("w1")
    assert made is not None
    inside, outside = box.start(SLEEPER, made), box.start(SLEEPER)
    assert read_line(inside) == read_line(outside) == "ready"
    found = workload_cgroup_of(inside.pid)
    assert found is not None
    assert (found.name, found.path, found.relative, dict(found.v1)) == (
        made.name,
        made.path,
        made.relative,
        dict(made.v1),
    )
    # In the scheduler's own cgroup (an uncontained workload): that cgroup is not the workload's alone.
    assert workload_cgroup_of(outside.pid) is None
    outside.kill()
    outside.wait(GUARD)
    assert workload_cgroup_of(outside.pid) is None
