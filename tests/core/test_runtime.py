"""The loop thread's runtime, with a plain supervisor and no Airflow."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from async_local_executor.core.health import Probe
from async_local_executor.core.launchers.subprocess import SubprocessLauncher
from async_local_executor.core.runtime import THREAD_NAME, Runtime
from async_local_executor.core.supervisor import Supervisor
from tests.core.helpers import GUARD, FakeClock, Recorder


class StuckSupervisor(Supervisor):
    """Its shutdown blocks the loop thread itself (as a hung system call on the loop would)."""

    def __init__(self, released: threading.Event) -> None:
        recorder = Recorder()
        super().__init__(SubprocessLauncher(output=recorder.output), recorder, limit=None)
        self.released = released

    async def shutdown(self, wait: float) -> None:
        self.released.wait(GUARD)
        await super().shutdown(wait)


def plain() -> Supervisor:
    return Supervisor(SubprocessLauncher(), Recorder(), limit=None)


def test_a_stuck_loops_shutdown_gives_up_and_joins_for_what_is_left_of_its_timeout_not_all_of_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    released = threading.Event()
    runtime = Runtime(lambda: StuckSupervisor(released), use_uvloop=False)
    runtime.start()
    thread = runtime.thread
    assert thread is not None
    join = thread.join
    joins: list[float | None] = []

    def spy(timeout: float | None = None) -> None:
        joins.append(timeout)
        join(timeout)

    monkeypatch.setattr(thread, "join", spy)
    try:
        with caplog.at_level(logging.ERROR, logger="async_local_executor.core.runtime"):
            runtime.shutdown(0.0, timeout=0.3)
        # It returned while the loop is still stuck in the supervisor's shutdown.
        assert thread.is_alive()
        assert not released.is_set()
    finally:
        released.set()
        join(GUARD)
    assert not thread.is_alive()
    assert "event loop did not finish shutting down within 0.3s" in caplog.text
    # Waiting for the shutdown used up the one bound, so the join gets none of it (it used to get all
    # of it again, doubling the wait).
    assert joins == [0.0]


def test_the_probe_runs_on_the_loop_thread_on_its_clock() -> None:
    clock = FakeClock()
    runtime = Runtime(plain, use_uvloop=False, make_probe=lambda s: Probe(s.state, interval=1.0, clock=clock))
    assert runtime.report is None
    runtime.start()
    try:
        clock.wait_for_sleepers(1)
        first = runtime.report
        assert first is not None
        assert first.at == clock.monotonic()
        clock.advance(1.0)
        clock.wait_for_sleepers(1)
        report = runtime.report
        assert report is not None
        assert report.at == first.at + 1.0
    finally:
        runtime.shutdown(0.0, timeout=GUARD)
    assert runtime.thread is not None
    assert not runtime.thread.is_alive()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="kernel thread names are read from /proc")
def test_the_loop_thread_carries_its_name_in_the_kernel() -> None:
    # How an operator (top -H, ps -L) and the benchmarks tell the loop thread's CPU from the scheduler's.
    # Its own thread, by kernel id: another test's loop thread may still be finishing beside it.
    runtime = Runtime(plain, use_uvloop=False)
    runtime.start()
    try:
        assert runtime.thread is not None
        name = Path(f"/proc/self/task/{runtime.thread.native_id}/comm").read_text().strip()
    finally:
        runtime.shutdown(0.0, timeout=GUARD)
    assert name == THREAD_NAME


class Records(logging.Handler):
    """Collects one logger's records and lets a test wait for the next one instead of sleeping."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._arrived = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self._arrived:
            self.records.append(record)
            self._arrived.notify_all()

    def wait(self, count: int = 1) -> None:
        with self._arrived:
            assert self._arrived.wait_for(lambda: len(self.records) >= count, GUARD), "nothing logged"


def test_a_blocking_call_that_raises_is_logged_once_and_the_loop_lives_on() -> None:
    records = Records()
    logger = logging.getLogger("async_local_executor.core.runtime")
    logger.addHandler(records)
    runtime = Runtime(plain, use_uvloop=False)
    runtime.start()
    try:

        def broken() -> None:
            raise ValueError("blocking bug")

        runtime.run_blocking(broken)
        records.wait()  # the contained error, or (before the fix) the loop thread's death
        ran = threading.Event()
        runtime.run_blocking(ran.set)
        assert ran.wait(GUARD), "the loop no longer runs blocking calls"
        assert runtime.alive
        assert runtime.failure is None
    finally:
        runtime.shutdown(0.0, timeout=GUARD)
        logger.removeHandler(records)
    [record] = records.records
    assert record.levelno == logging.ERROR
    assert "carries on" in record.getMessage()
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], ValueError)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_fork_by_another_thread_finds_the_loop_holding_no_lock() -> None:
    # As Airflow 2's scheduler forks its DAG file processor manager after the executor started. The
    # loop holds a lock across a blocking step; the fork is made while it does.
    lock, held = threading.Lock(), threading.Event()

    async def busy() -> None:
        while True:
            with lock:
                held.set()
                time.sleep(0.05)  # noqa: ASYNC251 - a blocking step on the loop, with a lock held
            await anyio.lowlevel.checkpoint()

    runtime = Runtime(plain, use_uvloop=False)
    runtime.start()
    try:
        runtime._post(lambda _, tg: tg.start_soon(busy))
        assert held.wait(GUARD)
        pid = os.fork()
        if pid == 0:  # the child: only this thread, and whatever locks the others held at the fork
            os._exit(1 if lock.locked() else 0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the child inherited the loop's lock, held"
        assert held.wait(GUARD)  # and the loop went on
        held.clear()
        assert held.wait(GUARD)
    finally:
        runtime.shutdown(0.0, timeout=GUARD)


def test_a_release_settles_what_it_let_go_before_the_loop_thread_exits() -> None:
    # A child forked for the loop thread (the fork server's, through its helper) dies with that thread
    # while its parent-death signal is armed: whatever it must do before (take custody of itself) is
    # waited for while the thread still runs.
    runtime = Runtime(plain, use_uvloop=False)
    runtime.start()
    thread = runtime.thread
    assert thread is not None
    seen: list[tuple[list[object], bool]] = []
    released = runtime.release(
        0.0, timeout=GUARD, settle=lambda let_go: seen.append((list(let_go), thread.is_alive()))
    )
    assert released == []
    assert seen == [([], True)]
    assert not thread.is_alive()
