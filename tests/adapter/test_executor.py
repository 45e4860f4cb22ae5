"""The executor driven as the scheduler drives it, with real workload objects and real child processes.

The workload entry is a stub (tests/adapter/stub_workload.py) because no api-server runs here; the real
entry and a real Airflow are exercised by tests/e2e.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from airflow.models.connection_test import ConnectionTestState
from airflow.utils.state import CallbackState, TaskInstanceState

from async_local_executor.adapter import startup
from async_local_executor.adapter.executor import AsyncLocalExecutor
from async_local_executor.adapter.workload import entry
from async_local_executor.core.errors import RuntimeNotRunning
from async_local_executor.core.proc_identity import start_ticks
from async_local_executor.ops import journal
from tests.adapter import workloads
from tests.adapter.conftest import StartExecutor
from tests.adapter.driver import GUARD, RecordingExecutor, Scheduler, held_pid, holding, loop_threads, queue

# Only a hang trips it: hundreds to thousands of real processes on 2 cores the rest of the suite shares.
BURST_GUARD = 600.0


def _learn_dir(ex: RecordingExecutor) -> str:
    """Where the started ``ex``'s tasks record what they import ("": they record nothing)."""
    assert ex._settings is not None
    return ex._settings.plan.learn_dir


@pytest.fixture
def executor(start_executor: StartExecutor) -> RecordingExecutor:
    return start_executor(parallelism=4)


def test_flags_airflow_reads() -> None:
    assert AsyncLocalExecutor.is_local
    assert AsyncLocalExecutor.serve_logs
    assert AsyncLocalExecutor.supports_callbacks
    assert AsyncLocalExecutor.supports_connection_test
    assert AsyncLocalExecutor.supports_multi_team


def test_init_starts_no_thread() -> None:
    before = len(loop_threads())
    AsyncLocalExecutor(parallelism=4)
    assert len(loop_threads()) == before


def test_scheduler_loads_it_from_the_configured_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.executors import executor_loader
    from airflow.executors.executor_loader import ExecutorLoader

    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "async_local_executor.AsyncLocalExecutor")
    monkeypatch.setattr(executor_loader, "_executor_names", [])  # the loader caches names per process
    [name] = ExecutorLoader.get_executor_names(validate_teams=False)
    cls, _ = ExecutorLoader.import_executor_cls(name)
    assert cls is AsyncLocalExecutor


def test_task_outcomes_map_to_success_and_failure_with_reasons(executor: RecordingExecutor) -> None:
    ok, crash, killed = workloads.task("ok"), workloads.task("crash"), workloads.task("killed")
    queue(executor, ok, crash, killed)
    scheduler = Scheduler(executor)
    scheduler.run_until(lambda: len(scheduler.events) == 3)
    assert scheduler.events[ok.key] == (TaskInstanceState.SUCCESS, None)
    state, info = scheduler.events[crash.key]
    assert state == TaskInstanceState.FAILED
    assert "crashed" in info
    assert scheduler.events[killed.key] == (TaskInstanceState.FAILED, "killed by SIGKILL")
    assert executor.running == set()
    assert not executor.queued_tasks


def test_a_task_whose_instance_is_gone_ends_without_failing_and_nothing_else_does(
    executor: RecordingExecutor,
) -> None:
    # The scheduler applies an event to whichever task instance holds the key now: after a clear, that
    # is the restarting one, which a failure would fail and an end lets run again.
    task, conn = workloads.task("gone"), workloads.connection_test("gone")
    assert entry.EXIT_TI_GONE == 4  # what the stub returns
    queue(executor, task, conn)
    scheduler = Scheduler(executor)
    scheduler.run_until(lambda: not executor.running and not executor.queued_connection_tests)
    state, info = scheduler.events[task.key]
    assert state == TaskInstanceState.SUCCESS
    assert "cleared" in info
    assert [s for k, s, _, _ in executor.changes if k == conn.key][-1] == ConnectionTestState.FAILED


def test_callbacks_and_connection_tests_report_running_first(executor: RecordingExecutor) -> None:
    cb, conn = workloads.callback(), workloads.connection_test("ok")
    queue(executor, cb, conn)
    scheduler = Scheduler(executor)
    scheduler.run_until(lambda: not executor.queued_callbacks and not executor.running)
    assert [(s, r) for k, s, _, r in executor.changes if k == cb.key] == [
        (CallbackState.RUNNING, False),
        (CallbackState.SUCCESS, True),
    ]
    assert [(s, r) for k, s, _, r in executor.changes if k == conn.key] == [
        (ConnectionTestState.RUNNING, False),
        (ConnectionTestState.SUCCESS, True),
    ]
    assert not executor.queued_callbacks
    assert not executor.queued_connection_tests


# Far more than the two slots and the two prefetched: the rest wait in Airflow's queue, each launch path
# dispatches them wave after wave (each a fresh interpreter on the plain path).
QUEUED_AT_TWO = 100


def test_parallelism_is_enforced_and_heartbeat_never_waits_for_children(
    start_executor: StartExecutor, gate: Path
) -> None:
    ex = start_executor(parallelism=2)  # prefetch_multiplier defaults to 1: 2 more accepted
    items = [workloads.task(f"hold:{gate}", map_index=i) for i in range(QUEUED_AT_TWO)]
    queue(ex, *items)
    scheduler = Scheduler(ex)
    scheduler.loop_once()  # every child blocks until the gate goes: returning proves no wait
    assert len(ex.running) == 4  # two running, two waiting inside the executor for a slot
    assert len(ex.queued_tasks) == QUEUED_AT_TWO - 4
    assert ex.slots_available == 2 + 2 - 4 - (QUEUED_AT_TWO - 4)
    scheduler.run_until(lambda: holding(gate) == 2)
    scheduler.loop_once()
    assert len(ex.running) == 4  # no room left: nothing more accepted while both run
    assert holding(gate) == 2  # the prefetched two wait for a slot, they do not start
    assert all(ex.has_task(w.ti) for w in items)  # type: ignore[arg-type]
    gate.unlink()
    scheduler.run_until(lambda: len(scheduler.events) == QUEUED_AT_TWO, guard=BURST_GUARD)
    ex.end()
    assert {state for state, _ in scheduler.events.values()} == {TaskInstanceState.SUCCESS}
    assert ex.running == set()


# The default launch path only: the plain path's dispatch is covered by the test above.
# 1,500 queued at parallelism 256 crosses every limit the stock executor's burst deadlock did (more
# queued than slots and prefetch together, a full wave of slots exiting at once, waves after it) in a
# third of the time 5,000 took; the benchmark suite's dispatch case k5000-p256 (--profile full) drives
# the full size.
QUEUED = 1500


@pytest.mark.parametrize("launcher", ["forkserver"], indirect=True)
def test_1500_queued_at_parallelism_256_heartbeat_keeps_returning(
    start_executor: StartExecutor, launcher: str, gate: Path
) -> None:
    # The stock executor's burst deadlock (a full pipe between scheduler and workers) at test size.
    # Returning is the assertion; how fast it returns is the dispatch benchmark's figure.
    ex = start_executor(parallelism=256)
    items = [workloads.task(f"hold:{gate}", map_index=i) for i in range(QUEUED)]
    queue(ex, *items)
    scheduler = Scheduler(ex)
    scheduler.loop_once()
    assert len(ex.running) == 512  # 256 slots and as many prefetched
    assert len(ex.queued_tasks) == QUEUED - 512
    scheduler.run_until(lambda: holding(gate) == 256, guard=BURST_GUARD)
    scheduler.loop_once()
    assert holding(gate) == 256  # every slot taken, no process beyond parallelism
    assert len(ex.running) == 512
    gate.unlink()  # all 256 exit at once, and the rest follow in waves
    scheduler.run_until(lambda: len(scheduler.events) == QUEUED, guard=BURST_GUARD)
    ex.end()
    assert {state for state, _ in scheduler.events.values()} == {TaskInstanceState.SUCCESS}
    assert ex.running == set()
    assert len(scheduler.heartbeat_seconds) > 2


def test_the_schedulers_own_cap_leaves_room_for_the_prefetch(
    start_executor: StartExecutor, gate: Path
) -> None:
    # The scheduler queues at most [core] parallelism minus every executor's slots_occupied.
    ex = start_executor(parallelism=2)  # prefetch_multiplier 1: two more may wait here
    queue(ex, *[workloads.task(f"hold:{gate}", map_index=i) for i in range(2)])
    scheduler = Scheduler(ex)
    scheduler.run_until(lambda: holding(gate) == 2)
    assert ex.parallelism - ex.slots_occupied == 2  # both slots taken; room for two prefetched
    queue(ex, *[workloads.task(f"hold:{gate}", map_index=i) for i in range(2, 4)])
    scheduler.loop_once()
    assert len(ex.running) == 4
    assert ex.parallelism - ex.slots_occupied == 0
    assert holding(gate) == 2
    gate.unlink()
    scheduler.run_until(lambda: len(scheduler.events) == 4)


def test_without_prefetch_the_executor_accepts_only_free_slots(
    start_executor: StartExecutor, monkeypatch: pytest.MonkeyPatch, gate: Path
) -> None:
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__PREFETCH_MULTIPLIER", "0")
    ex = start_executor(parallelism=2)
    queue(ex, *[workloads.task(f"hold:{gate}", map_index=i) for i in range(5)])
    scheduler = Scheduler(ex)
    scheduler.loop_once()
    assert len(ex.running) == 2
    assert ex.slots_available == 2 - 2 - 3
    gate.unlink()
    scheduler.run_until(lambda: len(scheduler.events) == 5)


def test_prefetch_shrinks_once_tasks_run_longer_than_half_the_queued_timeout(
    start_executor: StartExecutor, monkeypatch: pytest.MonkeyPatch, gate: Path
) -> None:
    # The scheduler revokes a task queued longer than this; a prefetched task counts as queued.
    monkeypatch.setenv("AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT", "1")
    ex = start_executor(parallelism=2)
    items = [workloads.task(f"hold:{gate}", map_index=i) for i in range(2)]
    queue(ex, *items)
    scheduler = Scheduler(ex)
    scheduler.loop_once()
    assert ex.slots_available == 2 + 2 - 2  # both running; room for the two prefetched
    scheduler.run_until(lambda: holding(gate) == 2)
    # Both have now run for longer than half the timeout: a workload waiting for one of their slots
    # could be revoked, so the executor stops offering any beyond the free slots.
    scheduler.run_until(lambda: ex.slots_available == 0)
    gate.unlink()
    scheduler.run_until(lambda: len(scheduler.events) == 2)
    assert ex.slots_available == 2  # they took about that long: no prefetch while that holds


def test_token_never_in_argv_or_environment(executor: RecordingExecutor, gate: Path) -> None:
    held = workloads.task(f"hold:{gate}")
    queue(executor, held)
    scheduler = Scheduler(executor)
    scheduler.run_until(lambda: holding(gate) == 1)
    workload_pid = held_pid(gate)
    # The workload's own process, and (fork server) the helper that forked it: every process we start.
    ours = [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
    assert workload_pid in {p.pid for p in ours}
    for proc in ours:
        assert workloads.TOKEN not in " ".join(proc.cmdline())
        assert workloads.TOKEN not in " ".join(f"{k}={v}" for k, v in proc.environ().items())
    gate.unlink()
    scheduler.run_until(lambda: held.key in scheduler.events)


def test_launch_failure_fails_the_workload_and_the_executor_carries_on(
    start_executor: StartExecutor, launcher: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A missing interpreter is a plain-launch failure; the fork server's own failures are in tests/core.
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__LAUNCHER", "subprocess")
    monkeypatch.setenv("AIRFLOW__LOGGING__BASE_LOG_FOLDER", str(tmp_path))
    ex = start_executor(parallelism=2, argv=("/nonexistent/python3",))
    broken = workloads.task("ok", log_path="dag_id=adapter_dag/attempt=1.log")
    queue(ex, broken)
    scheduler = Scheduler(ex)
    scheduler.run_until(lambda: broken.key in scheduler.events)
    state, info = scheduler.events[broken.key]
    assert state == TaskInstanceState.FAILED
    assert info.startswith("not launched: cannot start '/nonexistent/python3'")
    # The task's own log says why (it has no process to say it), and so does the audit log.
    task_log = tmp_path / "dag_id=adapter_dag" / "attempt=1.log"
    scheduler.run_until(lambda: task_log.exists() and task_log.read_text().endswith("\n"))
    [line] = task_log.read_text().splitlines()
    record = json.loads(line)
    assert record["level"] == "error"
    assert record["event"] == f"The executor could not run this task: {info}"
    [audit] = list(ex._task_event_logs)
    assert (audit.event, audit.extra, audit.task_id) == ("executor launch failed", info, "ok")
    ex.argv = RecordingExecutor.argv  # the cause goes away: the next workload runs
    ex._argv = ex._child_argv()
    fine = workloads.task("ok", map_index=1)
    queue(ex, fine)
    scheduler.run_until(lambda: fine.key in scheduler.events)
    assert scheduler.events[fine.key] == (TaskInstanceState.SUCCESS, None)


def test_end_waits_up_to_its_bound_then_terminates_and_joins(
    start_executor: StartExecutor, monkeypatch: pytest.MonkeyPatch, gate: Path
) -> None:
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__SHUTDOWN_TIMEOUT", "0")
    ex = start_executor(parallelism=1)
    running, waiting = workloads.task(f"hold:{gate}"), workloads.task(f"hold:{gate}", map_index=1)
    queue(ex, running, waiting)
    scheduler = Scheduler(ex)
    scheduler.run_until(lambda: holding(gate) == 1)
    ex.end()
    events = ex.get_event_buffer()
    state, info = events[running.key]
    assert state == TaskInstanceState.FAILED
    assert info == "executor shut down: terminated (killed by SIGTERM)"
    assert ex.running == set()
    assert loop_threads() == []
    assert _child_pids() == []


def test_terminate_does_not_wait(start_executor: StartExecutor, gate: Path) -> None:
    ex = start_executor(parallelism=2)
    held = workloads.task(f"hold:{gate}")
    queue(ex, held)
    scheduler = Scheduler(ex)
    scheduler.run_until(lambda: holding(gate) == 1)
    ex.terminate()
    state, info = ex.get_event_buffer()[held.key]
    assert state == TaskInstanceState.FAILED
    assert "terminated" in info
    assert loop_threads() == []


def _child_pids() -> list[int]:
    children = psutil.Process().children(recursive=True)
    return [p.pid for p in children if p.status() != psutil.STATUS_ZOMBIE]


def test_a_team_executor_uses_its_own_api_url_and_options(
    start_executor: StartExecutor, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("AIRFLOW__TEAM_A___CORE__EXECUTION_API_SERVER_URL", "http://team-a.invalid/execution/")
    monkeypatch.setenv("AIRFLOW__TEAM_A___ASYNC_LOCAL_EXECUTOR__SHUTDOWN_TIMEOUT", "3")
    caplog.set_level(logging.DEBUG, logger="async_local_executor.child")  # every line of the children
    ex = start_executor(parallelism=2, team_name="team_a")
    assert ex._config.shutdown_timeout == 3.0
    item = workloads.task("ok")
    queue(ex, item)
    scheduler = Scheduler(ex)
    scheduler.run_until(lambda: item.key in scheduler.events)
    ex.end()
    assert any("server=http://team-a.invalid/execution/" in r.getMessage() for r in caplog.records)


def test_two_teams_executors_learn_apart_in_one_state_directory(
    start_executor: StartExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launcher: str
) -> None:
    state = tmp_path / "state"
    # One state directory, as two teams get when neither sets its own.
    for prefix in ("AIRFLOW__", "AIRFLOW__TEAM_A___"):
        monkeypatch.setenv(f"{prefix}ASYNC_LOCAL_EXECUTOR__STATE_DIR", str(state))
        monkeypatch.setenv(f"{prefix}ASYNC_LOCAL_EXECUTOR__LAUNCHER", launcher)
    ours = start_executor(parallelism=1)
    theirs = start_executor(parallelism=1, team_name="team_a")
    theirs.end()
    ours.end()
    if launcher != "forkserver":
        assert _learn_dir(ours) == _learn_dir(theirs) == ""  # nothing to learn for
        return
    # Each reads only the records its own tasks wrote, and keeps its own learned set.
    assert _learn_dir(ours) == str(state / "imports" / "no-team")
    assert _learn_dir(theirs) == str(state / "imports" / "team-team_a")
    assert sorted(p.name for p in (state / "imports").iterdir()) == ["no-team", "team-team_a"]


@pytest.mark.parametrize(
    ("team", "name"),
    [(None, "no-team"), ("a-b_c.1", "team-a-b_c.1"), ("../x", None), ("x/y", None), ("", "no-team")],
)
def test_a_team_s_learning_directory_is_one_name_under_imports(team: str | None, name: str | None) -> None:
    path = Path(startup.learn_dir(Path("/s"), team))
    assert path.parent == Path("/s/imports")
    if name is None:  # not a safe file name: a digest of it
        assert re.fullmatch(r"team-[0-9a-f]{16}", path.name)
    else:
        assert path.name == name


def _gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def test_revoke_before_the_loop_saw_it_drops_it_without_an_event(executor: RecordingExecutor) -> None:
    item = workloads.task("ok")
    queue(executor, item)
    executor.revoke_task(ti=workloads.Revoked(item.key))  # type: ignore[arg-type]
    assert not executor.queued_tasks
    scheduler = Scheduler(executor)
    scheduler.loop_once()
    assert executor.running == set()
    assert scheduler.events == {}


def test_revoke_of_a_waiting_or_running_workload_stops_it_and_reports_nothing(
    start_executor: StartExecutor, caplog: pytest.LogCaptureFixture, gate: Path
) -> None:
    caplog.set_level(logging.INFO)
    ex = start_executor(parallelism=1)  # prefetch 1: one runs, one waits inside the executor
    running, waiting = workloads.task(f"hold:{gate}"), workloads.task(f"hold:{gate}", map_index=1)
    queue(ex, running, waiting)
    scheduler = Scheduler(ex)
    scheduler.run_until(lambda: holding(gate) == 1)
    pid = held_pid(gate)
    ex.revoke_task(ti=workloads.Revoked(waiting.key))  # type: ignore[arg-type]
    ex.revoke_task(ti=workloads.Revoked(running.key))  # type: ignore[arg-type]
    assert ex.running == set()
    scheduler.run_until(lambda: caplog.text.count("revoked workload") == 2)
    assert _gone(pid)
    assert holding(gate) == 1  # the waiting one never started
    assert scheduler.events == {}
    after = workloads.task("ok", map_index=2)
    queue(ex, after)
    scheduler.run_until(lambda: after.key in scheduler.events)
    ex.end()
    assert scheduler.events == {after.key: (TaskInstanceState.SUCCESS, None)}


def test_a_key_queued_again_after_revoke_gets_its_own_outcome(
    start_executor: StartExecutor, caplog: pytest.LogCaptureFixture, gate: Path
) -> None:
    caplog.set_level(logging.INFO)
    ex = start_executor(parallelism=2)
    first = workloads.task(f"hold:{gate}")
    queue(ex, first)
    scheduler = Scheduler(ex)
    scheduler.run_until(lambda: holding(gate) == 1)
    ex.revoke_task(ti=workloads.Revoked(first.key))  # type: ignore[arg-type]
    # The scheduler requeues the same try (same key) while the first process is being stopped.
    again = workloads.task(f"hold:{gate}")
    assert again.key == first.key
    queue(ex, again)
    scheduler.run_until(lambda: holding(gate) == 2 and "revoked workload" in caplog.text)
    gate.unlink()
    scheduler.run_until(lambda: first.key in scheduler.events)
    ex.end()
    # One change for the key, the second submission's: the revoked one's end was not taken for it.
    assert [(state, info) for key, state, info, _ in ex.changes if key == first.key] == [
        (TaskInstanceState.SUCCESS, None)
    ]


def test_a_dead_loop_thread_stops_the_scheduler_loudly(
    start_executor: StartExecutor,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__STATE_DIR", str(tmp_path))
    ex = start_executor(parallelism=2)
    runtime = ex._runtime
    assert runtime is not None

    def crash(*_: object) -> None:
        raise RuntimeError("injected fault in the loop thread")

    # Fault injection: an operation that raises kills the loop, as a bug of ours would.
    runtime._post(crash)
    [thread] = loop_threads()
    thread.join(GUARD)
    assert not thread.is_alive()
    with pytest.raises(RuntimeNotRunning, match="event loop thread died"):
        Scheduler(ex).loop_once()
    assert "event loop thread is dead" in caplog.text
    ex.end()  # still returns: nothing left to wait for
    # What the dead loop launched may still run: the next scheduler reclaims it through the journal.
    assert list(tmp_path.glob(f"*{journal.SUFFIX}"))


def test_task_timeout_from_executor_config_fails_the_task_with_the_reason(
    executor: RecordingExecutor, gate: Path
) -> None:
    slow = workloads.task(f"hold:{gate}", executor_config={"async_local_executor": {"task_timeout": 0.5}})
    bad = workloads.task("ok", executor_config={"async_local_executor": {"task_timeout": "soon"}})
    fine = workloads.task("ok", map_index=1)
    queue(executor, slow, bad, fine)
    scheduler = Scheduler(executor)
    scheduler.run_until(lambda: len(scheduler.events) == 3)
    state, info = scheduler.events[slow.key]
    assert state == TaskInstanceState.FAILED
    assert info.startswith("timed out after 0.5s: terminated (killed by SIG")
    state, info = scheduler.events[bad.key]
    assert state == TaskInstanceState.FAILED
    assert "must be a number of seconds >= 0, got 'soon'" in info
    assert scheduler.events[fine.key] == (TaskInstanceState.SUCCESS, None)
    assert holding(gate) == 1  # the bad one was never launched; the slow one was


def test_queue_limits_apply_to_each_task_queue(
    start_executor: StartExecutor, monkeypatch: pytest.MonkeyPatch, gate: Path
) -> None:
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__QUEUE_LIMITS", "reports:1")
    ex = start_executor(parallelism=4)
    reports = [workloads.task(f"hold:{gate}", map_index=i, queue="reports") for i in range(3)]
    others = [workloads.task(f"hold:{gate}", map_index=10 + i) for i in range(2)]
    queue(ex, *reports, *others)
    scheduler = Scheduler(ex)
    # One "reports" task and both "default" ones run; the other two reports tasks wait.
    scheduler.run_until(lambda: holding(gate) == 3)
    scheduler.loop_once()
    assert holding(gate) == 3
    gate.unlink()
    scheduler.run_until(lambda: len(scheduler.events) == 5)
    ex.end()
    assert {state for state, _ in scheduler.events.values()} == {TaskInstanceState.SUCCESS}


def test_running_launches_are_journaled_and_marked_and_a_clean_end_removes_the_journal(
    start_executor: StartExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gate: Path
) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__STATE_DIR", str(state))
    ex = start_executor(parallelism=2)
    held = workloads.task(f"hold:{gate}")
    queue(ex, held)
    scheduler = Scheduler(ex)
    scheduler.run_until(lambda: holding(gate) == 1)
    workload_pid = held_pid(gate)
    [launches] = state.glob(f"*{journal.SUFFIX}")
    # The supervisor's listener journals the start before the scheduler thread hears of it.
    scheduler.run_until(lambda: str(workload_pid) in launches.read_text())
    header, *lines = [json.loads(line) for line in launches.read_text().splitlines()]
    assert [(e["+"], e["key"]) for e in lines] == [(workload_pid, f"adapter_dag.hold:{gate} try 1")]
    assert psutil.Process(workload_pid).environ()[journal.INSTANCE_ENV] == header["instance"]
    gate.unlink()
    scheduler.run_until(lambda: held.key in scheduler.events)
    ex.end()
    # What tasks were seen to import (fork server only) is kept on purpose, for the next scheduler, and
    # so is the custody directory, where handed-over workloads meet their next owner: empty here.
    assert {p.name for p in state.iterdir()} <= {"imports", "custody"}
    assert not any((state / "custody").iterdir())


def test_start_kills_what_a_crashed_executor_left_running_before_launching(
    start_executor: StartExecutor,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__STATE_DIR", str(state))
    # A crashed executor's leftovers: one recorded workload process, and one unrecorded process that
    # only carries its mark. Nothing holds the journal's lock, as after a kill -9.
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    marked = {**os.environ, journal.INSTANCE_ENV: "crashed"}
    recorded = subprocess.Popen(sleep, env=marked, start_new_session=True)
    descendant = subprocess.Popen(sleep, env=marked, start_new_session=True)
    try:
        entries = [
            {"instance": "crashed", "owner": "scheduler pid 1", "pid": 1, "opened": 0},
            {"+": recorded.pid, "start_ticks": start_ticks(recorded.pid), "key": "old.task try 3"},
        ]
        (state / f"crashed{journal.SUFFIX}").write_text("".join(json.dumps(e) + "\n" for e in entries))
        caplog.set_level(logging.WARNING, logger="async_local_executor.ops.recovery")
        start_executor(parallelism=1)
        assert recorded.wait(GUARD) == -signal.SIGKILL
        assert descendant.wait(GUARD) == -signal.SIGKILL
        messages = [r.getMessage() for r in caplog.records]
        assert f"killed pid {recorded.pid} (old.task try 3) left running by a stopped executor" in (
            "\n".join(messages)
        )
        assert any(f"killed pid {descendant.pid} (started by one of its workloads)" in m for m in messages)
        assert not (state / f"crashed{journal.SUFFIX}").exists()
    finally:
        for proc in (recorded, descendant):
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_tasks_record_their_imports_only_when_preload_is_auto(
    start_executor: StartExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__STATE_DIR", str(state))
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__PRELOAD", mode)
    ex = start_executor(parallelism=2)
    queue(ex, workloads.task("ok"))
    scheduler = Scheduler(ex)
    scheduler.run_until(lambda: len(scheduler.events) == 1)
    learning = bool(_learn_dir(ex))  # what the real entry's argv carries (the stub's has no flags)
    recorded_in = (state / "imports").is_dir()
    ex.end()
    assert {state for state, _ in scheduler.events.values()} == {TaskInstanceState.SUCCESS}
    # off: the workload's command line and the state directory are what they were before learning.
    assert entry.argv_flags(1, "auto", _learn_dir(ex))[4:] == (
        ("--learn-imports", _learn_dir(ex)) if learning else ()
    )
    assert learning is (mode == "auto" and ex._config.launcher.value == "forkserver")
    assert recorded_in is learning
