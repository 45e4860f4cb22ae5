"""Live control on a started executor: pause, resume, drain and resize, from the control file (as the
command line and the REST API write it) and from the command line itself, and a control in force
across a restart.

The executor is the real one (its event loop, launcher, admission and status file); the scheduler's
loop is :class:`~tests.adapter.driver.Scheduler`, and the workloads are stubs that hold on a gate file.
Each test has its own state directory: a control file lasts until an operator changes it, so one left
in a shared directory would pause the next test's executors.
"""

from __future__ import annotations

import contextlib
import io
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from airflow.models.connection_test import ConnectionTestState
from airflow.utils.state import CallbackState, TaskInstanceState

from async_local_executor.ops import cli, control
from async_local_executor.ops.control import Control
from tests.adapter import workloads
from tests.adapter.conftest import StartExecutor
from tests.adapter.driver import RecordingExecutor, Scheduler, final_events, holding, queue


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "state"
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__STATE_DIR", str(folder))
    return folder


def _set(state: Path, edit: Callable[[Control], Control]) -> Control:
    return control.change(state, None, edit)


def _applied(ex: RecordingExecutor, scheduler: Scheduler, serial: int) -> None:
    """Run the scheduler's loop until the executor applied change ``serial`` (its heartbeat reads it)."""
    assert ex._live is not None
    scheduler.run_until(lambda: ex._live is not None and ex._live.control.serial == serial)


def _waiting(ex: RecordingExecutor, count: int) -> None:
    """Until the event loop reports ``count`` workloads accepted and waiting (held back, not launched)."""
    runtime = ex._runtime
    assert runtime is not None
    ex.until_reported(lambda: runtime.report is not None and runtime.report.state.waiting == count)


def test_a_pause_holds_new_task_starts_running_ones_go_on_callbacks_run_and_resume_starts_them(
    start_executor: StartExecutor, state: Path, gate: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    ex = start_executor(parallelism=4)
    scheduler = Scheduler(ex)
    first = workloads.task(f"hold:{gate}", map_index=0)
    queue(ex, first)
    scheduler.run_until(lambda: holding(gate) == 1)
    assert ex.slots_available > 0

    paused = _set(state, control.pause("alice", time.time()))
    _applied(ex, scheduler, paused.serial)
    # Airflow sees no open slot: it leaves its task instances scheduled.
    assert ex.slots_available == 0
    assert "live control changed (serial 1): paused by alice at" in caplog.text
    second = workloads.task(f"hold:{gate}", map_index=1)
    queue(ex, second)  # queued before the pause reached the scheduler: it waits in the executor
    scheduler.loop_once()
    _waiting(ex, 1)
    assert holding(gate) == 1
    assert "workload adapter_dag.hold" in caplog.text
    assert "waits: the executor is paused by alice" in caplog.text
    # Neither a callback nor a connection test is held back by a pause.
    callback, probe = workloads.callback(), workloads.connection_test("ok")
    queue(ex, callback, probe)
    scheduler.run_until(lambda: final_events(ex)[callback.key] == final_events(ex)[probe.key] == 1)
    assert [s for k, s, _, _ in ex.changes if k == callback.key][-1] == CallbackState.SUCCESS
    assert [s for k, s, _, _ in ex.changes if k == probe.key][-1] == ConnectionTestState.SUCCESS
    fields = ex._live.fields() if ex._live else None
    assert fields is not None
    assert fields["mode"] == "paused"
    assert fields["by"] == "alice"

    resumed = _set(state, control.resume("bob", time.time()))
    _applied(ex, scheduler, resumed.serial)
    scheduler.run_until(lambda: holding(gate) == 2)
    assert ex.slots_available > 0
    gate.unlink()
    scheduler.run_until(lambda: {first.key, second.key} <= scheduler.events.keys())
    assert final_events(ex) == {first.key: 1, second.key: 1, callback.key: 1, probe.key: 1}
    assert {scheduler.events[k][0] for k in (first.key, second.key)} == {TaskInstanceState.SUCCESS}


def test_a_resize_down_stops_nothing_and_new_starts_wait_under_it_then_a_resize_up_lets_them_go(
    start_executor: StartExecutor, state: Path, tmp_path: Path
) -> None:
    ex = start_executor(parallelism=4)
    scheduler = Scheduler(ex)
    gates = [tmp_path / f"gate{i}" for i in range(4)]
    for g in gates:
        g.touch()
    tasks = [workloads.task(f"hold:{g}") for g in gates]
    queue(ex, tasks[0], tasks[1])
    scheduler.run_until(lambda: holding(gates[0]) + holding(gates[1]) == 2)

    down = _set(
        state,
        control.resize(
            "alice", time.time(), parallelism=1, queues={}, configured_parallelism=4, configured_queues={}
        ),
    )
    _applied(ex, scheduler, down.serial)
    assert ex.parallelism == 1
    # Two run under a limit of 1: Airflow is offered only the prefetch, which waits in the executor.
    assert ex.slots_available == 1 - 2 + ex._prefetch.allowed()
    queue(ex, tasks[2])
    scheduler.loop_once()
    _waiting(ex, 1)
    gates[0].unlink()
    scheduler.run_until(lambda: tasks[0].key in scheduler.events)
    # One still runs: at the limit of 1, the third waits.
    _waiting(ex, 1)
    assert holding(gates[2]) == 0
    gates[1].unlink()
    scheduler.run_until(lambda: holding(gates[2]) == 1)

    up = _set(
        state,
        control.resize(
            "alice", time.time(), parallelism=4, queues={}, configured_parallelism=4, configured_queues={}
        ),
    )
    assert up.parallelism is None  # back to the configured value: no override is kept
    _applied(ex, scheduler, up.serial)
    assert ex.parallelism == 4
    queue(ex, tasks[3])
    scheduler.run_until(lambda: holding(gates[3]) == 1)
    for g in gates[2:]:
        g.unlink()
    scheduler.run_until(lambda: all(t.key in scheduler.events for t in tasks))
    assert [scheduler.events[t.key][0] for t in tasks] == [TaskInstanceState.SUCCESS] * 4


def test_a_drain_says_drained_once_nothing_runs(
    start_executor: StartExecutor, state: Path, gate: Path
) -> None:
    ex = start_executor(parallelism=2)
    scheduler = Scheduler(ex)
    task = workloads.task(f"hold:{gate}")
    queue(ex, task)
    scheduler.run_until(lambda: holding(gate) == 1)
    drain = _set(state, control.drain("alice", time.time(), None))
    _applied(ex, scheduler, drain.serial)
    assert ex.slots_available == 0
    assert ex._live is not None
    assert ex._live.fields()["mode"] == "draining"
    gate.unlink()
    scheduler.run_until(lambda: ex._live is not None and ex._live.fields()["mode"] == "drained")
    assert scheduler.events[task.key][0] == TaskInstanceState.SUCCESS
    assert ex.slots_available == 0  # drained is still holding new starts, until a resume


def test_at_a_drains_deadline_what_still_runs_is_terminated_and_named(
    start_executor: StartExecutor, state: Path, gate: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # These tests run with on_stop = terminate (tests/adapter/conftest.py): the deadline stops what runs.
    caplog.set_level(logging.INFO)
    ex = start_executor(parallelism=2)
    scheduler = Scheduler(ex)
    task = workloads.task(f"hold:{gate}")
    queue(ex, task)
    scheduler.run_until(lambda: holding(gate) == 1)
    drain = _set(state, control.drain("alice", time.time(), 0.0))
    _applied(ex, scheduler, drain.serial)
    scheduler.run_until(lambda: task.key in scheduler.events)
    assert scheduler.events[task.key][0] == TaskInstanceState.FAILED
    assert ex._live is not None
    fields = ex._live.fields()
    assert fields["overdue"]
    assert fields["still_running"] == ["adapter_dag.hold:" + str(gate) + " try 1"]
    assert "drain deadline passed with 1 workload(s) left; stopping them" in caplog.text


def test_a_drain_lets_what_was_handed_over_start_and_is_drained_only_once_that_has_ended_too(
    start_executor: StartExecutor, state: Path, tmp_path: Path
) -> None:
    # Parallelism 1: the second task waits for the slot inside the executor (Airflow has it queued). A
    # drain takes no new work, but lets it start when the first ends: held, it would be reset and run
    # again after the stop a drain prepares.
    ex = start_executor(parallelism=1)
    scheduler = Scheduler(ex)
    gates = [tmp_path / "one", tmp_path / "two"]
    for g in gates:
        g.touch()
    first, second = (workloads.task(f"hold:{g}") for g in gates)
    queue(ex, first, second)
    scheduler.run_until(lambda: holding(gates[0]) == 1)
    _waiting(ex, 1)
    drain = _set(state, control.drain("alice", time.time(), None))
    _applied(ex, scheduler, drain.serial)
    gates[0].unlink()
    scheduler.run_until(lambda: holding(gates[1]) == 1)
    assert ex._live is not None
    assert ex._live.fields()["mode"] == "draining"
    gates[1].unlink()
    scheduler.run_until(lambda: ex._live is not None and ex._live.fields()["mode"] == "drained")
    assert [scheduler.events[t.key][0] for t in (first, second)] == [TaskInstanceState.SUCCESS] * 2


def test_a_control_set_before_the_start_is_in_force_from_it(
    start_executor: StartExecutor, state: Path, gate: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    state.mkdir(mode=0o700)
    _set(state, control.pause("alice", time.time()))
    _set(
        state,
        control.resize(
            "alice", time.time(), parallelism=2, queues={}, configured_parallelism=8, configured_queues={}
        ),
    )
    ex = start_executor(parallelism=8)
    assert "live control in force since before this start: paused by alice at" in caplog.text
    assert "parallelism 2 (configured 8)" in caplog.text
    assert ex.parallelism == 2
    assert ex.slots_available == 0
    scheduler = Scheduler(ex)
    task = workloads.task(f"hold:{gate}")
    queue(ex, task)
    scheduler.loop_once()
    _waiting(ex, 1)
    assert holding(gate) == 0
    resumed = _set(state, control.resume("alice", time.time()))
    _applied(ex, scheduler, resumed.serial)
    scheduler.run_until(lambda: holding(gate) == 1)
    gate.unlink()
    scheduler.run_until(lambda: task.key in scheduler.events)


def test_an_unreadable_control_file_is_said_once_and_changes_nothing(
    start_executor: StartExecutor, state: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ex = start_executor(parallelism=3)
    scheduler = Scheduler(ex)
    (state / "control.json").write_text('{"format": 1, "mode": "sleeping"}')
    for _ in range(3):
        scheduler.loop_once()
    assert caplog.text.count("the control file cannot be read") == 1
    assert "unknown mode 'sleeping'" in caplog.text
    assert ex.slots_available > 0
    assert ex.parallelism == 3


@contextlib.contextmanager
def _command(argv: list[str]) -> Iterator[dict[str, object]]:
    """Run the ``async-local-executor`` command line in a thread (it waits for the executor, whose
    heartbeat the test's loop runs meanwhile); the result holds its exit status and output."""
    result: dict[str, object] = {}
    out, err = io.StringIO(), io.StringIO()

    def run() -> None:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            result["code"] = cli.main(argv)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield result
    finally:
        thread.join(120)
        result["out"], result["err"] = out.getvalue(), err.getvalue()


def _run(scheduler: Scheduler, argv: list[str]) -> dict[str, object]:
    with _command(argv) as result:
        scheduler.run_until(lambda: "code" in result)
    return result


def test_the_command_line_pauses_resizes_and_resumes_the_running_executor(
    start_executor: StartExecutor, state: Path
) -> None:
    ex = start_executor(parallelism=4)
    scheduler = Scheduler(ex)
    where = ["--state-dir", str(state), "--by", "alice"]
    ex.until_reported(lambda: any(state.glob("status.*.json")))

    paused = _run(scheduler, ["pause", *where])
    assert paused["code"] == 0, paused
    assert "pause: paused by alice at" in str(paused["out"])
    assert ": applied; parallelism 4 (configured 4)" in str(paused["out"])
    assert ex.slots_available == 0

    resized = _run(scheduler, ["resize", "--parallelism", "16", *where])
    assert resized["code"] == 0, resized
    assert "parallelism 16 (configured 4)" in str(resized["out"])
    assert ex.parallelism == 16

    resumed = _run(scheduler, ["resume", *where])
    assert resumed["code"] == 0, resumed
    assert ex.slots_available >= 16


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["resize", "--parallelism", "0"], "parallelism must be a whole number of at least 1"),
        (["resize", "--parallelism", "-3"], "parallelism must be a whole number of at least 1"),
        (["resize", "--queue", "gpu=2"], "queue 'gpu' has no limit in queue_limits"),
        (["resize", "--queue", "gpu"], "--queue takes NAME=N"),
        (["resize"], "resize needs --parallelism N or --queue NAME=N"),
        (["drain", "--deadline", "nan"], "a deadline is a number of seconds"),
        (["drain", "--deadline", "-1"], "a deadline is a number of seconds"),
    ],
)
def test_bad_input_is_refused_with_why_and_changes_nothing(
    start_executor: StartExecutor, state: Path, argv: list[str], said: str
) -> None:
    ex = start_executor(parallelism=4)
    scheduler = Scheduler(ex)
    ex.until_reported(lambda: any(state.glob("status.*.json")))
    result = _run(scheduler, [*argv, "--state-dir", str(state)])
    assert result["code"] == cli.BAD_INPUT, result
    assert said in str(result["err"])
    assert "nothing was changed" in str(result["err"])
    assert not (state / "control.json").exists()


def test_a_command_with_no_executor_running_says_so_and_changes_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    out = io.StringIO()
    with contextlib.redirect_stderr(out):
        code = cli.main(["pause", "--state-dir", str(state)])
    assert code == cli.NOT_APPLIED
    assert "no AsyncLocalExecutor without a team is running on this host" in out.getvalue()
    assert not (state / "control.json").exists()
