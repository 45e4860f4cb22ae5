"""The control file (ops/control.py): its format, the edits an operator makes and their bad input, the
serial each change gets under the lock, and the watcher an executor polls. Real files in a temporary
state directory; the executor's side is tests/adapter/test_live_control.py's."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from async_local_executor.ops import control
from async_local_executor.ops.control import Control, ControlError


@pytest.fixture
def state(tmp_path: Path) -> Path:
    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    return folder


def test_no_file_is_running_at_the_configured_limits(state: Path) -> None:
    assert control.read(state, None) == Control()
    assert Control().describe() == "running"
    assert not Control().holds_starts


def test_each_change_gets_the_next_serial_and_is_read_back_whole(state: Path) -> None:
    paused = control.change(state, None, control.pause("alice", 1000.0))
    assert (paused.mode, paused.by, paused.at, paused.serial) == ("paused", "alice", 1000.0, 1)
    assert paused.describe() == "paused by alice at 1970-01-01 00:16:40 UTC"
    resized = control.change(
        state,
        None,
        control.resize(
            "bob",
            1001.0,
            parallelism=8,
            queues={"gpu": 1},
            configured_parallelism=4,
            configured_queues={"gpu": 2},
        ),
    )
    # A resize keeps the mode; who and when are the last change's.
    assert (resized.mode, resized.parallelism, dict(resized.queues), resized.by, resized.serial) == (
        "paused",
        8,
        {"gpu": 1},
        "bob",
        2,
    )
    assert control.read(state, None) == resized
    assert oct((state / "control.json").stat().st_mode & 0o777) == "0o600"
    drained = control.change(state, None, control.drain("carol", 1002.0, 30))
    assert (drained.mode, drained.deadline) == ("draining", 1032.0)
    assert drained.describe().endswith("deadline 1970-01-01 00:17:12 UTC")
    back = control.change(state, None, control.resume("dave", 1003.0))
    assert (back.mode, back.deadline, back.parallelism) == ("running", None, 8)


def test_a_value_equal_to_the_configured_one_drops_the_override(state: Path) -> None:
    edit = control.resize(
        "a", 1.0, parallelism=4, queues={"gpu": 2}, configured_parallelism=4, configured_queues={"gpu": 2}
    )
    control.change(
        state,
        None,
        control.resize(
            "a", 1.0, parallelism=9, queues={"gpu": 5}, configured_parallelism=4, configured_queues={"gpu": 2}
        ),
    )
    back = control.change(state, None, edit)
    assert (back.parallelism, dict(back.queues)) == (None, {})


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda: control.drain("a", 1.0, -1), "a deadline is a number of seconds"),
        (lambda: control.drain("a", 1.0, float("nan")), "a deadline is a number of seconds"),
        (
            lambda: control.resize(
                "a", 1.0, parallelism=0, queues={}, configured_parallelism=4, configured_queues={}
            ),
            "parallelism must be a whole number of at least 1",
        ),
        (
            lambda: control.resize(
                "a", 1.0, parallelism=None, queues={"x": 2}, configured_parallelism=4, configured_queues={}
            ),
            "queue 'x' has no limit in queue_limits",
        ),
        (
            lambda: control.resize(
                "a",
                1.0,
                parallelism=None,
                queues={"gpu": 0},
                configured_parallelism=4,
                configured_queues={"gpu": 1},
            ),
            "the limit of queue 'gpu' must be a whole number of at least 1",
        ),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(state: Path, make: object, said: str) -> None:
    with pytest.raises(ControlError, match=said):
        control.change(state, None, make())  # type: ignore[operator]
    assert not (state / "control.json").exists()


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b'{"format": 2}',
        b'{"format": 1, "mode": "sleeping", "queues": {}, "by": "", "at": 0, "serial": 0}',
        b'{"format": 1, "mode": "paused", "parallelism": 0, "queues": {}, "by": "", "at": 0, "serial": 0}',
        b'{"format": 1, "mode": "paused", "queues": {"q": true}, "by": "", "at": 0, "serial": 0}',
        b'{"format": 1, "mode": "paused", "queues": {}, "by": "", "at": 0, "serial": -1}',
    ],
)
def test_a_malformed_file_is_an_error_that_names_it(state: Path, content: bytes) -> None:
    (state / "control.json").write_bytes(content)
    with pytest.raises(ControlError):
        control.read(state, None)


def test_a_team_has_a_file_of_its_own_and_a_name_that_is_not_one_is_refused(state: Path) -> None:
    control.change(state, "blue", control.pause("a", 1.0))
    assert control.read(state, "blue").mode == "paused"
    assert control.read(state, None).mode == "running"
    with pytest.raises(ControlError, match="is not a team name"):
        control.file_name("../etc")


def test_two_writers_at_once_lose_neither_change(state: Path) -> None:
    def pause_many() -> None:
        for _ in range(50):
            control.change(state, None, control.pause("a", 1.0))

    threads = [threading.Thread(target=pause_many) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert control.read(state, None).serial == 200


def test_the_watcher_reads_once_per_change(state: Path) -> None:
    watcher = control.Watcher(state, None)
    assert watcher.changed() == Control()  # the first call always reads
    assert watcher.changed() is None
    written = control.change(state, None, control.pause("a", 1.0))
    assert watcher.changed() == written
    assert watcher.changed() is None
    (state / "control.json").write_text(json.dumps({"format": 1}))
    with pytest.raises(ControlError):
        watcher.changed()
    with pytest.raises(ControlError):  # asked again, it tries again
        watcher.changed()
    os.unlink(state / "control.json")
    assert watcher.changed() == Control()


def test_a_control_file_that_is_not_a_regular_file_is_refused_without_waiting(state: Path) -> None:
    (state / "control.json").mkdir()
    with pytest.raises(ControlError, match="not a regular file"):
        control.read(state, None)
    (state / "control.json").rmdir()
    os.mkfifo(state / "control.json")  # opened without waiting for a writer
    with pytest.raises(ControlError, match="not a regular file"):
        control.read(state, None)


def test_a_change_by_another_user_than_the_state_directorys_owner_is_refused(state: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to hand the directory to another user")
    os.chown(state, 65534, 65534)
    try:
        with pytest.raises(ControlError, match="run this as the scheduler's user"):
            control.change(state, None, control.pause("root", 1.0))
    finally:
        os.chown(state, 0, 0)
    assert not (state / "control.json").exists()


def test_a_change_counts_as_applied_by_its_serial_and_time_or_by_a_later_change() -> None:
    new = Control(mode="paused", by="a", at=100.0, serial=3)
    assert control._took({"serial": 3, "at": 100.0}, new)
    # The same serial from an older file (one deleted and counted again) is not this change.
    assert not control._took({"serial": 3, "at": 50.0}, new)
    assert control._took({"serial": 4, "at": 101.0}, new)
    assert not control._took({"serial": 4, "at": 99.0}, new)
    assert not control._took({"serial": 2, "at": 100.0}, new)
