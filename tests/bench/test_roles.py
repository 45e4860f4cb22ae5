"""The CPU account by role (benchmarks/roles.py) on real processes and the kernel's exit records.

A stand-in for the scheduler (a Python process, not Airflow: the account only reads the process tree)
forks a long-lived helper the log names as a fork server, and a workload that takes a workload's title
and forks a task process; each burns a known amount of CPU. The account must put each amount under its
role.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
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
    if account.unavailable and "taskstats" in account.unavailable:
        pytest.skip(account.unavailable)  # root in a namespace of its own (a container) has no taskstats
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


@needs_root
def test_a_run_that_cannot_have_the_records_says_so_and_reports_no_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The kernel answers a family it does not have with ENOENT: as on one built without taskstats.
    monkeypatch.setattr(taskstats, "FAMILY", b"NO_SUCH_FAMILY")
    account = roles.RoleAccount(os.getpid(), {}, tmp_path / "scheduler.log")
    with account.measuring():
        pass
    assert account.unavailable is not None
    assert account.unavailable.startswith("no taskstats family"), account.unavailable
    assert set(account.per_task(10).values()) == {None}


SPAWNED = textwrap.dedent(
    """
    import threading, time

    def burn(seconds):
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    helper = threading.Thread(target=burn, args=(0.02,))
    helper.start()
    for _ in range(20):
        burn(0.001)
        time.sleep(0.002)
    helper.join()
    """
)


@needs_root
def test_the_kernel_s_records_carry_each_process_s_exact_cpu_time_and_parent() -> None:
    # Children that run in short wake-ups (a tick-sampled record counts them low) with a second
    # thread: each record must match what wait4() says the child used, less its exit's teardown.
    # Spawned, not forked: the listener's reader is a thread of this process.
    listener = taskstats.Listener()
    used: dict[int, float] = {}
    try:
        with listener.listening():
            for _ in range(3):
                pid = os.posix_spawn(sys.executable, [sys.executable, "-c", SPAWNED], dict(os.environ))
                _, status, usage = os.wait4(pid, 0)
                assert os.waitstatus_to_exitcode(status) == 0
                used[pid] = usage.ru_utime + usage.ru_stime
    except taskstats.TaskstatsUnavailable as exc:
        pytest.skip(str(exc))  # root in a namespace of its own (a container) has no taskstats
    assert listener.lost is None
    records = {record.pid: record for record in listener.exited()}
    for pid, cpu in used.items():
        record = records[pid]
        assert record.ppid == os.getpid()
        assert cpu - 0.01 < record.cpu_s <= cpu, (record, cpu)
    assert list(used) == [r.pid for r in listener.exited() if r.pid in used]  # in the order they exited


SCHEDULER, WORKER, TASK, CHILD = 1000, 1001, 1002, 1003


def _account(
    seen: dict[int, tuple[int, str]],
    before: dict[int, tuple[float, ...]],
    after: dict[int, tuple[float, ...]],
    exited: list[roles.Exited],
    reaped: float = 0.0,
    account: roles.RoleAccount | None = None,
) -> dict[str, float]:
    """The account of a phase given as what /proc and the kernel's records would have said."""
    account = account or roles.RoleAccount(SCHEDULER, {}, Path("/nonexistent/scheduler.log"))
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
    # Reaped by the scheduler, with a task process of its own that exited. Its record holds the whole
    # life of the threads it still had at the start (0.3 of its 0.4 then: a thread of 0.1 had ended).
    seconds = _account(
        {WORKER: (SCHEDULER, "airflow worker -- AsyncLocalExecutor: t")},
        {WORKER: (0.4, 0.0, 0.3)},
        {},
        [roles.Exited(TASK, WORKER, 0.5, "x"), roles.Exited(WORKER, SCHEDULER, 0.5, "x")],
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


def test_what_no_record_holds_of_the_reaped_total_is_the_exits_work() -> None:
    # Two workloads and their task processes, each record short of the process's whole cost by its
    # exit's teardown, which only the reaper's total holds.
    account = roles.RoleAccount(SCHEDULER, {}, Path("/nonexistent/scheduler.log"))
    seconds = _account(
        {},
        {},
        {},
        [
            roles.Exited(TASK, WORKER, 0.3, "x"),
            roles.Exited(WORKER, SCHEDULER, 0.2, "x"),
            roles.Exited(CHILD, 1004, 0.3, "x"),
            roles.Exited(1004, SCHEDULER, 0.2, "x"),
        ],
        reaped=1.2,
        account=account,
    )
    assert account.exits == pytest.approx(0.2)
    assert seconds["task_process"] == pytest.approx(0.6)
    assert seconds["workload"] == pytest.approx(0.6)  # its records and every exit's work
    account.seconds = seconds
    assert account.per_task(2)[roles.EXITS] == pytest.approx(0.1)


def test_a_process_that_was_a_zombie_at_the_start_counts_nothing() -> None:
    # Exited before the records began: its whole life is in the scheduler's children time once reaped.
    seconds = _account(
        {WORKER: (SCHEDULER, "airflow worker -- AsyncLocalExecutor: t"), 1004: (SCHEDULER, "x")},
        {WORKER: (0.0, 0.0), 1004: (0.7, 0.2)},
        {},
        [roles.Exited(TASK, WORKER, 0.3, "x"), roles.Exited(WORKER, SCHEDULER, 0.2, "x")],
        reaped=1.4,
    )
    assert seconds["workload"] == pytest.approx(0.2)
    assert seconds["task_process"] == pytest.approx(0.3)
    assert seconds["unattributed"] == pytest.approx(0.0)


def _record(tgid: int, pid: int, ppid: int, cpu_ns: int, *, last: bool, version: int = 14) -> bytes:
    """A netlink payload with one thread's exit record, as the kernel writes it."""
    stats = bytearray(420)
    struct.pack_into("=H", stats, 0, version)
    struct.pack_into("=B", stats, 8, 0x20 if last else 0)
    struct.pack_into("=Q", stats, 72, cpu_ns)
    struct.pack_into("=32s", stats, 80, b"python3")
    struct.pack_into("=II", stats, 128, pid, ppid)
    struct.pack_into("=I", stats, 368, tgid)

    def attr(kind: int, value: bytes) -> bytes:
        raw = struct.pack("=HH", 4 + len(value), kind) + value
        return raw + b"\0" * (-len(raw) % 4)

    nested = attr(1, struct.pack("=I", pid)) + attr(3, bytes(stats))
    return struct.pack("=BBH", 2, 1, 0) + attr(4, nested)


def test_a_pid_used_twice_is_two_processes_and_a_process_s_threads_are_one() -> None:
    listener = taskstats.Listener()
    family = 30
    for payload in (
        _record(500, 501, 1, 10_000_000, last=False),  # a thread of 500 ends
        _record(500, 500, 1, 20_000_000, last=True),  # then its leader, the last: 500 exited
        _record(600, 600, 500, 5_000_000, last=True),
        _record(500, 500, 7, 40_000_000, last=True),  # pid 500 again: another process
    ):
        listener._dispatch(family, family, payload)
    assert listener.lost is None
    assert listener.exited() == [
        taskstats.ExitedProcess(500, 1, 0.03, "python3"),
        taskstats.ExitedProcess(600, 500, 0.005, "python3"),
        taskstats.ExitedProcess(500, 7, 0.04, "python3"),
    ]


def test_a_thread_s_record_that_comes_after_its_process_ended_is_that_process_s() -> None:
    listener = taskstats.Listener()
    for payload in (
        _record(500, 500, 1, 20_000_000, last=True),  # the leader sends the process's last record
        _record(500, 502, 1, 1_000_000, last=False),  # a thread that had left first sends its own late
        _record(700, 700, 1, 3_000_000, last=True),
    ):
        listener._dispatch(30, 30, payload)
    assert listener.exited() == [
        taskstats.ExitedProcess(500, 1, 0.021, "python3"),
        taskstats.ExitedProcess(700, 1, 0.003, "python3"),
    ]
    assert not listener.timeless


def test_records_without_a_run_time_are_no_account() -> None:
    listener = taskstats.Listener()
    listener._dispatch(30, 30, _record(500, 500, 1, 0, last=True))
    assert listener.timeless


def test_a_record_it_cannot_read_makes_the_records_lost() -> None:
    listener = taskstats.Listener()
    listener._dispatch(30, 30, _record(500, 500, 1, 1, last=True, version=9))  # no thread group id yet
    assert listener.lost is not None
    assert "version 9" in listener.lost
