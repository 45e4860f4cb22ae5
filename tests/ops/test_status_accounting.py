"""Per-workload accounting in the status file and the status CLI: a contained workload's memory and CPU
from its cgroup, any other's memory from a /proc scan, and the containment line."""

from __future__ import annotations

import dataclasses
import errno
import io
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from rich.console import Console

from async_local_executor.core.admission import MB
from async_local_executor.core.cgroups import WorkloadCgroup
from async_local_executor.core.cgroups.group import Usage
from async_local_executor.core.cgroups.limits import Limits
from async_local_executor.core.health import Health, Report, Verdict
from async_local_executor.core.state import RunningWorkload
from async_local_executor.ops import cli, status
from async_local_executor.ops.status import StatusWriter, document, read_all, status_path
from tests.core.cgroups import helpers as cgroup_helpers
from tests.core.cgroups.helpers import MiB, Scratch, read_line
from tests.core.helpers import py
from tests.states import meta, quiet_report

needs_cgroups = pytest.mark.skipif(bool(cgroup_helpers.unusable()), reason=cgroup_helpers.unusable())

# Touches 64 MiB, burns at least 0.3 s of CPU, says so and waits.
BUSY = """
import sys, time
b = bytearray(64 << 20)
b[::4096] = b'x' * len(range(0, len(b), 4096))
while time.process_time() < 0.3:
    pass
print('ready', flush=True)
sys.stdin.readline()
"""
# BUSY's 64 MiB, then a child forked after them, which maps the same pages copy-on-write: /proc counts
# them once per process, the cgroup once (as a task forked from the fork server shares its pages).
SHARING = BUSY.replace("print('ready'", "import os\nif os.fork() == 0:\n    time.sleep(600)\nprint('ready'")
CONTAINMENT = {"mode": "cgroup2", "detail": "cgroup2 at /sys/fs/cgroup/ale-x (limits: memory via cgroup v1)"}


def report_of(*running: RunningWorkload) -> Report:
    state = dataclasses.replace(quiet_report().state, running=running)
    return Report(time.monotonic(), 0.0, 0.0, Health(Verdict.HEALTHY), state)


def running(pid: int, label: str, cgroup: WorkloadCgroup | None = None) -> RunningWorkload:
    return RunningWorkload(label, pid, time.time(), "default", cgroup)


@pytest.fixture
def box() -> Iterator[Scratch]:
    with cgroup_helpers.scratch() as made:
        yield made


@pytest.fixture
def plain() -> Iterator[subprocess.Popen[str]]:
    """A workload outside any cgroup of ours, holding 64 MiB."""
    with subprocess.Popen(py(BUSY), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as child:
        assert read_line(child) == "ready"
        yield child
        child.kill()


class Unreadable(WorkloadCgroup):
    def usage(self) -> Usage:
        raise OSError(errno.EIO, "I/O error")


def test_a_workload_without_a_cgroup_has_its_memory_from_proc(plain: subprocess.Popen[str]) -> None:
    [row] = document(report_of(running(plain.pid, "plain")), meta("x"))["running"]
    assert row["memory_from"] == "proc"
    assert (row["memory_mb"] or 0) >= 60
    assert (row["peak_mb"], row["cpu_s"]) == (None, None)


@needs_cgroups
def test_a_contained_workload_has_its_memory_and_cpu_from_its_cgroup(
    box: Scratch, plain: subprocess.Popen[str]
) -> None:
    containment = box.open()
    cgroup = containment.create("w1")
    assert cgroup is not None
    child = box.start(BUSY, cgroup)
    assert read_line(child) == "ready"

    data = document(
        report_of(running(child.pid, "contained", cgroup), running(plain.pid, "plain")), meta("x")
    )
    contained, uncontained = data["running"]
    assert contained["memory_from"] == "cgroup"
    assert (contained["cpu_s"] or 0) >= 0.3
    assert uncontained["memory_from"] == "proc"
    assert (uncontained["memory_mb"] or 0) >= 60
    if "memory" not in containment.controllers:
        pytest.skip(f"no memory accounting here ({containment.describe()})")
    assert (contained["memory_mb"] or 0) >= 60
    assert (contained["peak_mb"] or 0) >= (contained["memory_mb"] or 0)


@needs_cgroups
def test_an_adopted_workload_is_accounted_from_its_cgroup_as_before_its_handover(
    box: Scratch, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its cgroup was made by the executor that launched it; the one that adopted it has only its pid.
    launched_by = box.open()
    cgroup = launched_by.create("w1")
    assert cgroup is not None
    child = box.start(SHARING, cgroup)
    assert read_line(child) == "ready"
    [before] = document(report_of(running(child.pid, "t", cgroup)), meta("x"))["running"]
    adopted = RunningWorkload("t", child.pid, time.time(), "default", adopted=True)

    def no_scan(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("scanned /proc")

    with monkeypatch.context() as patched:
        patched.setattr(psutil, "process_iter", no_scan)
        writer = StatusWriter(status_path(tmp_path, "x"), meta("x"))
        writer.write(report_of(adopted))
    [after] = json.loads(writer.path.read_text())["running"]

    assert after["memory_from"] == "cgroup"
    assert after["cpu_s"] >= 0.3
    if "memory" not in launched_by.controllers:
        pytest.skip(f"no memory accounting here ({launched_by.describe()})")
    # What /proc would say: the shared pages twice.
    assert (status.tree_rss([child.pid])[child.pid] or 0) >= 120 * MiB
    assert 60 <= after["memory_mb"] < 100
    assert after["memory_mb"] == pytest.approx(before["memory_mb"], abs=2)
    assert after["peak_mb"] == pytest.approx(before["peak_mb"], abs=2)


@needs_cgroups
def test_no_proc_scan_when_every_workload_has_a_cgroup(box: Scratch, monkeypatch: pytest.MonkeyPatch) -> None:
    cgroup = box.open().create("w1")
    assert cgroup is not None
    child = box.start(BUSY, cgroup)
    assert read_line(child) == "ready"

    def no_scan(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("scanned /proc")

    monkeypatch.setattr(psutil, "process_iter", no_scan)
    [row] = document(report_of(running(child.pid, "contained", cgroup)), meta("x"))["running"]
    assert (row["cpu_s"] or 0) >= 0.3


@needs_cgroups
def test_a_cgroup_that_is_gone_or_unreadable_gives_no_numbers_and_the_file_is_still_written(
    box: Scratch, tmp_path: Path
) -> None:
    removed = box.open().create("gone")
    assert removed is not None
    assert removed.remove()
    unreadable = Unreadable("bad", tmp_path / "nowhere", {}, Limits(), "/nowhere")
    writer = StatusWriter(status_path(tmp_path, "x"), meta("x"))
    # Pids of nothing alive: only the cgroups are read for them.
    writer.write(
        report_of(running(2**22 + 1, "removed", removed), running(2**22 + 2, "unreadable", unreadable))
    )

    rows = json.loads(writer.path.read_text())["running"]
    for row in rows:
        assert row["memory_from"] == "cgroup"
        assert [row[k] for k in ("memory_mb", "peak_mb", "cpu_s")] == [None] * 3


def rendered(directory: Path) -> str:
    out = io.StringIO()
    Console(file=out, width=200).print(cli.render(read_all(directory), directory))
    return out.getvalue()


def test_the_status_table_shows_memory_peak_cpu_and_the_containment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    usages = {4001: Usage(300 * MB, 512 * MB, 12.34), 4002: Usage(None, None, None)}
    monkeypatch.setattr(status, "walk_trees", lambda pids: status.Trees(dict.fromkeys(pids, 5 * MiB), {}))

    class Fixed(WorkloadCgroup):
        def __init__(self, pid: int) -> None:
            super().__init__(f"w{pid}", tmp_path, {}, Limits(), f"/w{pid}")
            self.pid = pid

        def usage(self) -> Usage:
            return usages[self.pid]

    writer = StatusWriter(status_path(tmp_path, "x"), meta("x", containment=CONTAINMENT))
    writer.write(
        report_of(
            running(4001, "fat", Fixed(4001)), running(4002, "blind", Fixed(4002)), running(4003, "plain")
        )
    )
    text = rendered(tmp_path)

    lines = text.splitlines()
    assert lines[1] == f"  containment: {CONTAINMENT['detail']}"
    assert lines[2].split() == [
        "key",
        "pid",
        "queue",
        "age",
        "(s)",
        "memory",
        "(MB)",
        "peak",
        "(MB)",
        "CPU",
        "(s)",
    ]
    rows = {line.split()[0]: line.split() for line in lines[3:]}
    assert rows["fat"][-3:] == ["300.0", "512.0", "12.3"]
    assert rows["blind"][-3:] == ["-", "-", "-"]
    assert rows["plain"][-3:] == ["5.0", "-", "-"]


def test_the_status_table_says_when_nothing_is_contained(tmp_path: Path) -> None:
    path = status_path(tmp_path, "none")
    writer = StatusWriter(
        path, meta("none", containment={"mode": "none", "detail": "none: no cgroup2 mount"})
    )
    writer.write(report_of())

    lines = rendered(tmp_path).splitlines()
    assert "  containment: none: no cgroup2 mount" in lines
