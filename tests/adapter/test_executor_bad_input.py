"""What a task carries cannot take the scheduler down: each bad value fails that task alone, unlaunched,
with the reason, and the executor goes on serving the others.

Driven the way the scheduler drives the executor (queue_workload, heartbeat, get_event_buffer), with the
real executor and the stub child. The launch path does not matter here, so one is enough.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow.models.taskinstancekey import TaskInstanceKey
from airflow.utils.state import TaskInstanceState

from async_local_executor.adapter import intake, validation
from async_local_executor.adapter.metrics import Metrics
from tests.adapter import workloads
from tests.adapter.driver import RecordingExecutor, Scheduler, final_events, queue
from tests.adapter.workloads import with_config

pytestmark = [
    pytest.mark.usefixtures("launcher"),
    pytest.mark.parametrize("launcher", ["forkserver"], indirect=True),
]

OURS = "async_local_executor"
TIMEOUT_REASON = f'not launched: executor_config["{OURS}"]["task_timeout"] must be a number of seconds >= 0'
SECTION_REASON = f'not launched: executor_config["{OURS}"] must be a dict'

# (id, executor_config, the state it ends in, the start of its reason)
SHAPES: list[tuple[str, Any, TaskInstanceState, str | None]] = [
    ("huge-int", {OURS: {"task_timeout": 10**400}}, TaskInstanceState.FAILED, TIMEOUT_REASON),
    ("nan", {OURS: {"task_timeout": math.nan}}, TaskInstanceState.FAILED, TIMEOUT_REASON),
    ("inf", {OURS: {"task_timeout": math.inf}}, TaskInstanceState.FAILED, TIMEOUT_REASON),
    ("minus-inf", {OURS: {"task_timeout": -math.inf}}, TaskInstanceState.FAILED, TIMEOUT_REASON),
    ("negative", {OURS: {"task_timeout": -1}}, TaskInstanceState.FAILED, TIMEOUT_REASON),
    ("text", {OURS: {"task_timeout": "abc"}}, TaskInstanceState.FAILED, TIMEOUT_REASON),
    ("bool", {OURS: {"task_timeout": True}}, TaskInstanceState.FAILED, TIMEOUT_REASON),
    ("none", {OURS: {"task_timeout": None}}, TaskInstanceState.FAILED, TIMEOUT_REASON),
    ("nested-dict", {OURS: {"task_timeout": {"s": 1}}}, TaskInstanceState.FAILED, TIMEOUT_REASON),
    ("huge-text", {OURS: {"task_timeout": "1e400"}}, TaskInstanceState.FAILED, TIMEOUT_REASON),
    ("section-list", {OURS: []}, TaskInstanceState.FAILED, SECTION_REASON),
    ("section-text", {OURS: "task_timeout=5"}, TaskInstanceState.FAILED, SECTION_REASON),
    # Not ours to judge: the top level belongs to every executor, and keys we do not know are ignored.
    ("config-list", [OURS, {"task_timeout": 1}], TaskInstanceState.SUCCESS, None),
    ("config-text", "async_local_executor", TaskInstanceState.SUCCESS, None),
    ("unknown-key", {OURS: {"task_timout": 5}}, TaskInstanceState.SUCCESS, None),
]


@pytest.fixture
def executor() -> Iterator[RecordingExecutor]:
    ex = RecordingExecutor(parallelism=2)
    ex.start()
    yield ex
    ex.end()


def run(ex: RecordingExecutor, *items: Any) -> Scheduler:
    queue(ex, *items)
    scheduler = Scheduler(ex)
    scheduler.run_until(lambda: all(item.key in scheduler.events for item in items))
    return scheduler


@pytest.mark.parametrize(
    ("executor_config", "state", "reason"), [s[1:] for s in SHAPES], ids=[s[0] for s in SHAPES]
)
def test_a_bad_executor_config_fails_its_task_alone(
    executor: RecordingExecutor,
    executor_config: object,
    state: TaskInstanceState,
    reason: str | None,
) -> None:
    bad, good = with_config("ok", executor_config), workloads.task("ok", map_index=1)
    scheduler = run(executor, bad, good)  # raising out of heartbeat() fails the test here
    got_state, info = scheduler.events[bad.key]
    assert got_state == state
    if reason is None:
        assert info is None
    else:
        assert info.startswith(reason)
        [audit] = executor._task_event_logs  # Airflow's audit log, shown with the task
        assert (audit.event, audit.extra) == ("executor launch failed", info)
    assert scheduler.events[good.key] == (TaskInstanceState.SUCCESS, None)
    assert final_events(executor) == {bad.key: 1, good.key: 1}
    assert executor.running == set()


def test_a_reason_quotes_a_huge_value_briefly(executor: RecordingExecutor) -> None:
    bad = with_config("ok", {OURS: {"task_timeout": 10**5000}})  # repr() of it raises ValueError
    scheduler = run(executor, bad)
    _, info = scheduler.events[bad.key]
    assert info.endswith("got an integer of about 5000 digits")


def test_an_unknown_key_is_ignored_with_one_warning(
    executor: RecordingExecutor, caplog: pytest.LogCaptureFixture
) -> None:
    items = [with_config("ok", {OURS: {"task_timout": 5}}, map_index=i) for i in range(3)]
    scheduler = run(executor, *items)
    assert {scheduler.events[item.key] for item in items} == {(TaskInstanceState.SUCCESS, None)}
    warnings = [r.getMessage() for r in caplog.records if "does not know" in r.getMessage()]
    assert len(warnings) == 1
    assert "'task_timout'" in warnings[0]
    assert "known: task_timeout" in warnings[0]


def test_a_queue_that_is_not_a_string_fails_its_task(executor: RecordingExecutor) -> None:
    bad, good = workloads.task("ok"), workloads.task("ok", map_index=1)
    bad.ti.queue = ["reports"]  # type: ignore[assignment]
    scheduler = run(executor, bad, good)
    assert scheduler.events[bad.key] == (
        TaskInstanceState.FAILED,
        "not launched: queue must be a string, got ['reports']",
    )
    assert scheduler.events[good.key] == (TaskInstanceState.SUCCESS, None)


def test_the_reason_reaches_the_task_log_even_where_the_path_cannot_be_written(
    executor: RecordingExecutor, tmp_path: Path
) -> None:
    # The task log is written on the loop's worker thread: an error escaping there would end the loop,
    # and with it every workload. A NUL byte makes pathlib raise ValueError, not OSError.
    executor._task_log_folder = str(tmp_path)
    unwritable = with_config("ok", {OURS: {"task_timeout": "soon"}})
    unwritable.log_path = "dag_id=adapter_dag/bad\0name.log"
    written = with_config("ok", {OURS: {"task_timeout": "soon"}}, map_index=1)
    written.log_path = "dag_id=adapter_dag/attempt=1.log"
    scheduler = run(executor, unwritable, written)
    task_log = tmp_path / "dag_id=adapter_dag" / "attempt=1.log"
    scheduler.run_until(lambda: task_log.exists() and task_log.read_text().endswith("\n"))
    assert json.loads(task_log.read_text())["event"].startswith(
        "The executor could not run this task: not launched: "
    )
    after = workloads.task("ok", map_index=2)
    assert run(executor, after).events[after.key] == (TaskInstanceState.SUCCESS, None)  # loop alive


def test_writing_the_reason_to_the_task_log_never_raises(tmp_path: Path) -> None:
    # During end() it runs on the scheduler's thread (the loop is gone): raising there would lose the
    # reason, and the task's final event with it, for an internal error.
    key = TaskInstanceKey("adapter_dag", "t", "manual__1", 1, -1)
    intake.tell_the_task(str(tmp_path), "dag_id=adapter_dag/bad\0name.log", key, "why")


@pytest.mark.parametrize(
    ("command", "queue_name", "executor_config", "reason"),
    [
        (["airflow", "dags", "list"], None, None, "not an `airflow tasks run` command: "),
        ("airflow tasks run d t r", None, None, "not an `airflow tasks run` command (a list of strings)"),
        (["airflow", "tasks", "run", 7], None, None, "(a list of strings)"),
        (["airflow", "tasks", "run", "d"], 3, None, "queue must be a string, got 3"),
        (["airflow", "tasks", "run", "d"], None, {OURS: {"task_timeout": 10**400}}, '["task_timeout"]'),
        (["airflow", "tasks", "run", "d"], None, {OURS: 1}, f'executor_config["{OURS}"] must be a dict'),
    ],
)
def test_a_bad_airflow2_command_fails_its_task_alone(
    executor: RecordingExecutor, command: Any, queue_name: Any, executor_config: Any, reason: str
) -> None:
    key = TaskInstanceKey("adapter_dag", "t", "manual__1", 1, -1)
    executor._process_tasks([(key, command, queue_name, executor_config)])
    [(changed, state, info, _)] = executor.changes
    assert (changed, state) == (key, TaskInstanceState.FAILED)
    assert info.startswith("not launched: ")
    assert reason in info
    assert executor.running == set()


def test_a_step_that_raises_fails_that_workload_alone(
    executor: RecordingExecutor, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Whatever nothing foresaw: a bug of ours while taking one workload in must cost that workload only.
    real = validation.airflow3

    def flaky(workload: Any, **kwargs: Any) -> Any:
        if workload.ti.task_id == "ok" and workload.ti.map_index == 0:
            raise RuntimeError("injected")
        return real(workload, **kwargs)

    monkeypatch.setattr(validation, "airflow3", flaky)
    broken, fine = workloads.task("ok", map_index=0), workloads.task("ok", map_index=1)
    scheduler = run(executor, broken, fine)
    assert scheduler.events[broken.key] == (
        TaskInstanceState.FAILED,
        "not launched: internal error: RuntimeError('injected')",
    )
    assert scheduler.events[fine.key] == (TaskInstanceState.SUCCESS, None)
    assert final_events(executor) == {broken.key: 1, fine.key: 1}
    assert caplog.text.count("Traceback") == 1  # logged once, with its traceback


def test_a_report_that_raises_still_gives_exactly_one_final_event(
    executor: RecordingExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken_finish, broken_metrics, fine = (workloads.task("ok", map_index=i) for i in range(3))
    real_finish = type(executor)._finish
    real_latency = Metrics.launch_latency
    starts: list[float] = []

    def finish(self: RecordingExecutor, key: Any, *args: Any) -> None:
        if key == broken_finish.key:
            raise RuntimeError("finish")  # before its final event: the last resort gives one
        real_finish(self, key, *args)

    def final_event(self: Metrics, outcome: Any) -> None:
        if outcome.key.key == broken_metrics.key:
            raise RuntimeError("metrics")  # after its final event: nothing more to give

    def launch_latency(self: Metrics, seconds: float) -> None:
        starts.append(seconds)
        if len(starts) == 1:
            raise RuntimeError("start")  # a start: that workload runs on and reports its own end
        real_latency(self, seconds)

    monkeypatch.setattr(type(executor), "_finish", finish)
    monkeypatch.setattr(Metrics, "final_event", final_event)
    monkeypatch.setattr(Metrics, "launch_latency", launch_latency)
    items = (broken_finish, broken_metrics, fine)
    scheduler = run(executor, *items)
    assert len(starts) == 3
    assert scheduler.events == {
        broken_finish.key: (TaskInstanceState.FAILED, "internal error: RuntimeError('finish')"),
        broken_metrics.key: (TaskInstanceState.SUCCESS, None),
        fine.key: (TaskInstanceState.SUCCESS, None),
    }
    assert final_events(executor) == {item.key: 1 for item in items}
    assert executor.running == set()
    assert executor._submissions == {}


def test_shutting_down_with_a_step_that_raises_still_ends(
    executor: RecordingExecutor, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    item = workloads.task("ok")
    queue(executor, item)
    Scheduler(executor).loop_once()

    def final_event(self: Metrics, outcome: Any) -> None:
        raise RuntimeError("metrics")

    monkeypatch.setattr(Metrics, "final_event", final_event)
    executor.end()  # sync() inside end() meets the fault: end() still returns
    assert executor.get_event_buffer() == {item.key: (TaskInstanceState.SUCCESS, None)}
