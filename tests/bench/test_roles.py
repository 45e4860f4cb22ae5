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
from types import SimpleNamespace
from typing import cast

import pytest

from benchmarks import roles
from benchmarks.deployment import Deployment
from harness.sandbox import AirflowSandbox

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
    if account.unavailable and account.unavailable.startswith("acct(2) failed"):
        pytest.skip(account.unavailable)  # root without CAP_SYS_PACCT (a container's default)
    assert account.unavailable is None
    seconds = account.seconds
    # Each burnt what it was told, plus its start and exit. The kernel's accounting samples user and
    # system time by the tick, where /proc splits the exact run time: it may count up to a tenth less
    # on a busy host, which the tree's total shows as unattributed.
    assert 0.18 <= seconds["fork_server"] < 0.35, seconds  # alive at the end: /proc's own figure
    assert 0.25 <= seconds["workload"] < 0.45, seconds
    assert 0.5 <= seconds["task_process"] < 0.75, seconds
    assert abs(seconds["unattributed"]) < 0.05, seconds
    per_task = account.per_task(2)
    assert per_task[roles.metric("task_process")] == seconds["task_process"] / 2
    assert set(per_task) == {roles.metric(role) for role in roles.ROLES}


def test_a_run_that_cannot_have_the_accounting_says_so_and_reports_no_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another run holds it (a lock of this test's own: the host's may be held by a real run).
    monkeypatch.setattr(roles, "_LOCK", tmp_path / "acct.lock")
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


SCHEDULER, WORKER, TASK, CHILD = 1000, 1001, 1002, 1003


def _account(
    seen: dict[int, tuple[int, str]],
    before: dict[int, tuple[float, float]],
    after: dict[int, tuple[float, float]],
    exited: list[roles.Exited],
    reaped: float = 0.0,
) -> dict[str, float]:
    """The account of a phase given as what /proc and the kernel's records would have said."""
    account = roles.RoleAccount(SCHEDULER, {}, Path("/nonexistent/scheduler.log"), Path("/nonexistent"))
    account._seen = {pid: roles._Seen(ppid, cmdline) for pid, (ppid, cmdline) in seen.items()}
    phase = roles._Phase(
        {pid: roles._Times(*t) for pid, t in before.items()},
        {pid: roles._Times(*t) for pid, t in after.items()},
        exited,
        roles._Times(0.0, 0.0),
        roles._Times(0.0, reaped),
    )
    return account._account(phase, {"main": 0.0}, {"main": 0.0}, {})


def test_what_a_live_worker_reaped_counts_once_with_what_its_children_reaped() -> None:
    # Stock: a live worker reaped a task process that had reaped a child of its own.
    seconds = _account(
        {WORKER: (SCHEDULER, "airflow worker -- LocalExecutor: <idle>")},
        {WORKER: (0.5, 0.0)},
        {WORKER: (1.0, 1.5)},
        [roles.Exited(CHILD, TASK, 0.5, "x"), roles.Exited(TASK, WORKER, 1.0, "x")],
    )
    assert seconds["workload"] == pytest.approx(0.5)
    assert seconds["task_process"] == pytest.approx(1.5)
    assert seconds["unattributed"] == pytest.approx(0.0)


def test_a_process_that_ran_before_the_phase_counts_only_what_it_used_in_it() -> None:
    # Reaped by a live worker: its whole life is in the worker's children time.
    seconds = _account(
        {WORKER: (SCHEDULER, "airflow worker -- LocalExecutor: <idle>"), TASK: (WORKER, "x")},
        {WORKER: (0.0, 0.0), TASK: (2.0, 0.0)},
        {WORKER: (0.0, 3.0)},
        [roles.Exited(TASK, WORKER, 3.0, "x")],
    )
    assert seconds["task_process"] == pytest.approx(1.0)
    assert seconds["unattributed"] == pytest.approx(0.0)
    # Reaped by the scheduler, with a task process of its own that exited.
    seconds = _account(
        {WORKER: (SCHEDULER, "airflow worker -- AsyncLocalExecutor: t")},
        {WORKER: (0.4, 0.0)},
        {},
        [roles.Exited(TASK, WORKER, 0.5, "x"), roles.Exited(WORKER, SCHEDULER, 0.6, "x")],
        reaped=1.1,
    )
    assert seconds["workload"] == pytest.approx(0.2)
    assert seconds["task_process"] == pytest.approx(0.5)
    assert seconds["unattributed"] == pytest.approx(0.0)


def test_a_reused_pid_s_records_are_told_apart_by_their_order() -> None:
    # Two workloads of one pid in turn, each with its task process; the kernel's records count low.
    seconds = _account(
        {},
        {},
        {},
        [
            roles.Exited(TASK, WORKER, 0.2, "x"),
            roles.Exited(WORKER, SCHEDULER, 0.1, "x"),
            roles.Exited(CHILD, WORKER, 0.3, "x"),
            roles.Exited(WORKER, SCHEDULER, 0.1, "x"),
        ],
        reaped=0.9,
    )
    assert seconds["task_process"] == pytest.approx(0.5)
    assert seconds["workload"] == pytest.approx(0.4)
    assert seconds["unattributed"] == pytest.approx(0.0)


def test_a_deployment_without_an_api_server_process_is_accounted_by_the_roles_it_has(tmp_path: Path) -> None:
    # Airflow 2's deployment is its scheduler alone (its DAG processor is the scheduler's child). The
    # sandbox is a stand-in with the attributes the account reads: starting Airflow 2 is not needed to
    # see which processes it names.
    sandbox = SimpleNamespace(
        pids={"scheduler": 4242}, process_logs={"scheduler": tmp_path / "scheduler.log"}, home=tmp_path
    )
    deployment = Deployment(cast(AirflowSandbox, sandbox), tmp_path / "heartbeats.log")
    account = deployment.role_account()
    assert (account.scheduler, dict(account.others)) == (4242, {})
    sandbox.pids.update({"api-server": 1, "dag-processor": 2})
    assert dict(deployment.role_account().others) == {"api_server": 1, "dag_processor": 2}
