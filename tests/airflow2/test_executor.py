"""The executor on Airflow 2, driven as the 2.x scheduler drives it: commands in, states out.

The stub workload entry (tests/adapter/stub_workload.py) stands in for `airflow tasks run` (which needs the task's rows in a metadata database;
tests/airflow2/test_end_to_end.py runs the real one). Everything else is real: the executor, its loop
thread, both launch paths and the child processes.

The Airflow 3 tests' driver (tests/adapter/driver.py: the recording executor, the scheduler's loop, the
stub's gate) and stand-in for the scheduler's stop handler (tests/stop_handler.py) serve here too. The
tests are this major's own: its scheduler hands the executor commands (``queue_command``,
``execute_async``) for task instances read from its database, where Airflow 3's hands it workloads
(tests/adapter/test_executor.py), and it installs its stop handlers after the executor's start.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow.models.taskinstancekey import TaskInstanceKey
from airflow.utils.state import TaskInstanceState

from tests import stop_handler
from tests.adapter.driver import RecordingExecutor, Scheduler, held_pid, holding
from tests.core.helpers import alive
from tests.stop_handler import SchedulerStop


@pytest.fixture(autouse=True, params=["forkserver", "subprocess"])
def launcher(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here runs on both launch paths."""
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__LAUNCHER", str(request.param))
    return str(request.param)


class TI:
    """What the 2.x executor reads of a TaskInstance: its key and executor_config (a row needs a DB)."""

    def __init__(self, key: TaskInstanceKey, executor_config: Any = None) -> None:
        self.key = key
        self.executor_config = executor_config

    def __repr__(self) -> str:
        return f"<TaskInstance: {self.key.dag_id}.{self.key.task_id} {self.key.run_id}>"


def key(task_id: str) -> TaskInstanceKey:
    return TaskInstanceKey("adapter_dag", task_id, "manual__1", 1, -1)


def command(task_id: str) -> list[str]:
    return ["airflow", "tasks", "run", "adapter_dag", task_id, "manual__1", "--local", "--subdir", "DAGS"]


def queue_command(executor: RecordingExecutor, ti: TI, cmd: list[str]) -> None:
    # Airflow 2's hand-over; mypy reads Airflow 3, where it does not exist.
    getattr(executor, "queue_command")(ti, cmd, priority=1, queue="default")  # noqa: B009


def queue(executor: RecordingExecutor, task_id: str, executor_config: Any = None) -> TI:
    ti = TI(key(task_id), executor_config)
    queue_command(executor, ti, command(task_id))
    return ti


@pytest.fixture
def executor(request: pytest.FixtureRequest) -> Iterator[RecordingExecutor]:
    marker = request.node.get_closest_marker("parallelism")
    executor = RecordingExecutor(parallelism=marker.args[0] if marker else 4)
    executor.start()
    yield executor
    executor.end()


def test_commands_run_and_each_gets_one_final_state(executor: RecordingExecutor) -> None:
    for name in ("ok", "crash", "killed"):
        queue(executor, name)
    scheduler = Scheduler(executor)
    scheduler.run_until(lambda: len(scheduler.events) == 3)
    assert scheduler.events[key("ok")] == (TaskInstanceState.SUCCESS, None)
    state, info = scheduler.events[key("crash")]
    assert state == TaskInstanceState.FAILED
    assert "workload process crashed" in info
    state, info = scheduler.events[key("killed")]
    assert state == TaskInstanceState.FAILED
    assert "SIGKILL" in info
    assert executor.running == set()
    assert [k for k, *_ in executor.changes].count(key("ok")) == 1


@pytest.mark.parallelism(2)
def test_parallelism_bounds_what_runs(executor: RecordingExecutor, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    gate.touch()
    # Four tasks behind one gate: distinct keys (run ids), same behaviour.
    for i in range(4):
        ti = TI(TaskInstanceKey("adapter_dag", f"hold:{gate}", f"run_{i}", 1, -1))
        queue_command(executor, ti, command(f"hold:{gate}"))
    scheduler = Scheduler(executor)

    def state() -> Any:
        report = executor._runtime.report if executor._runtime else None
        return None if report is None else report.state

    scheduler.run_until(lambda: (s := state()) is not None and len(s.running) == 2 and s.waiting == 2)
    assert holding(gate) <= 2
    gate.unlink()
    scheduler.run_until(lambda: len(scheduler.events) == 4)
    assert {s for s, _ in scheduler.events.values()} == {TaskInstanceState.SUCCESS}


@pytest.mark.parallelism(0)
def test_parallelism_zero_means_unlimited(executor: RecordingExecutor, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    gate.touch()
    many = 12
    for i in range(many):
        ti = TI(TaskInstanceKey("adapter_dag", f"hold:{gate}", f"run_{i}", 1, -1))
        queue_command(executor, ti, command(f"hold:{gate}"))
    assert executor.slots_available > many
    scheduler = Scheduler(executor)
    scheduler.run_until(lambda: holding(gate) == many)
    gate.unlink()
    scheduler.run_until(lambda: len(scheduler.events) == many)
    assert {s for s, _ in scheduler.events.values()} == {TaskInstanceState.SUCCESS}


def test_bad_input_fails_unlaunched_and_says_why(executor: RecordingExecutor) -> None:
    wrong = TI(key("not_a_task_run"))
    queue_command(executor, wrong, ["airflow", "dags", "list"])
    queue(executor, "bad_timeout", executor_config={"async_local_executor": {"task_timeout": "soon"}})
    queue(executor, "ok")
    scheduler = Scheduler(executor)
    scheduler.run_until(lambda: len(scheduler.events) == 3)
    state, info = scheduler.events[key("not_a_task_run")]
    assert state == TaskInstanceState.FAILED
    assert info.startswith("not launched: not an `airflow tasks run` command")
    state, info = scheduler.events[key("bad_timeout")]
    assert state == TaskInstanceState.FAILED
    assert info.startswith('not launched: executor_config["async_local_executor"]["task_timeout"]')
    assert scheduler.events[key("ok")] == (TaskInstanceState.SUCCESS, None)
    assert executor.running == set()


def test_execute_async_called_directly_runs_the_command(executor: RecordingExecutor) -> None:
    executor.execute_async(key=key("ok"), command=command("ok"))
    scheduler = Scheduler(executor)
    scheduler.run_until(lambda: key("ok") in scheduler.events)
    assert scheduler.events[key("ok")] == (TaskInstanceState.SUCCESS, None)


def _held(executor: RecordingExecutor, gate: Path, scheduler: Scheduler) -> tuple[TI, int]:
    gate.touch()
    ti = queue(executor, f"hold:{gate}")
    scheduler.run_until(lambda: holding(gate) == 1)
    return ti, held_pid(gate)


def test_revoke_task_stops_the_process_without_an_event(executor: RecordingExecutor, tmp_path: Path) -> None:
    scheduler = Scheduler(executor)
    ti, pid = _held(executor, tmp_path / "gate", scheduler)
    executor.revoke_task(ti=ti)  # type: ignore[arg-type]
    scheduler.run_until(lambda: not alive(pid))
    # A later task runs: the revoked one's exit is drained and produces nothing.
    queue(executor, "ok")
    scheduler.run_until(lambda: key("ok") in scheduler.events)
    assert ti.key not in scheduler.events
    assert executor.running == set()
    # Revoked before it was handed to the loop: just forgotten.
    waiting = queue(executor, "never")
    executor.revoke_task(ti=waiting)  # type: ignore[arg-type]
    assert waiting.key not in executor.queued_tasks


def test_cleanup_stuck_queued_tasks_stops_and_fails_them(executor: RecordingExecutor, tmp_path: Path) -> None:
    scheduler = Scheduler(executor)
    ti, pid = _held(executor, tmp_path / "gate", scheduler)
    readable = executor.cleanup_stuck_queued_tasks([ti])  # type: ignore[list-item]
    assert readable == [repr(ti)]
    scheduler.run_until(lambda: not alive(pid))
    queue(executor, "ok")
    scheduler.run_until(lambda: key("ok") in scheduler.events)
    assert scheduler.events[ti.key] == (TaskInstanceState.FAILED, "stuck in queued")
    assert [k for k, *_ in executor.changes].count(ti.key) == 1
    assert executor.running == set()


def test_nothing_is_left_running_after_end(executor: RecordingExecutor, tmp_path: Path) -> None:
    scheduler = Scheduler(executor)
    _, pid = _held(executor, tmp_path / "gate", scheduler)
    executor.terminate()
    assert not alive(pid)


def test_the_scheduler_names_its_stop_handler_and_its_loop_as_stop_signals_expects() -> None:
    stop_handler.the_scheduler_names_its_stop_handler_and_its_loop_as_expected()


def test_a_stop_during_the_first_adoption_after_start_is_held_until_the_heartbeat(
    executor: RecordingExecutor,
) -> None:
    # Airflow 2 installs its stop handlers after the executor's start(): the adoption Airflow asks for
    # first, inside its database transaction, already holds them.
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    stop = SchedulerStop()
    try:
        for sig in before:
            signal.signal(sig, stop._exit_gracefully)
        assert executor.try_adopt_task_instances([]) == []
        signal.raise_signal(signal.SIGTERM)  # here: inside the adoption's transaction, for the scheduler
        assert stop.stops == []
        with pytest.raises(SystemExit):
            executor.heartbeat()
        assert stop.stops == [signal.SIGTERM]
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_a_misspelt_option_is_warned_of_at_start_and_its_default_kept(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Airflow 2's configuration parser, read as the executor reads it at start.
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__TERMINATION_GRACE_PERIOD_CMD", "echo 5")
    executor = RecordingExecutor(parallelism=1)
    with caplog.at_level("WARNING", logger="async_local_executor"):
        executor.start()
    try:
        said = [r.getMessage() for r in caplog.records if "TERMINATION_GRACE_PERIOD_CMD" in r.getMessage()]
        expected = (
            "TERMINATION_GRACE_PERIOD_CMD (AIRFLOW__ASYNC_LOCAL_EXECUTOR__TERMINATION_GRACE_PERIOD_CMD) is not "
            "an option of [async_local_executor] and is ignored; did you mean termination_grace_period?"
        )
        assert said == [expected]
        assert executor._config.termination_grace_period == 10.0  # Airflow runs no command for it
    finally:
        executor.end()


def _held_while_paused(executor: RecordingExecutor, scheduler: Scheduler, folder: Path) -> tuple[TI, Path]:
    """A task handed to the paused executor: it waits inside it, not started. Its task and gate."""
    gate = folder / "gate"
    gate.touch()
    ti = queue(executor, f"hold:{gate}")
    scheduler.loop_once()
    runtime = executor._runtime
    assert runtime is not None
    executor.until_reported(lambda: runtime.report is not None and runtime.report.state.waiting == 1)
    assert holding(gate) == 0
    return ti, gate


def test_pause_resume_and_drain_on_a_started_2_11_executor(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The Airflow CLI's commands (Airflow 2's cli_config builds them), acting on a started executor
    # whose heartbeat this loop runs; its own state directory, as a pause lasts until resumed.
    import argparse
    import threading

    state = tmp_path / "state"
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__STATE_DIR", str(state))
    [group] = RecordingExecutor.get_cli_commands()
    commands = {command.name: command for command in group.subcommands}
    executor = RecordingExecutor(parallelism=2)
    executor.start()
    scheduler = Scheduler(executor)

    def run(name: str, *argv: str) -> None:
        parser = argparse.ArgumentParser()
        for arg in commands[name].args:
            arg.add_to_parser(parser)
        done = threading.Event()

        def call() -> None:
            try:
                commands[name].func(parser.parse_args([*argv, "--state-dir", str(state)]))
            finally:
                done.set()

        thread = threading.Thread(target=call)
        thread.start()
        scheduler.run_until(done.is_set)
        thread.join()

    try:
        executor.until_reported(lambda: any(state.glob("status.*.json")))
        run("pause")
        assert executor.slots_available == 0
        ti, gate = _held_while_paused(executor, scheduler, tmp_path)
        run("resume")
        scheduler.run_until(lambda: holding(gate) == 1)
        run("drain")
        assert executor.slots_available == 0
        gate.unlink()
        scheduler.run_until(
            lambda: executor._live is not None and executor._live.fields()["mode"] == "drained"
        )
        assert scheduler.events[ti.key][0] == TaskInstanceState.SUCCESS
    finally:
        executor.end()


def test_with_no_limit_a_pause_holds_and_a_resize_sets_one_then_goes_back_to_none(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # parallelism 0 is no limit on Airflow 2 (Airflow 3 refuses it): live control works beside it.
    import time

    from async_local_executor.ops import control

    state = tmp_path / "state"
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__STATE_DIR", str(state))
    executor = RecordingExecutor(parallelism=0)
    executor.start()
    scheduler = Scheduler(executor)

    def applied(edit: Any) -> None:
        serial = control.change(state, None, edit).serial
        scheduler.run_until(lambda: executor._live is not None and executor._live.control.serial == serial)

    try:
        applied(control.pause("alice", time.time()))
        assert "the control file asks for" not in caplog.text
        assert executor.slots_available == 0
        ti, gate = _held_while_paused(executor, scheduler, tmp_path)
        for limit in (3, 0):
            applied(
                control.resize(
                    "alice",
                    time.time(),
                    parallelism=limit,
                    queues={},
                    configured_parallelism=0,
                    configured_queues={},
                )
            )
            assert executor.parallelism == limit
        assert executor.parallelism == 0
        applied(control.resume("alice", time.time()))
        scheduler.run_until(lambda: holding(gate) == 1)
        gate.unlink()
        scheduler.run_until(lambda: ti.key in scheduler.events)
        assert scheduler.events[ti.key][0] == TaskInstanceState.SUCCESS
    finally:
        executor.end()
