"""The CPU account by role (benchmarks/roles.py) on real processes and the kernel's process accounting.

A stand-in for the scheduler (a Python process, not Airflow: the account only reads the process tree)
forks a long-lived helper the log names as a fork server, and a workload that takes a workload's title
and forks a task process; each burns a known amount of CPU. The account must put each amount under its
role.
"""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks import roles

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="process accounting needs root")

STAND_IN = textwrap.dedent(
    """
    import os, sys, time
    from setproctitle import setproctitle

    def burn(seconds):
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass

    print("ready", flush=True)
    sys.stdin.readline()
    helper = os.fork()
    if helper == 0:
        burn(0.2)
        print("helper burnt", flush=True)
        sys.stdin.read()
        os._exit(0)
    workload = os.fork()
    if workload == 0:
        setproctitle("airflow worker -- stand-in: a task")
        task = os.fork()
        if task == 0:
            burn(0.6)
            os._exit(0)
        os.waitpid(task, 0)
        burn(0.3)
        os._exit(0)
    os.waitpid(workload, 0)
    print(f"done {helper}", flush=True)
    sys.stdin.read()
    """
)


def test_each_process_s_cpu_goes_to_its_role(tmp_path: Path) -> None:
    stand_in = subprocess.Popen(
        [sys.executable, "-c", STAND_IN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert stand_in.stdin is not None
    assert stand_in.stdout is not None
    try:
        assert stand_in.stdout.readline() == "ready\n"
        log = tmp_path / "scheduler.log"
        account = roles.RoleAccount(stand_in.pid, {}, log, tmp_path)
        with account.measuring():
            stand_in.stdin.write("go\n")
            stand_in.stdin.flush()
            lines = {stand_in.stdout.readline().strip() for _ in range(2)}
            [done] = [line for line in lines if line.startswith("done ")]
            assert "helper burnt" in lines
            log.write_text(f"INFO - fork server ready (pid {done.split()[1]})\n")
    finally:
        stand_in.stdin.close()
        stand_in.wait(timeout=30)
    assert account.unavailable is None
    seconds = account.seconds
    # Each burnt what it was told, plus its start and exit. The kernel's accounting samples user and
    # system time by the tick, where /proc splits the exact run time: it may count up to a tenth less
    # on a busy host, which the tree's total shows as unattributed.
    assert 0.18 <= seconds["fork_server"] < 0.35, seconds  # alive at the end: /proc's own figure
    assert 0.25 <= seconds["workload"] < 0.45, seconds
    assert 0.5 <= seconds["task_process"] < 0.75, seconds
    assert seconds["unattributed"] < 0.15, seconds
    per_task = account.per_task(2)
    assert per_task[roles.metric("task_process")] == seconds["task_process"] / 2
    assert set(per_task) == {roles.metric(role) for role in roles.ROLES}


def test_a_run_that_cannot_have_the_accounting_says_so_and_reports_no_figure(tmp_path: Path) -> None:
    # Another run holds it (the lock file is the host's one).
    held = os.open(roles._LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        account = roles.RoleAccount(os.getpid(), {}, tmp_path / "scheduler.log", tmp_path)
        with account.measuring():
            pass
    finally:
        os.close(held)
    assert account.unavailable == "another run holds process accounting"
    assert set(account.per_task(10).values()) == {None}
    assert not (tmp_path / "process-accounting").exists()


def test_records_of_the_kernel_s_format_are_read() -> None:
    # comp_t: 13-bit mantissa, base-8 exponent in the top 3 bits.
    assert roles.comp_t(100) == 100
    assert roles.comp_t((2 << 13) | 5) == 5 * 64
    record = struct.pack(
        "<BBHIIIIIIf8H16s", 0, 3, 0, 0, 0, 0, 4242, 1, 0, 1.0, 30, 12, 0, 0, 0, 0, 0, 0, b"python3"
    )
    other_version = struct.pack(
        "<BBHIIIIIIf8H16s", 0, 2, 0, 0, 0, 0, 1, 1, 0, 1.0, 30, 12, 0, 0, 0, 0, 0, 0, b"x"
    )
    assert roles.read_accounting(record + other_version) == [roles.Exited(4242, 1, 0.42, "python3")]
