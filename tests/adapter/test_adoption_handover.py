"""A stop hands running task workloads over alive, and the next executor on the state directory adopts them.

Two executors in this process stand for a scheduler and the next one: the first is ended with
``on_stop = handover``, the second starts on the same state directory and holds what the first handed
over, until the scheduler offers their task instances (``try_adopt_task_instances``). The workloads are
the stub (tests/adapter/stub_workload.py) in real custody (core/custody.py), as the real entry runs it:
it outlives the stop, and records its exit code for the executor that adopted it. Both executors run in
the test's process, so the workloads' owner never dies: what is tested here is the executors' side
(``adoption.Handovers``, which holds, reclaims and records the handovers for the executor); the
workload's own side (its owner's death, its countdown) is tests/core's and the end-to-end tests'.
"""

from __future__ import annotations

import contextlib
import functools
import logging
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

from async_local_executor.adapter import adoption
from async_local_executor.adapter.config import SECTION
from async_local_executor.core.clock import SystemClock
from async_local_executor.core.files import open_regular
from async_local_executor.core.proc_identity import start_ticks
from async_local_executor.ops import custody_dir, journal_file
from tests.adapter import workloads
from tests.adapter.driver import CustodyExecutor, Scheduler
from tests.core.helpers import alive

StartCustody = Callable[..., CustodyExecutor]
# A stop that hands its tasks over takes seconds, not shutdown_timeout.
END_BOUND = 5.0
FINAL = (TaskInstanceState.SUCCESS, TaskInstanceState.FAILED)


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's state directory; its executors hand over on a stop (tests/adapter terminates)."""
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__ON_STOP", "handover")
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


@pytest.fixture
def start(state: Path, tmp_path: Path, launcher: str) -> Iterator[StartCustody]:
    """Start a :class:`CustodyExecutor` on :func:`state`; each is ended when the test ends.

    Ending one hands over what still runs, which would outlive the test (its owner, this process, never
    dies): every stub still running then is killed, and every one that ended is reaped (this process is
    their parent, and no executor reaps a workload it let go or adopted).
    """
    started: list[CustodyExecutor] = []

    def begin(kind: type[CustodyExecutor] = CustodyExecutor, team: str | None = None) -> CustodyExecutor:
        executor = kind(parallelism=4, team_name=team)
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


def _held_task(
    tmp_path: Path, name: str, code: int | None = None, limit: float | None = None
) -> tuple[ExecuteTask, Path]:
    """A task whose stub runs until the test removes its gate, then exits with ``code`` (0 by default);
    ``limit``: its run-time limit (``task_timeout``) in seconds."""
    gate = tmp_path / name
    gate.touch()
    if code is not None:
        gate.with_name(f"{name}.code").write_text(str(code))
    config: dict[str, object] | None = None if limit is None else {SECTION: {"task_timeout": limit}}
    return workloads.task(f"hold:{gate}", executor_config=config), gate


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


def _held_by_a_successor(
    start: StartCustody, tmp_path: Path, name: str
) -> tuple[ExecuteTask, Path, int, CustodyExecutor]:
    """A task handed over by a stopped first executor, and the started second one that holds it.

    :returns: the task, its gate, its stub's pid and the second executor
    """
    held, gate = _held_task(tmp_path, name)
    _handed_over(start, gate, tasks=[held])
    return held, gate, _stub_pid(gate), start()


def _finals(executor: CustodyExecutor, key: object) -> list[Any]:
    """The final states ``executor`` gave ``key``."""
    return [state for changed, state, _, _ in executor.changes if changed == key and state in FINAL]


def _ended_unclaimed(executor: CustodyExecutor, key: TaskInstanceKey) -> bool:
    """Whether ``executor`` holds ``key``'s end, its task instance not offered yet."""
    return any(held.key == key and held.ended is not None for held in executor._handovers.holding.waiting())


def _succeeds(scheduler: Scheduler, key: object, gate: Path) -> None:
    """Open the gate its stub waits on: the workload ends, and the scheduler gets its success."""
    gate.unlink()
    scheduler.run_until(lambda: key in scheduler.events)
    assert scheduler.events[key] == (TaskInstanceState.SUCCESS, None)


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
    assert "holding 2 running workload(s) for adoption" in caplog.text
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
    _succeeds(scheduler, ok.key, ok_gate)
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
    held, gate, stub, second = _held_by_a_successor(start, tmp_path, "revoked")
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


def test_an_adopted_task_revoked_then_queued_again_is_reported_as_launched_here(
    start: StartCustody, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Airflow 3 requeues a try stuck in queued under its try number: the same key, now launched here.
    caplog.set_level(logging.INFO)
    held, gate, stub, second = _held_by_a_successor(start, tmp_path, "requeued")
    ti = workloads.Revoked(held.key)
    assert second.try_adopt_task_instances([ti]) == []  # type: ignore[list-item]
    second.until_reported(lambda: stub in second.adopted)
    second.revoke_task(ti=ti)  # type: ignore[arg-type]
    scheduler = Scheduler(second)
    scheduler.run_until(lambda: not alive(stub))
    again, _ = _held_task(tmp_path, "requeued")
    assert again.key == held.key
    _queue(second, again)
    scheduler.run_until(lambda: len(_stub_pids(tmp_path)) == 2)
    _succeeds(scheduler, held.key, gate)
    assert _finals(second, held.key) == [TaskInstanceState.SUCCESS]
    assert "adopted workload" not in caplog.text, caplog.text
    assert not second._handovers.holding.was_claimed(held.key)


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
    held, gate, stub, second = _held_by_a_successor(start, tmp_path, "early")
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


def test_a_retried_adoption_gets_the_same_answer_and_no_end_twice(
    start: StartCustody, tmp_path: Path
) -> None:
    # Airflow asks inside run_with_db_retries: a failed transaction makes it ask again, with the same task
    # instances. Refused the second time, they would be reset while their processes run on.
    running, running_gate = _held_task(tmp_path, "running")
    early, early_gate = _held_task(tmp_path, "early")
    _handed_over(start, running_gate, early_gate, tasks=[running, early])
    second = start()
    scheduler = Scheduler(second)
    early_gate.unlink()
    scheduler.run_until(lambda: _ended_unclaimed(second, early.key))
    offered = [workloads.Revoked(running.key), workloads.Revoked(early.key)]

    assert second.try_adopt_task_instances(offered) == []  # type: ignore[arg-type]
    assert second.get_event_buffer() == {early.key: (TaskInstanceState.SUCCESS, None)}
    assert second.try_adopt_task_instances(offered) == []  # type: ignore[arg-type]
    assert second.get_event_buffer() == {}  # the early end was given once
    assert second.running == {running.key}  # and the ended one holds no slot again

    running_gate.unlink()
    scheduler.run_until(lambda: running.key in scheduler.events)
    _quiet_for_a_report(second, scheduler)
    assert _finals(second, running.key) == [TaskInstanceState.SUCCESS]
    assert _finals(second, early.key) == [TaskInstanceState.SUCCESS]
    assert second.running == set()


def test_each_team_holds_only_what_its_own_executor_handed_over(
    start: StartCustody, tmp_path: Path, state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One state directory for both teams, as when neither sets its own (both default to the same one
    # under AIRFLOW_HOME). Airflow offers each team's task instances to that team's executor alone, so
    # each must hold only its own team's workloads.
    monkeypatch.setenv("AIRFLOW__TEAM_A___ASYNC_LOCAL_EXECUTOR__STATE_DIR", str(state))
    monkeypatch.setenv("AIRFLOW__TEAM_A___ASYNC_LOCAL_EXECUTOR__ON_STOP", "handover")
    # A team's section does not fall back to the global one: its cgroups go under the session's root too.
    root = os.environ.get("AIRFLOW__ASYNC_LOCAL_EXECUTOR__CGROUP_ROOT", "")
    monkeypatch.setenv("AIRFLOW__TEAM_A___ASYNC_LOCAL_EXECUTOR__CGROUP_ROOT", root)
    plain, plain_gate = _held_task(tmp_path, "plain")
    teamed, teamed_gate = _held_task(tmp_path, "teamed")
    first_plain, first_team = start(), start(team="team_a")
    _queue(first_plain, plain)
    _queue(first_team, teamed)
    Scheduler(first_plain).run_until(lambda: any(tmp_path.glob("plain.*.started")))
    Scheduler(first_team).run_until(lambda: any(tmp_path.glob("teamed.*.started")))
    first_plain.end()
    first_team.end()

    # The team's executor starts first this time: it must leave the other team's journal alone.
    second_team, second_plain = start(team="team_a"), start()
    assert second_team._journal is not None
    assert second_plain._journal is not None
    assert second_team._journal.directory == second_plain._journal.directory == state
    assert [held.key for held in second_team._handovers.holding.waiting()] == [teamed.key]
    assert [held.key for held in second_plain._handovers.holding.waiting()] == [plain.key]
    assert second_team.try_adopt_task_instances([workloads.Revoked(teamed.key)]) == []  # type: ignore[list-item]
    assert second_plain.try_adopt_task_instances([workloads.Revoked(plain.key)]) == []  # type: ignore[list-item]
    plain_gate.unlink()
    teamed_gate.unlink()
    for executor, key in ((second_plain, plain.key), (second_team, teamed.key)):
        scheduler = Scheduler(executor)
        scheduler.run_until(functools.partial(_has_event, scheduler, key))
        assert scheduler.events[key] == (TaskInstanceState.SUCCESS, None)


def _has_event(scheduler: Scheduler, key: object) -> bool:
    return key in scheduler.events


class _SteppedClock(SystemClock):
    """The system clock, but for a wall clock stepped by :attr:`step` seconds (as NTP or an operator does)."""

    step = 0.0

    def time(self) -> float:
        return time.time() + self.step


class _SteppedExecutor(CustodyExecutor):
    clock = _SteppedClock()


def test_a_wall_clock_step_before_a_stop_leaves_an_adopted_task_its_limit(
    start: StartCustody, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    limited, gate = _held_task(tmp_path, "limited", limit=600)
    first = start(_SteppedExecutor)
    _queue(first, limited)
    Scheduler(first).run_until(lambda: any(tmp_path.glob("limited.*.started")))
    stub = _stub_pid(gate)
    _SteppedExecutor.clock.step = 3600.0  # an hour forward while it runs, then the scheduler is stopped
    try:
        first.end()
    finally:
        _SteppedExecutor.clock.step = 0.0

    second = start()
    assert second.try_adopt_task_instances([workloads.Revoked(limited.key)]) == []  # type: ignore[list-item]
    second.until_reported(lambda: stub in second.adopted)
    scheduler = Scheduler(second)
    _quiet_for_a_report(second, scheduler)
    assert alive(stub), "the adopted task was stopped"
    assert "timeout; terminating it" not in caplog.text
    _succeeds(scheduler, limited.key, gate)


LIMIT = 20.0  # a task's run-time limit, for a task handed over twice
LEFT_AT_STOP = 8.0  # what is left of it when the scheduler is stopped


def _crash(executor: CustodyExecutor) -> None:
    """What a kill -9 of ``executor``'s scheduler leaves: its workloads run on, its journal is unlocked and
    holds their launches, and no handover line is written."""
    runtime, journal = executor._runtime, executor._journal
    assert runtime is not None
    assert journal is not None
    executor._runtime = executor._journal = None
    runtime.release(0.0, timeout=GUARD_RELEASE)
    journal.hand_on()


GUARD_RELEASE = 30.0


def test_a_task_handed_over_by_a_stop_then_a_crash_keeps_the_limit_counted_from_its_launch(
    start: StartCustody, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    twice, gate = _held_task(tmp_path, "twice", limit=LIMIT)
    first = start()
    _queue(first, twice)
    Scheduler(first).run_until(lambda: any(tmp_path.glob("twice.*.started")))
    stub = _stub_pid(gate)
    launched = time.monotonic()  # its launch was a little before this: its deadline is no later
    # The limit must have run in part before the stop: counted twice, what is left would be gone.
    Scheduler(first).run_until(lambda: time.monotonic() - launched > LIMIT - LEFT_AT_STOP)
    first.end()
    second = start()
    assert second.try_adopt_task_instances([workloads.Revoked(twice.key)]) == []  # type: ignore[list-item]
    second.until_reported(lambda: stub in second.adopted)
    _crash(second)

    third = start()
    assert [held.key for held in third._handovers.holding.waiting()] == [twice.key]
    assert third.try_adopt_task_instances([workloads.Revoked(twice.key)]) == []  # type: ignore[list-item]
    third.until_reported(lambda: stub in third.adopted)
    scheduler = Scheduler(third)
    _quiet_for_a_report(third, scheduler)
    assert time.monotonic() - launched < LIMIT, "too slow to tell: the limit ran out meanwhile"
    assert alive(stub), f"stopped before its limit: {caplog.text[-2000:]}"
    _succeeds(scheduler, twice.key, gate)


def test_a_running_executor_holds_what_a_scheduler_stopped_after_its_start_handed_over(
    start: StartCustody, tmp_path: Path
) -> None:
    # A second scheduler of the deployment (or a successor started while its predecessor was still inside
    # its stop) found the journal locked at its start. Offered the stopped one's task instances, it must
    # take them over, not refuse them: refused, they would be reset and run twice.
    offered, offered_gate = _held_task(tmp_path, "offered")
    quiet, quiet_gate = _held_task(tmp_path, "quiet")
    first = start()
    _queue(first, offered, quiet)
    Scheduler(first).run_until(lambda: len(_stub_pids(tmp_path)) == 2)
    second = start()
    assert second._handovers.holding.waiting() == []  # the first one's journal is locked: it lives
    first.end()

    assert second.try_adopt_task_instances([workloads.Revoked(offered.key)]) == []  # type: ignore[list-item]
    # The other one is held too, without an offer: its countdown stops; its offer comes later.
    assert [held.key for held in second._handovers.holding.waiting()] == [quiet.key]
    assert second.try_adopt_task_instances([workloads.Revoked(quiet.key)]) == []  # type: ignore[list-item]
    offered_gate.unlink()
    quiet_gate.unlink()
    scheduler = Scheduler(second)
    scheduler.run_until(lambda: {offered.key, quiet.key} <= scheduler.events.keys())
    assert scheduler.events[offered.key] == scheduler.events[quiet.key] == (TaskInstanceState.SUCCESS, None)


def test_a_running_executor_takes_only_a_journal_that_names_a_task_instance_offered_to_it(
    start: StartCustody, tmp_path: Path
) -> None:
    # With two schedulers, Airflow offers a dead one's task instances to whichever checks first: a
    # journal none of whose workloads were offered here is the other scheduler's to take.
    held, gate = _held_task(tmp_path, "theirs")
    first = start()
    _queue(first, held)
    Scheduler(first).run_until(lambda: len(_stub_pids(tmp_path)) == 1)
    second = start()
    first.end()
    unrelated = workloads.Revoked(workloads.task("unrelated").key)
    assert second.try_adopt_task_instances([unrelated]) == [unrelated]  # type: ignore[list-item]
    assert second._handovers.holding.waiting() == []
    assert second.try_adopt_task_instances([workloads.Revoked(held.key)]) == []  # type: ignore[list-item]
    _succeeds(Scheduler(second), held.key, gate)


def test_a_held_workload_never_offered_is_stopped_without_an_event(
    start: StartCustody, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Airflow offers a dead scheduler's task instances within its orphan check's interval once the dead
    # job counts as stale; one never offered went to another scheduler, which reset it.
    monkeypatch.setattr(adoption, "hold_bound", lambda conf: 0.0)  # Airflow's bounds passed (300 s and more)
    held, gate, stub, second = _held_by_a_successor(start, tmp_path, "never_offered")
    assert [h.key for h in second._handovers.holding.waiting()] == [held.key]
    scheduler = Scheduler(second)
    scheduler.run_until(lambda: not alive(stub))
    _quiet_for_a_report(second, scheduler)
    assert held.key not in scheduler.events
    assert [change for change in second.changes if change[0] == held.key] == []
    assert second._handovers.holding.waiting() == []
    assert gate.exists()  # it did not end on its own: it was stopped
    assert "the scheduler never offered its task instance" in caplog.text


def test_a_held_workload_revoked_before_its_offer_is_stopped_and_its_offer_refused(
    start: StartCustody, tmp_path: Path
) -> None:
    # The scheduler revokes a task instance it gave up on (queued past task_queued_timeout); held, its
    # workload is stopped and forgotten, so an offer of it later is refused and Airflow resets it instead
    # of waiting for an end that no submission would give.
    held, gate, stub, second = _held_by_a_successor(start, tmp_path, "revoked_held")
    assert [h.key for h in second._handovers.holding.waiting()] == [held.key]
    second.revoke_task(ti=workloads.Revoked(held.key))  # type: ignore[arg-type]
    assert second._handovers.holding.waiting() == []
    scheduler = Scheduler(second)
    scheduler.run_until(lambda: not alive(stub))
    offered = workloads.Revoked(held.key)
    assert second.try_adopt_task_instances([offered]) == [offered]  # type: ignore[list-item]
    _quiet_for_a_report(second, scheduler)
    assert held.key not in scheduler.events
    assert gate.exists()  # it did not end on its own: it was stopped


def test_a_handed_over_workload_of_a_try_this_executor_already_runs_is_stopped(
    start: StartCustody, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The same try under two workloads: the predecessor's, once held here, names this process as its
    # custody's owner, so its watchdog never fires; left running, it would run beside this one's to its end.
    task, gate = _held_task(tmp_path, "twice")
    first = start()
    _queue(first, task)
    Scheduler(first).run_until(lambda: len(_stub_pids(tmp_path)) == 1)
    [theirs] = _stub_pids(tmp_path)
    second = start()
    _queue(second, task)
    scheduler = Scheduler(second)
    scheduler.run_until(lambda: len(_stub_pids(tmp_path)) == 2)
    [mine] = [pid for pid in _stub_pids(tmp_path) if pid != theirs]
    first.end()
    second.try_adopt_task_instances([workloads.Revoked(task.key)])  # type: ignore[list-item]
    scheduler.run_until(lambda: not alive(theirs))
    assert alive(mine)
    assert second._handovers.holding.waiting() == []
    assert "is a try this executor already runs: it is stopped" in caplog.text
    _succeeds(scheduler, task.key, gate)


def test_a_held_workload_named_again_by_a_journal_read_twice_runs_on(
    start: StartCustody, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A reclaim that could not remove a dead journal reads it again at the next offer: the workload it
    # names is the one held already, not a second copy of its try.
    task, gate = _held_task(tmp_path, "again")
    _handed_over(start, gate, tasks=[task])
    seen: list[Any] = []
    hold = adoption.Handovers.hold

    def recording(self: adoption.Handovers, records: Any, runtime: Any) -> None:
        seen.extend(records)
        hold(self, records, runtime)

    monkeypatch.setattr(adoption.Handovers, "hold", recording)
    second = start()
    [record] = seen
    assert second._runtime is not None
    second._handovers.hold([record], second._runtime)  # the journal's second reading
    assert second.try_adopt_task_instances([workloads.Revoked(task.key)]) == []  # type: ignore[list-item]
    _succeeds(Scheduler(second), task.key, gate)  # it ran to its end, not killed


# A workload handed over twice keeps the countdown its launch gave it, whatever its adopter's own setting.
# Its watchdog (core/custody.py) counts down the ``--handover-timeout`` on its command line, set once at its
# launch. An adopter configured with another ``handover_timeout`` that is stopped in turn must journal that
# countdown, not its own: the next executor's reclaim holds a handover only while its timeout has not
# passed, and the workload is gone (or still waiting) by the one on its command line.

OPTION = "AIRFLOW__ASYNC_LOCAL_EXECUTOR__HANDOVER_TIMEOUT"


def _journalled_timeouts(state_dir: Path, pid: int) -> list[float]:
    """The timeout of each handover of ``pid`` the launch journals left in ``state_dir`` say."""
    found = []
    for path in sorted(state_dir.glob(f"*{journal_file.SUFFIX}")):
        fd = open_regular(path)
        try:
            handovers = journal_file.read_all(fd, path)[3]
        finally:
            os.close(fd)
        if pid in handovers:
            found.append(handovers[pid].timeout)
    return found


def test_a_workload_handed_over_again_is_journalled_with_the_countdown_its_launch_gave_it(
    start: StartCustody,
    state: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(OPTION, "300")
    task, gate = _held_task(tmp_path, "twice")
    first = start()
    _queue(first, task)
    Scheduler(first).run_until(lambda: any(tmp_path.glob("twice.*.started")))
    stub = _stub_pid(gate)
    first.end()
    assert _journalled_timeouts(state, stub) == [300.0]

    monkeypatch.setenv(OPTION, "60")  # the next scheduler's own setting differs
    second = start()
    assert second.try_adopt_task_instances([workloads.Revoked(task.key)]) == []  # type: ignore[list-item]
    second.until_reported(lambda: stub in second.adopted)
    second.end()
    # Its watchdog waits 300 s for a successor: journalled with 60, a successor started 61 s later
    # would refuse to hold a workload that waits for it, and its task instance would be reset.
    assert _journalled_timeouts(state, stub) == [300.0]
