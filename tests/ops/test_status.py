"""The status writer (``status.py``): its file names its writer's start time, is written whole across short
writes and through no link planted beside it; and the walk of each workload's process tree. The
per-workload accounting is test_status_accounting.py's, the reading of the files test_status_read.py's.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from async_local_executor.core.proc_identity import start_ticks
from async_local_executor.ops.status import START_TICKS_KEY, StatusWriter, status_path, walk_trees
from tests.processes import SLEEP, read_line
from tests.states import meta
from tests.states import quiet_report as report


def write(directory: Path, instance: str, **fields: Any) -> Path:
    writer = StatusWriter(status_path(directory, instance), meta(instance, **fields))
    writer.write(report())
    return writer.path


def test_the_writer_records_its_process_start_time(tmp_path: Path) -> None:
    data = json.loads(write(tmp_path, "me").read_text())
    assert data["pid"] == os.getpid()
    assert data[START_TICKS_KEY] == start_ticks(os.getpid())
    assert "pid_start" not in data


def test_a_status_file_is_written_whole_across_short_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.write
    calls: list[int] = []

    def short(fd: int, data: bytes | memoryview) -> int:
        calls.append(fd)
        return real(fd, bytes(data[:7]))

    monkeypatch.setattr(os, "write", short)
    path = write(tmp_path, "short", parallelism=3)
    monkeypatch.undo()

    assert len(calls) > 10
    data = json.loads(path.read_text())
    assert (data["instance"], data["parallelism"]) == ("short", 3)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_the_status_writer_follows_no_link_planted_beside_its_file(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    final = status_path(tmp_path, "planted")
    # A fixed temporary name a writer could be made to write through, and the link would send the write to.
    (tmp_path / f".{final.name}.tmp").symlink_to(victim)

    write(tmp_path, "planted")

    assert victim.read_text() == "precious"
    assert json.loads(final.read_text())["instance"] == "planted"


# Starts the command it is given, prints its pid, and waits.
PARENT = (
    "import subprocess, sys, time; print(subprocess.Popen(sys.argv[1:]).pid, flush=True); time.sleep(600)"
)


def test_the_walk_names_each_workloads_descendants_with_their_start_times(
    spawned: list[int],
) -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, *SLEEP], stdout=subprocess.PIPE, text=True)
    spawned.append(parent.pid)
    child = int(read_line(parent))
    spawned.append(child)

    trees = walk_trees([parent.pid])

    assert trees.descendants == {parent.pid: [(child, start_ticks(child))]}
    assert trees.rss[parent.pid]
