"""Run as a script by test_metrics.py, with StatsD configured through the environment.

Two tasks (one succeeds, one fails), a pause and a resume, then a second executor whose memory guard holds a task until it is
shut down: every metric this executor emits has a reason to appear.
"""

from __future__ import annotations

import functools
import os
import sys
import time

from async_local_executor.adapter.live_control import LiveControl
from async_local_executor.ops import control
from tests.adapter import workloads
from tests.adapter.driver import RecordingExecutor, Scheduler


def _applied(live: LiveControl, serial: int) -> bool:
    return live.control.serial == serial


def main() -> int:
    ex = RecordingExecutor(parallelism=2)
    ex.start()
    scheduler = Scheduler(ex)
    for item in (workloads.task("ok"), workloads.task("crash")):
        ex.queue_workload(item, session=None)  # type: ignore[arg-type]
    scheduler.run_until(lambda: len(scheduler.events) == 2)
    # A pause and its resume (live control), so the control gauges have a change to report.
    assert ex._settings is not None
    assert ex._live is not None
    live = ex._live
    for edit in (control.pause("metrics", time.time()), control.resume("metrics", time.time())):
        serial = control.change(ex._settings.state_dir, None, edit).serial
        scheduler.run_until(functools.partial(_applied, live, serial))
    ex.end()
    os.unlink(ex._settings.state_dir / "control.json")  # the state directory is the test home's

    os.environ["AIRFLOW__ASYNC_LOCAL_EXECUTOR__MIN_AVAILABLE_MEMORY_MB"] = str(2**40)
    os.environ["AIRFLOW__ASYNC_LOCAL_EXECUTOR__SHUTDOWN_TIMEOUT"] = "0"
    held = RecordingExecutor(parallelism=2)
    held.start()
    held.queue_workload(workloads.task("ok"), session=None)  # type: ignore[arg-type]
    scheduler = Scheduler(held)
    runtime = held._runtime
    assert runtime is not None
    scheduler.run_until(lambda: runtime.report is not None and runtime.report.state.memory_low)
    seen = runtime.report
    # The report that saw the guard is published before its metrics are sent: wait for the next one.
    scheduler.run_until(lambda: runtime.report is not seen)
    held.end()
    return 0


if __name__ == "__main__":
    sys.exit(main())
