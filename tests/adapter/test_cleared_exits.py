"""Exits of cleared task instances reach the scheduler one per loop; every other event at once.

The gate is driven the way the scheduler drives the executor: each ``get_event_buffer()`` is one
scheduler loop. Which task instances are restarting comes from a lookup the test controls here (the
real one reads the metadata database; tests/e2e/test_cleared_tasks.py runs it against a real Airflow).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any, cast

import pytest
from airflow.models.taskinstancekey import TaskInstanceKey
from airflow.utils.state import TaskInstanceState

from async_local_executor.adapter.cleared_exits import TI_GONE
from async_local_executor.adapter.executor import AsyncLocalExecutor

SUCCESS, FAILED = TaskInstanceState.SUCCESS, TaskInstanceState.FAILED


def _key(i: int) -> TaskInstanceKey:
    return TaskInstanceKey("d", "t", "r", try_number=1, map_index=i)


class Restarting:
    """The lookup: these map indexes are restarting; records what it was asked."""

    def __init__(self, *indexes: int, fail: bool = False) -> None:
        self.indexes = set(indexes)
        self.fail = fail
        self.asked: list[int] = []

    def __call__(self, keys: Collection[Any]) -> set[Any]:
        self.asked.append(len(keys))
        if self.fail:
            raise OSError("database unreachable")
        return {key for key in keys if key.map_index in self.indexes}


def _executor(lookup: Restarting) -> AsyncLocalExecutor:
    executor = AsyncLocalExecutor()
    executor._cleared_exits._lookup = lookup  # the database read, replaced (see the module docstring)
    return executor


def _loops(executor: AsyncLocalExecutor) -> list[set[int]]:
    """Scheduler loops until the buffer is empty: which map indexes each one got."""
    batches = []
    while executor.event_buffer:
        keys = list(executor.get_event_buffer())
        assert all(isinstance(key, TaskInstanceKey) for key in keys)
        batches.append({cast("TaskInstanceKey", key).map_index for key in keys})
        assert len(batches) < 100
    return batches


def test_one_exit_of_a_cleared_task_instance_per_loop(caplog: pytest.LogCaptureFixture) -> None:
    executor = _executor(Restarting(0, 1, 2, 3))
    for i in range(6):  # 0-3 cleared while running, 4 and 5 ended on their own
        executor.event_buffer[_key(i)] = (SUCCESS, None)
    executor.event_buffer[_key(6)] = (FAILED, "exit 1")

    with caplog.at_level(logging.INFO, logger="async_local_executor.adapter.cleared_exits"):
        batches = _loops(executor)

    assert len(batches) == 4
    assert batches[0] - {0, 1, 2, 3} == {4, 5, 6}  # everything else goes at once
    assert sorted(len(batch & {0, 1, 2, 3}) for batch in batches) == [1, 1, 1, 1]
    assert set().union(*batches) == set(range(7))  # nothing lost, nothing twice
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].startswith("3 more exits of cleared (restarting) task instances ended together")
    assert messages[-1] == "every exit of a cleared task instance has gone to the scheduler"
    assert len(messages) == 2


def test_a_lone_success_costs_no_database_read() -> None:
    lookup = Restarting(0)
    executor = _executor(lookup)
    executor.event_buffer[_key(0)] = (SUCCESS, None)
    executor.event_buffer[_key(1)] = (FAILED, "exit 1")

    assert _loops(executor) == [{0, 1}]
    assert lookup.asked == []


def test_a_failed_lookup_holds_nothing(caplog: pytest.LogCaptureFixture) -> None:
    executor = _executor(Restarting(0, 1, 2, fail=True))
    for i in range(3):
        executor.event_buffer[_key(i)] = (SUCCESS, None)

    with caplog.at_level(logging.WARNING, logger="async_local_executor.adapter.cleared_exits"):
        assert _loops(executor) == [{0, 1, 2}]
    assert "go to the scheduler unpaced" in caplog.text


def _gone(executor: AsyncLocalExecutor, i: int) -> None:
    executor.event_buffer[_key(i)] = (SUCCESS, TI_GONE)


def test_a_gone_workload_ends_a_restarting_task_instance() -> None:
    lookup = Restarting(0)
    executor = _executor(lookup)
    _gone(executor, 0)

    assert _loops(executor) == [{0}]
    assert lookup.asked == [1]  # even alone: whether the event may go at all depends on it


def test_a_gone_workload_sends_no_event_for_a_task_instance_that_is_not_restarting(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # 1 was queued again for the same try under a new id: the scheduler would fail it on any event.
    executor = _executor(Restarting(0, 2))
    unreachable: list[list[Any]] = []
    executor._cleared_exits._on_unreachable = unreachable.append  # the database write, replaced
    _gone(executor, 0)
    _gone(executor, 1)
    executor.event_buffer[_key(2)] = (SUCCESS, None)
    executor.event_buffer[_key(3)] = (FAILED, "exit 1")

    with caplog.at_level(logging.INFO, logger="async_local_executor.adapter.cleared_exits"):
        batches = _loops(executor)

    assert set().union(*batches) == {0, 2, 3}
    assert sorted(len(batch & {0, 2}) for batch in batches) == [1, 1]  # still one restarting exit per loop
    dropped = [r.getMessage() for r in caplog.records if "no event is sent" in r.getMessage()]
    assert dropped == [dropped[0]]
    assert dropped[0].startswith(
        "workload d.t[1] try 1: its task instance was cleared and is no longer restarting"
    )
    assert unreachable == [[_key(1)]]


def test_a_gone_workload_s_exit_goes_to_the_scheduler_when_the_lookup_fails() -> None:
    executor = _executor(Restarting(fail=True))
    _gone(executor, 0)
    _gone(executor, 1)

    assert _loops(executor) == [{0, 1}]
