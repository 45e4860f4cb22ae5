"""The state directory must be the scheduler's user's alone: a journal planted in it makes a starting
executor kill the processes it names."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from async_local_executor.core.health import Health, Report, Verdict
from async_local_executor.core.proc_identity import start_ticks
from async_local_executor.ops import recovery, state_dir, status_read
from async_local_executor.ops.journal_file import SUFFIX
from async_local_executor.ops.reclaim import reclaim
from async_local_executor.ops.state_dir import UnsafeStateDir
from async_local_executor.ops.status import StatusWriter, status_path
from tests.core.helpers import alive
from tests.processes import SLEEP
from tests.states import meta, quiet

NOBODY = 65534


@pytest.fixture
def victim() -> Iterator[int]:
    """A process of ours that a planted journal names."""
    proc = subprocess.Popen(SLEEP)
    yield proc.pid
    proc.kill()
    proc.wait()


def plant(directory: Path, pid: int, instance: str = "planted") -> None:
    """What another user with write access could leave: a dead instance's journal naming ``pid``."""
    lines = [
        {"instance": instance, "owner": "someone else", "pid": 1, "opened": 0},
        {"+": pid, "start_ticks": start_ticks(pid), "key": "a task"},
    ]
    (directory / f"{instance}{SUFFIX}").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_a_missing_directory_is_created_0700(tmp_path: Path) -> None:
    directory = tmp_path / "a" / "state"
    recovery.reclaim_then_open(directory, owner="first").journal.close()
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o755, 0o1777])
def test_a_directory_of_ours_open_to_others_is_tightened_to_0700(tmp_path: Path, mode: int) -> None:
    directory = tmp_path / "state"
    directory.mkdir()
    directory.chmod(mode)
    recovery.reclaim_then_open(directory, owner="tightening").journal.close()
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

    def refuse(fd: int, mode: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "fchmod", refuse)  # a file system that will not let us (NFS, say)
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
    monkeypatch.setattr(os, "fchmod", lambda fd, mode: None)  # nothing another user can plant
    state_dir.secure(directory).close()
    assert stat.S_IMODE(directory.stat().st_mode) == 0o755


def write_status(directory: Path, instance: str) -> None:
    state = quiet()
    writer = StatusWriter(status_path(directory, instance), meta(instance))
    writer.write(Report(time.monotonic(), 0.0, 0.0, Health(Verdict.HEALTHY), state))


def swap_for_a_link(directory: Path, to: Path) -> Path:
    """Another user with write access to the parent: the real directory moved away, a link in its place."""
    moved = directory.with_name(f"{directory.name}.moved")
    directory.rename(moved)
    directory.symlink_to(to, target_is_directory=True)
    return moved


def test_the_state_directory_opened_once_is_the_one_used_when_a_link_is_swapped_in_after(
    tmp_path: Path, victim: int
) -> None:
    directory = tmp_path / "state"
    directory.mkdir(mode=0o700)
    left = subprocess.Popen(SLEEP)  # what a dead executor really left running
    try:
        plant(directory, left.pid, instance="dead")
        write_status(directory, "ours")
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir(mode=0o700)
        plant(elsewhere, victim)
        write_status(elsewhere, "planted")

        with state_dir.secure(directory) as folder:
            moved = swap_for_a_link(directory, elsewhere)
            found = status_read.read_all(folder)
            survivors = reclaim(folder).killed

        # The directory that was checked, under the name it was opened by (for messages only).
        assert [f.path for f in found] == [status_path(directory, "ours")]
        assert [f.data["instance"] for f in found] == ["ours"]
        assert [s.pid for s in survivors] == [left.pid]
        assert alive(victim)
        assert (elsewhere / f"planted{SUFFIX}").exists()
        assert not (moved / f"dead{SUFFIX}").exists()
    finally:
        left.kill()
        left.wait()


def test_a_link_swapped_in_between_the_check_and_the_reclaim_is_not_followed(
    tmp_path: Path, victim: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "state"
    directory.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    plant(elsewhere, victim)
    checked = state_dir.secure

    def swapped_once_checked(path: Path) -> state_dir.StateDir:
        opened = checked(path)
        swap_for_a_link(directory, elsewhere)
        return opened

    monkeypatch.setattr(state_dir, "secure", swapped_once_checked)
    with pytest.raises(UnsafeStateDir) as refused:
        recovery.reclaim_then_open(directory, owner="swapped")

    assert alive(victim)
    assert [p.name for p in elsewhere.iterdir()] == [f"planted{SUFFIX}"]
    assert f"state directory {directory} was replaced while in use" in str(refused.value)


def test_a_state_directory_that_is_a_link_is_refused_before_anything_in_it_is_acted_on(
    tmp_path: Path, victim: int
) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    plant(real, victim)
    link = tmp_path / "state"
    link.symlink_to(real, target_is_directory=True)

    for attempt in (
        lambda: recovery.reclaim_then_open(link, owner="refusing"),
        lambda: state_dir.secure(link),
        lambda: reclaim(link),
    ):
        with pytest.raises(UnsafeStateDir) as refused:
            attempt()
        message = str(refused.value)
        assert f"state directory {link} is a symbolic link" in message
        assert "state_dir" in message

    assert alive(victim)
    assert [p.name for p in real.iterdir()] == [f"planted{SUFFIX}"]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_journal_of_another_user_in_our_directory_is_not_acted_on(
    tmp_path: Path, victim: int, caplog: pytest.LogCaptureFixture
) -> None:
    # Left there while the directory was still open to others, before it was tightened.
    directory = tmp_path / "state"
    directory.mkdir()
    directory.chmod(0o777)
    plant(directory, victim)
    os.chown(directory / f"planted{SUFFIX}", NOBODY, NOBODY)

    recovery.reclaim_then_open(directory, owner="careful").journal.close()

    assert alive(victim)
    assert any(
        f"planted{SUFFIX}" in r.getMessage() and "owned by uid" in r.getMessage() for r in caplog.records
    )
