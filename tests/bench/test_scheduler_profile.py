"""The scheduler profile's reading of py-spy's raw output and of the kernel's per-thread times."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from benchmarks import scheduler_profile
from benchmarks.scheduler_profile import ThreadTimes, output, stacks, summarize, thread_times

GUARD = 30.0
RAW = """\
thread (101): MainThread;_run (scheduler.py:10);heartbeat (executor.py:20) 30
thread (101): MainThread;_run (scheduler.py:10);sleep (scheduler.py:12) 20
thread (0x7F00AA): asyncio_0;_worker (thread.py:5) 5
py-spy> not a stack line
"""


def test_a_raw_profile_is_read_per_thread_with_decimal_and_hex_ids(tmp_path: Path) -> None:
    path = tmp_path / "run.idle.txt"
    path.write_text(RAW)
    rows, unread = stacks(path)
    assert [(tid, name, count) for tid, name, _, count in rows] == [
        (101, "MainThread", 30),
        (101, "MainThread", 20),
        (0x7F00AA, "asyncio_0", 5),
    ]
    assert rows[0][2] == ["_run (scheduler.py:10)", "heartbeat (executor.py:20)"]
    assert unread == 1


def test_the_summary_sums_threads_of_a_kind_and_counts_functions_inclusively(tmp_path: Path) -> None:
    stem = tmp_path / "burst-ours-v0.2-0"  # a dot in the stem stays
    output(stem, ".idle.txt").write_text(RAW)
    output(stem, ".gil.txt").write_text("thread (101): MainThread;_run (scheduler.py:10) 10\n")
    before = {101: ThreadTimes("main", 1.0, 0.5)}
    after = {101: ThreadTimes("main", 3.0, 1.5), 0x7F00AA: ThreadTimes("python", 0.2, 0.0)}
    summary = summarize(stem, before, after, wall=1.0)
    rate = scheduler_profile.RATE
    main = summary["threads"]["main"]
    assert (main["cpu_s"], main["runqueue_s"]) == (2.0, 1.0)
    assert main["sampled_s"] == round(50 / rate, 2)
    assert main["gil_s"] == round(10 / rate, 2)
    assert main["top_s"]["_run (scheduler.py)"] == round(50 / rate, 2)
    assert main["top_s"]["heartbeat (executor.py)"] == round(30 / rate, 2)
    workers = summary["threads"]["asyncio_N"]  # named as Python names it, numbers folded
    assert workers["cpu_s"] == 0.2
    assert summary["unread_lines"] == 1


def test_the_kernel_times_name_the_main_thread_and_count_a_busy_one() -> None:
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            sum(range(1000))

    worker = threading.Thread(target=busy)
    worker.start()
    try:
        tid = worker.native_id
        assert tid is not None
        before = thread_times(os.getpid())[tid].cpu_s
        deadline = time.monotonic() + GUARD
        while (after := thread_times(os.getpid()))[tid].cpu_s <= before:
            assert time.monotonic() < deadline, "the busy thread's time never grew"
            stop.wait(0.01)
    finally:
        stop.set()
        worker.join()
    assert after[os.getpid()].name == "main"
