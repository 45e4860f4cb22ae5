"""A stop hands running task workloads over alive, and the next executor on the state directory adopts them.

Two executors in this process stand for a scheduler and the next one: the first is ended with
``on_stop = handover``, the second starts on the same state directory and holds what the first handed
over, until the scheduler offers their task instances (``try_adopt_task_instances``). The workloads are
the stub (tests/adapter/stub_workload.py) in real custody (core/custody.py), as the real entry runs it:
it outlives the stop, and records its exit code for the executor that adopted it. Both executors run in
the test's process, so the workloads' owner never dies: what is tested here is the executors' side; the
workload's own side (its owner's death, its countdown) is tests/core's and the end-to-end tests'.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow.executors.workloads import ExecuteTask
from airflow.models.taskinstancekey import TaskInstanceKey
from airflow.utils.state import TaskInstanceState

from async_local_executor.core.proc_identity import start_ticks
from async_local_executor.ops import custody_dir
from tests.adapter import workloads
from tests.adapter.driver import CustodyExecutor, Scheduler
from tests.core.helpers import alive

StartCustody = Callable[[], CustodyExecutor]
# The bound on a stop that hands its tasks over: seconds, not shutdown_timeout.
END_BOUND = 5.0
FINAL = (TaskInstanceState.SUCCESS, TaskInstanceState.FAILED)


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's state directory; its executors hand over on a stop (tests/adapter terminates)."""
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__ON_STOP", "handover")
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


@pytest.fixture
def start(state: Path, tmp_path: Path) -> Iterator[StartCustody]:
    """Start a :class:`CustodyExecutor` on :func:`state`; each is ended when the test ends.

    Ending one hands over what still runs, which would outlive the test (its owner, this process, never
    dies): every stub still running then is killed, and every one that ended is reaped (this process is
    their parent, and no executor reaps a workload it let go or adopted).
    """
    started: list[CustodyExecutor] = []

    def begin() -> CustodyExecutor:
        executor = CustodyExecutor(parallelism=4)
        started.append(executor)
        executor.start()
        return executor

    yield begin
    for executor in reversed(started):
        executor.end()
    for pid in _stub_pids(tmp_path):
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _stub_pids(tmp_path: Path) -> list[int]:
    """The pids of the stubs started so far (each ``hold:<gate>`` stub writes ``<gate>.<pid>.started``)."""
    return sorted(int(path.name.split(".")[-2]) for path in tmp_path.glob("*.started"))


def _held_task(tmp_path: Path, name: str, code: int | None = None) -> tuple[ExecuteTask, Path]:
    """A task whose stub runs until the test removes its gate, then exits with ``code`` (0 by default)."""
    gate = tmp_path / name
    gate.touch()
    if code is not None:
        gate.with_name(f"{name}.code").write_text(str(code))
    return workloads.task(f"hold:{gate}"), gate


def _stub_pid(gate: Path) -> int:
    [mark] = gate.parent.glob(f"{gate.name}.*.started")
    return int(mark.name.split(".")[-2])


def _queue(executor: CustodyExecutor, *items: ExecuteTask) -> None:
    for item in items:
        executor.queue_workload(item, session=None)  # type: ignore[arg-type]


def _handed_over(start: StartCustody, *gates: Path, tasks: list[ExecuteTask]) -> CustodyExecutor:
    """Run ``tasks`` on a first executor until each stub runs, then end it, as a scheduler's stop does.

    :returns: the ended executor
    """
    first = start()
    _queue(first, *tasks)
    Scheduler(first).run_until(lambda: all(any(g.parent.glob(f"{g.name}.*.started")) for g in gates))
    first.end()
    return first


def _finals(executor: CustodyExecutor, key: object) -> list[Any]:
    """The final states ``executor`` gave ``key``."""
    return [state for changed, state, _, _ in executor.changes if changed == key and state in FINAL]


def _ended_unclaimed(executor: CustodyExecutor, key: TaskInstanceKey) -> bool:
    """Whether ``executor`` holds ``key``'s end, its task instance not offered yet."""
    return any(held.key == key and held.ended is not None for held in executor._holding.waiting())


def _quiet_for_a_report(executor: CustodyExecutor, scheduler: Scheduler) -> None:
    """Run the scheduler's loop until two more health reports have passed: what was coming has come."""
    seen = executor.reports
    executor.until_reported(lambda: executor.reports >= seen + 2)
    scheduler.loop_once()


def test_a_stop_lets_running_tasks_go_and_the_next_executor_adopts_them_and_reports_their_end(
    start: StartCustody, tmp_path: Path, state: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ok, ok_gate = _held_task(tmp_path, "ok")
    fails, fails_gate = _held_task(tmp_path, "fails", code=5)
    first = start()
    _queue(first, ok, fails)
    Scheduler(first).run_until(lambda: len(_stub_pids(tmp_path)) == 2)
    stubs = _stub_pids(tmp_path)

    began = time.monotonic()
    first.end()
    took = time.monotonic() - began
    assert took < END_BOUND, f"end() took {took:.1f}s"
    assert first.get_event_buffer() == {}
    assert _finals(first, ok.key) == _finals(first, fails.key) == []
    assert all(alive(pid) for pid in stubs)

    second = start()
    assert "holding 2 running workload(s) a stopped scheduler handed over" in caplog.text
    # The custody files name the executor that answers for each now: this process, started again.
    for pid in stubs:
        owner = custody_dir.read_owner(custody_dir.path(state), pid, start_ticks(pid) or 0)
        assert owner == (os.getpid(), start_ticks(os.getpid()))
    never_launched = workloads.task("never_launched")
    offered = [workloads.Revoked(item.key) for item in (ok, fails, never_launched)]
    refused = second.try_adopt_task_instances(offered)  # type: ignore[arg-type]
    assert refused == [offered[2]]
    assert second.running == {ok.key, fails.key}
    assert "adopted 2 task instance(s)" in caplog.text
    assert "1 others are left for the scheduler to reset" in caplog.text

    scheduler = Scheduler(second)
    ok_gate.unlink()
    scheduler.run_until(lambda: ok.key in scheduler.events)
    assert scheduler.events[ok.key] == (TaskInstanceState.SUCCESS, None)
    assert fails.key not in scheduler.events  # still running
    fails_gate.unlink()
    scheduler.run_until(lambda: fails.key in scheduler.events)
    state_, info = scheduler.events[fails.key]
    assert state_ == TaskInstanceState.FAILED
    assert "exited with code 5" in info
    _quiet_for_a_report(second, scheduler)
    # Once each, and the way a workload this executor had launched would be reported.
    assert _finals(second, ok.key) == [TaskInstanceState.SUCCESS]
    assert _finals(second, fails.key) == [TaskInstanceState.FAILED]
    assert second.running == set()
    assert not any(alive(pid) for pid in stubs)
    # Their outcome read, nothing is left of them in the custody directory.
    assert sorted(os.listdir(custody_dir.path(state))) == []


def test_an_adopted_task_revoked_is_stopped_without_an_event(start: StartCustody, tmp_path: Path) -> None:
    held, gate = _held_task(tmp_path, "revoked")
    _handed_over(start, gate, tasks=[held])
    stub = _stub_pid(gate)
    second = start()
    ti = workloads.Revoked(held.key)
    assert second.try_adopt_task_instances([ti]) == []  # type: ignore[list-item]
    second.until_reported(lambda: stub in second.adopted)  # its supervisor runs it, as a scheduler loop later

    second.revoke_task(ti=ti)  # type: ignore[arg-type]
    scheduler = Scheduler(second)
    scheduler.run_until(lambda: not alive(stub))
    _quiet_for_a_report(second, scheduler)
    assert held.key not in scheduler.events
    assert [change for change in second.changes if change[0] == held.key] == []
    assert held.key not in second.running
    assert gate.exists()  # it did not end on its own: it was stopped
    # Its process group is gone with it (the stub leads it): nothing it started is left running.
    assert [pid for pid in _in_group(stub) if alive(pid)] == []


def _in_group(pgid: int) -> list[int]:
    """The processes of group ``pgid``, as /proc lists them (zombies included)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.getpgid(int(entry)) == pgid:
                    found.append(int(entry))
    return found


def test_an_unclaimed_workload_that_ends_is_reported_only_once_its_task_instance_is_offered(
    start: StartCustody, tmp_path: Path
) -> None:
    held, gate = _held_task(tmp_path, "early")
    _handed_over(start, gate, tasks=[held])
    stub = _stub_pid(gate)
    second = start()
    scheduler = Scheduler(second)
    # At once: it may end before the loop has come to supervise it, and its recorded exit still counts.
    gate.unlink()
    scheduler.run_until(lambda: _ended_unclaimed(second, held.key))
    assert not alive(stub)
    _quiet_for_a_report(second, scheduler)
    assert held.key not in scheduler.events  # Airflow has not offered it yet
    assert _finals(second, held.key) == []

    assert second.try_adopt_task_instances([workloads.Revoked(held.key)]) == []  # type: ignore[list-item]
    # Its end is given at once, in the same call: no other loop needed.
    assert second.get_event_buffer() == {held.key: (TaskInstanceState.SUCCESS, None)}
    assert held.key not in second.running
    _quiet_for_a_report(second, scheduler)
    assert _finals(second, held.key) == [TaskInstanceState.SUCCESS]


def test_offered_task_instances_that_nothing_was_handed_over_for_are_all_returned(
    start: StartCustody,
) -> None:
    executor = start()
    offered = [workloads.Revoked(workloads.task(name).key) for name in ("a", "b")]
    assert executor.try_adopt_task_instances(offered) == offered  # type: ignore[arg-type]
    assert executor.running == set()
