"""Where a scheduler stop lands (adapter/stop_signals.py): held while the scheduler's thread is inside its
database work, delivered at the executor's heartbeat, at once in the loop's own frame, after a bound, on a
second signal and after the executor's stop.

Real signals to this process's main thread, caught by a stand-in for the scheduler's handler (Airflow's
``SchedulerJobRunner._exit_gracefully``, which logs and raises ``SystemExit``; tests/stop_handler.py's,
which the Airflow 2 tests use too); no scheduler. The executor test drives a real executor's heartbeat.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest
from airflow import settings

from async_local_executor.adapter import stop_signals
from tests import stop_handler
from tests.adapter.conftest import StartExecutor
from tests.stop_handler import SchedulerStop
from tests.waits import poll

GUARD = 30.0


@pytest.fixture
def scheduler() -> Iterator[SchedulerStop]:
    """The scheduler's handlers on SIGTERM and SIGINT, then the executor's hold over them; restored after."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    runner = SchedulerStop()
    for sig in before:
        signal.signal(sig, runner._exit_gracefully)
    stop_signals.arm()
    try:
        yield runner
    finally:
        stop_signals.release()
        for sig, handler in before.items():
            signal.signal(sig, handler)


def database_work(sig: signal.Signals = signal.SIGTERM) -> None:
    """The scheduler's thread inside a call of its loop (a query, a commit): the signal arrives here."""
    signal.raise_signal(sig)


def _run_scheduler_loop() -> None:
    """The loop's own frame, as Airflow names it: where its idle sleep is."""
    signal.raise_signal(signal.SIGTERM)


def test_a_stop_inside_database_work_is_held_and_delivered_at_the_heartbeat(
    scheduler: SchedulerStop, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=stop_signals.__name__)
    database_work()
    assert scheduler.stops == []
    # Said by the watcher thread, not in the handler.
    poll("the held stop to be logged", lambda: "inside a call of its loop" in caplog.text, GUARD)
    with pytest.raises(SystemExit):
        stop_signals.deliver_held()
    assert scheduler.stops == [signal.SIGTERM]
    stop_signals.deliver_held()  # delivered once
    assert scheduler.stops == [signal.SIGTERM]


def test_sigint_is_held_as_sigterm_is(scheduler: SchedulerStop) -> None:
    database_work(signal.SIGINT)
    assert scheduler.stops == []
    with pytest.raises(SystemExit):
        stop_signals.deliver_held()
    assert scheduler.stops == [signal.SIGINT]


def test_in_the_loop_s_own_frame_a_stop_is_delivered_at_once(scheduler: SchedulerStop) -> None:
    with pytest.raises(SystemExit):
        _run_scheduler_loop()
    assert scheduler.stops == [signal.SIGTERM]


def test_in_the_loop_s_own_frame_a_stop_is_delivered_at_once_with_a_session_open_there(
    scheduler: SchedulerStop,
) -> None:
    # The loop holds a session open between its calls (with create_session() as session: ...); no
    # statement runs in its own frame, and the with block closes the session on the way out.
    assert settings.engine is not None
    with settings.engine.connect(), pytest.raises(SystemExit):
        _run_scheduler_loop()
    assert scheduler.stops == [signal.SIGTERM]


def test_a_stop_held_for_one_executor_stays_held_when_another_starts(scheduler: SchedulerStop) -> None:
    # A scheduler with teams starts one executor per team, one after the other.
    database_work()
    stop_signals.arm()
    assert scheduler.stops == []
    with pytest.raises(SystemExit):
        stop_signals.deliver_held()
    assert scheduler.stops == [signal.SIGTERM]


def test_after_every_executor_stopped_a_new_one_starts_with_nothing_held(scheduler: SchedulerStop) -> None:
    database_work()
    stop_signals.release()
    stop_signals.arm()
    stop_signals.deliver_held()  # the earlier stop went with the executors that stopped
    assert scheduler.stops == []
    database_work()
    with pytest.raises(SystemExit):
        stop_signals.deliver_held()
    assert scheduler.stops == [signal.SIGTERM]


def test_the_scheduler_names_its_stop_handler_and_its_loop_as_this_module_expects() -> None:
    stop_handler.the_scheduler_names_its_stop_handler_and_its_loop_as_expected()


def test_a_second_signal_is_delivered_at_once(scheduler: SchedulerStop) -> None:
    database_work()
    with pytest.raises(SystemExit):
        database_work()
    assert scheduler.stops == [signal.SIGTERM]


def test_a_stop_held_past_the_bound_is_delivered_wherever_the_thread_is(
    scheduler: SchedulerStop, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stop_signals, "BOUND", 0.3)
    began = time.monotonic()
    database_work()
    # The thread blocks (a query waiting on a lock): the bound's timer signals it again, and the
    # scheduler's handler raises inside the wait.
    with pytest.raises(SystemExit):
        threading.Event().wait(GUARD)
    assert scheduler.stops == [signal.SIGTERM]
    assert 0.3 <= time.monotonic() - began < GUARD


def test_once_the_executor_stops_a_signal_is_delivered_at_once(scheduler: SchedulerStop) -> None:
    stop_signals.release()
    with pytest.raises(SystemExit):
        database_work()
    assert scheduler.stops == [signal.SIGTERM]


def test_a_held_stop_s_timer_is_cancelled_when_the_executor_stops(
    scheduler: SchedulerStop, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stop_signals, "BOUND", 0.2)
    database_work()
    stop_signals.release()  # the stop under way: no second SystemExit may land inside it
    assert not threading.Event().wait(0.6)
    assert scheduler.stops == []


def test_a_process_forked_from_the_scheduler_gets_the_scheduler_s_handler_at_once(
    scheduler: SchedulerStop,
) -> None:
    pid = os.fork()
    if pid == 0:  # the child: its copy of the handler must act at once, or it would wait for a heartbeat
        try:
            database_work()
        except SystemExit:
            os._exit(7)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 7
    assert scheduler.stops == []


def test_handlers_other_than_the_scheduler_s_are_left_alone() -> None:
    before = signal.getsignal(signal.SIGINT)
    stop_signals.arm()
    try:
        assert signal.getsignal(signal.SIGINT) is before
    finally:
        stop_signals.release()


def test_the_executor_s_heartbeat_delivers_a_held_stop(
    scheduler: SchedulerStop, start_executor: StartExecutor
) -> None:
    executor = start_executor()  # arms again, over the scheduler's handler already held
    database_work()
    assert scheduler.stops == []
    with pytest.raises(SystemExit):
        executor.heartbeat()
    assert scheduler.stops == [signal.SIGTERM]
