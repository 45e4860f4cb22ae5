"""The state directory must be the scheduler's user's alone: a journal planted in it makes a starting
executor kill the processes it names."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from async_local_executor.ops import recovery, state_dir
from async_local_executor.ops.journal_file import SUFFIX
from async_local_executor.ops.state_dir import UnsafeStateDir
from tests.core.helpers import alive
from tests.core.test_registry import SLEEP

NOBODY = 65534


@pytest.fixture
def victim() -> Iterator[int]:
    """A process of ours that a planted journal names."""
    proc = subprocess.Popen(SLEEP)
    yield proc.pid
    proc.kill()
    proc.wait()


def plant(directory: Path, pid: int) -> None:
    """What another user with write access could leave: a dead instance's journal naming ``pid``."""
    lines = [
        {"instance": "planted", "owner": "someone else", "pid": 1, "opened": 0},
        {"+": pid, "start": psutil.Process(pid).create_time(), "key": "a task"},
    ]
    (directory / f"planted{SUFFIX}").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_a_missing_directory_is_created_0700(tmp_path: Path) -> None:
    directory = tmp_path / "a" / "state"
    recovery.reclaim_then_open(directory, owner="first").close()
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o755, 0o1777])
def test_a_directory_of_ours_open_to_others_is_tightened_to_0700(tmp_path: Path, mode: int) -> None:
    directory = tmp_path / "state"
    directory.mkdir()
    directory.chmod(mode)
    recovery.reclaim_then_open(directory, owner="tightening").close()
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_a_directory_of_another_user_is_refused_before_anything_in_it_is_acted_on(
    tmp_path: Path, victim: int
) -> None:
    directory = tmp_path / "state"
    directory.mkdir()
    directory.chmod(0o777)
    plant(directory, victim)
    os.chown(directory, NOBODY, NOBODY)

    with pytest.raises(UnsafeStateDir) as refused:
        recovery.reclaim_then_open(directory, owner="refusing")

    message = str(refused.value)
    assert str(directory) in message
    assert f"owned by uid {NOBODY} (mode 0777)" in message
    assert f"not by the scheduler's uid {os.geteuid()}" in message
    assert "state_dir" in message
    assert alive(victim)
    assert [p.name for p in directory.iterdir()] == [f"planted{SUFFIX}"]


def test_a_directory_writable_by_others_that_cannot_be_tightened_is_refused(
    tmp_path: Path, victim: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "state"
    directory.mkdir()
    directory.chmod(0o777)
    plant(directory, victim)

    def refuse(path: Path, mode: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(Path, "chmod", refuse)  # a file system that will not let us (NFS, say)
    with pytest.raises(UnsafeStateDir) as refused:
        recovery.reclaim_then_open(directory, owner="refusing")
    monkeypatch.undo()

    message = str(refused.value)
    assert f"{directory} (owner uid {os.geteuid()}, mode 0777) is writable by other users" in message
    assert "cannot be made 0700 (Operation not permitted)" in message
    assert alive(victim)


def test_a_directory_of_ours_readable_by_others_that_cannot_be_tightened_is_accepted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "state"
    directory.mkdir()
    directory.chmod(0o755)
    monkeypatch.setattr(Path, "chmod", lambda path, mode: None)  # nothing another user can plant
    state_dir.secure(directory)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o755
