"""The prefetch shrinks as tasks get long enough to outwait the scheduler's task_queued_timeout."""

from __future__ import annotations

from async_local_executor.core.prefetch import PrefetchBudget


def budget(maximum: int = 8, timeout: float = 600.0) -> PrefetchBudget:
    return PrefetchBudget(parallelism=4, maximum=maximum, queued_timeout=timeout)


def test_nothing_known_yet_allows_the_configured_prefetch() -> None:
    assert budget().allowed(now=0.0) == 8


def test_short_tasks_keep_the_full_prefetch() -> None:
    b = budget()
    for i in range(20):
        b.launched(i, at=float(i))
        b.ended(i, duration=2.0)
    assert b.allowed(now=20.0) == 8


def test_tasks_longer_than_half_the_timeout_allow_no_prefetch() -> None:
    b = budget()
    b.ended("a", duration=400.0)  # one wave would wait 400 s of 300 allowed
    assert b.allowed(now=0.0) == 0


def test_the_prefetch_is_whole_waves_that_fit_in_half_the_timeout() -> None:
    b = budget(maximum=100)
    b.ended("a", duration=100.0)  # 300 s of patience / 100 s per wave = 3 waves of 4
    assert b.allowed(now=0.0) == 12


def test_running_tasks_old_enough_shrink_it_before_any_finishes() -> None:
    b = budget()
    for i in range(4):
        b.launched(i, at=0.0)
    assert b.allowed(now=10.0) == 8
    assert b.allowed(now=301.0) == 0


def test_one_stuck_task_among_quick_ones_does_not() -> None:
    b = budget()
    b.launched("stuck", at=0.0)
    for i in range(3):
        b.launched(i, at=999.0)
    assert b.allowed(now=1000.0) == 8


def test_ended_workloads_stop_counting_and_unlaunched_ones_add_no_duration() -> None:
    b = budget()
    b.launched("old", at=0.0)
    b.ended("old", duration=None)
    assert b.typical is None
    assert b.allowed(now=10_000.0) == 8


def test_no_timeout_or_no_prefetch_configured_is_left_as_is() -> None:
    assert budget(timeout=0.0).allowed(now=0.0) == 8
    b = budget(maximum=0)
    b.ended("a", duration=1.0)
    assert b.allowed(now=0.0) == 0
