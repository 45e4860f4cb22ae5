"""What the scheduler log and the task processes get from the executor around a workload's output."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from async_local_executor.adapter.output_relay import TAIL_LINES
from tests.adapter import workloads
from tests.adapter.driver import RecordingExecutor, Scheduler

CLIENT_TIMEOUT = "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT"


@pytest.fixture
def executor(monkeypatch: pytest.MonkeyPatch, launcher: str) -> Iterator[RecordingExecutor]:
    monkeypatch.delenv(CLIENT_TIMEOUT, raising=False)
    ex = RecordingExecutor(parallelism=4)
    ex.start()
    yield ex
    ex.end()


def run(ex: RecordingExecutor, *task_ids: str) -> None:
    items = [workloads.task(task_id) for task_id in task_ids]
    for item in items:
        ex.queue_workload(item, session=None)  # type: ignore[arg-type]
    scheduler = Scheduler(ex)
    scheduler.run_until(lambda: len(scheduler.events) == len(items))


def child_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "async_local_executor.child"]


def test_a_failed_workload_logs_its_last_lines_once_and_a_good_one_logs_none(
    executor: RecordingExecutor, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    run(executor, "ok", "crash")
    assert child_lines(caplog) == []  # nothing line by line at INFO
    [failure] = [r.getMessage() for r in caplog.records if "adapter_dag.crash" in r.getMessage()]
    assert f"its last {TAIL_LINES} output lines" in failure
    assert "crash line 29" in failure
    assert "crash line 9\n" not in failure  # only the tail
    assert not any("adapter_dag.ok" in r.getMessage() and "output" in r.getMessage() for r in caplog.records)


def test_every_line_is_relayed_at_debug(
    executor: RecordingExecutor, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="async_local_executor.child")
    run(executor, "crash")
    lines = [r.getMessage() for r in child_lines(caplog)]
    assert sum(1 for line in lines if "crash line" in line) == 30
    assert all(r.levelno == logging.DEBUG for r in child_lines(caplog))


def test_task_processes_get_a_safe_client_timeout_and_it_is_said_once(
    executor: RecordingExecutor, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="async_local_executor.child")
    run(executor, "ok", "ok2")
    started = [r.getMessage() for r in child_lines(caplog) if "stub running" in r.getMessage()]
    assert len(started) == 2
    assert all("client_timeout=60" in line for line in started)


@pytest.mark.usefixtures("launcher")
def test_an_operators_own_client_timeout_is_kept(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(CLIENT_TIMEOUT, "7")
    caplog.set_level(logging.DEBUG)
    ex = RecordingExecutor(parallelism=2)
    ex.start()
    try:
        run(ex, "ok")
    finally:
        ex.end()
    started = [r.getMessage() for r in child_lines(caplog) if "stub running" in r.getMessage()]
    assert started
    assert "client_timeout=7" in started[0]
    said = [r.getMessage() for r in caplog.records if "execution_api_timeout" in r.getMessage()]
    assert said == [
        f"task processes keep [workers] execution_api_timeout = 7s: set in the environment ({CLIENT_TIMEOUT})"
    ]
