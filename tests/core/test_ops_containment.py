"""An executor's cgroups at start: named after their owner, a dead owner's reclaimed, limits checked."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from async_local_executor.core.cgroups import Limits, Mode
from async_local_executor.ops.containment import (
    LimitsUnavailable,
    instance_name,
    open_containment,
    owner_lives,
    status_of,
)
from tests.core import cgroup_helpers
from tests.core.cgroup_helpers import MiB, Scratch, gone, read_line

cgroups = pytest.mark.skipif(bool(cgroup_helpers.unusable()), reason=cgroup_helpers.unusable())


@pytest.fixture
def box() -> Iterator[Scratch]:
    with cgroup_helpers.scratch() as made:
        yield made


def _dead_pid() -> int:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True
    )
    return int(proc.stdout)


def test_an_instance_is_named_after_the_process_that_owns_it() -> None:
    name = instance_name("0123456789abcdef0123")
    pid, started, instance = name.split("-")
    assert (int(pid), instance) == (os.getpid(), "0123456789ab")
    assert owner_lives(name)
    assert not owner_lives(instance_name("0123456789abcdef", pid=_dead_pid()))
    # Same pid, another start time: a later process under a recycled pid owns nothing of it.
    assert not owner_lives(f"{pid}-{int(started) - 100}-0123456789ab")
    assert owner_lives("someone-else")  # not named by this scheme: never reclaimed


def test_off_makes_no_cgroup_and_refuses_limits() -> None:
    containment = open_containment("a" * 32, enabled=False, root="", limits=Limits())
    assert (containment.mode, containment.why) == (Mode.NONE, "containment = off")
    assert status_of(containment) == {"mode": "none", "detail": "none: containment = off"}
    with pytest.raises(
        LimitsUnavailable, match="task_pids_limit needs a cgroup per task, and there are none here"
    ):
        open_containment("a" * 32, enabled=False, root="", limits=Limits(pids=10))


@cgroups
def test_start_kills_what_a_dead_instance_left_and_says_so(
    box: Scratch, caplog: pytest.LogCaptureFixture
) -> None:
    dead = instance_name("deadbeef", pid=_dead_pid())
    box.instances.append(dead)
    left = box.open(dead).create("w1")
    assert left is not None
    survivor = box.start("print('ready', flush=True)\nimport time\ntime.sleep(600)\n", left)
    assert read_line(survivor) == "ready"

    with caplog.at_level(logging.INFO, logger="async_local_executor.ops.containment"):
        containment = open_containment("c0ffee", enabled=True, root=box.root, limits=Limits())
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
        open_containment("f00d", enabled=True, root=box.root, limits=limits, mountinfo=str(mountinfo))
    box.instances.append(instance_name("f00d"))
    assert not (box.directory / f"ale-{instance_name('f00d')}").exists()  # refused: nothing left made
