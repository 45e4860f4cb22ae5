"""The CPU account by role (benchmarks/roles.py) on real processes and the kernel's exit records.

A stand-in for the scheduler (a Python process, not Airflow: the account only reads the process tree)
forks a long-lived helper the log names as a fork server, and a workload that takes a workload's title
and forks a task process; each burns a known amount of CPU. The account must put each amount under its
role.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from benchmarks import roles, taskstats
from benchmarks.deployment import Deployment
from harness.sandbox import AirflowSandbox

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the kernel's exit records (taskstats) need root")

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


@needs_root
def test_each_process_s_cpu_goes_to_its_role(tmp_path: Path) -> None:
    stand_in = subprocess.Popen(
        [sys.executable, "-c", STAND_IN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert stand_in.stdin is not None
    assert stand_in.stdout is not None
    try:
        assert stand_in.stdout.readline() == "ready\n"
        log = tmp_path / "scheduler.log"
        account = roles.RoleAccount(stand_in.pid, {}, log)
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
    # Each burnt what it was told, plus its start and exit: the records are the scheduler's exact run
    # times, so the task process's figure is its own (less its exit's teardown, which the workload's has).
    # What a reaper's /proc says its children used counts 10 ms units: each figure it goes into is off
    # by as much.
    assert 0.19 <= seconds["fork_server"] < 0.3, seconds  # alive at the end: /proc's own figure
    assert 0.28 <= seconds["workload"] < 0.4, seconds
    assert 0.59 <= seconds["task_process"] < 0.65, seconds
    assert account.exits < 0.05, account.exits
    assert abs(seconds["unattributed"]) < 0.02, seconds
    per_task = account.per_task(2)
    assert per_task[roles.metric("task_process")] == seconds["task_process"] / 2
    assert set(per_task) == {roles.metric(role) for role in roles.ROLES} | {roles.EXITS}
    assert per_task[roles.EXITS] == account.exits / 2


def test_a_run_that_cannot_have_the_records_says_so_and_reports_no_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another run holds them (a lock of this test's own: the host's may be held by a real run).
    monkeypatch.setattr(roles, "_LOCK", tmp_path / "records.lock")
    held = os.open(roles._LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        account = roles.RoleAccount(os.getpid(), {}, tmp_path / "scheduler.log")
        with account.measuring():
            pass
    finally:
        os.close(held)
    expected = "another run holds the kernel's exit records" if os.geteuid() == 0 else "need root"
    assert account.unavailable is not None
    assert account.unavailable.endswith(expected)
    assert set(account.per_task(10).values()) == {None}


@needs_root
def test_the_kernel_s_records_carry_each_process_s_exact_cpu_time_and_parent() -> None:
    # Forked children that run in short wake-ups (a tick-sampled record counts them low) with a second
    # thread: each record must match what wait4() says the child used, less its exit's teardown.
    listener = taskstats.Listener()
    used: dict[int, float] = {}
    with listener.listening():
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    helper = threading.Thread(target=_burn, args=(0.02,))
                    helper.start()
                    for _ in range(20):
                        _burn(0.001)
                        time.sleep(0.002)
                    helper.join()
                    code = 0
                finally:
                    os._exit(code)
            _, status, usage = os.wait4(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
            used[pid] = usage.ru_utime + usage.ru_stime
    assert listener.lost is None
    assert listener.exact
    records = {record.pid: record for record in listener.exited()}
    for pid, cpu in used.items():
        record = records[pid]
        assert record.ppid == os.getpid()
        assert cpu - 0.01 < record.cpu_s <= cpu, (record, cpu)
    assert list(used) == [r.pid for r in listener.exited() if r.pid in used]  # in the order they exited


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


SCHEDULER, WORKER, TASK, CHILD = 1000, 1001, 1002, 1003


def _account(
    seen: dict[int, tuple[int, str]],
    before: dict[int, tuple[float, float]],
    after: dict[int, tuple[float, float]],
    exited: list[roles.Exited],
    reaped: float = 0.0,
) -> dict[str, float]:
    """The account of a phase given as what /proc and the kernel's records would have said."""
    account = roles.RoleAccount(SCHEDULER, {}, Path("/nonexistent/scheduler.log"))
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
