"""The loop thread's runtime, with a plain supervisor and no Airflow."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from async_local_executor.core.launchers.subprocess import SubprocessLauncher
from async_local_executor.core.runtime import THREAD_NAME, Runtime
from async_local_executor.core.supervisor import Supervisor
from tests.core.helpers import GUARD, Recorder


class StuckSupervisor(Supervisor):
    """Its shutdown blocks the loop thread itself (as a hung system call on the loop would)."""

    def __init__(self, released: threading.Event) -> None:
        recorder = Recorder()
        super().__init__(SubprocessLauncher(output=recorder.output), recorder, limit=None)
        self.released = released

    async def shutdown(self, wait: float) -> None:
        self.released.wait(GUARD)
        await super().shutdown(wait)


def test_shutdown_of_a_stuck_loop_returns_within_its_timeout_not_twice_it() -> None:
    released = threading.Event()
    runtime = Runtime(lambda: StuckSupervisor(released), use_uvloop=False)
    runtime.start()
    timeout = 2.0
    began = time.monotonic()
    try:
        runtime.shutdown(0.0, timeout=timeout)
        elapsed = time.monotonic() - began
    finally:
        released.set()
    # Waiting for the shutdown and joining the thread share one bound (each took all of it before).
    assert timeout <= elapsed < 1.5 * timeout


def test_the_loop_thread_carries_its_name_in_the_kernel() -> None:
    # How an operator (top -H, ps -L) and the benchmarks tell the loop thread's CPU from the scheduler's.
    runtime = Runtime(lambda: Supervisor(SubprocessLauncher(), Recorder(), limit=None), use_uvloop=False)
    runtime.start()
    try:
        names = [path.read_text().strip() for path in Path("/proc/self/task").glob("*/comm")]
    finally:
        runtime.shutdown(0.0, timeout=GUARD)
    assert names.count(THREAD_NAME) == 1
