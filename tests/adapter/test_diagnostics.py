"""get_health(), the status file and CLI, and SIGUSR2's dump, on a real executor with real children."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from async_local_executor.core.health import Health, Verdict
from async_local_executor.ops.status import read_all
from tests.adapter import workloads
from tests.adapter.driver import GUARD, RecordingExecutor, Scheduler, held_pid, holding, queue
from tests.core.helpers import FakeClock

CLI = [sys.executable, "-m", "async_local_executor.ops.cli"]


def wait_for_health(ex: RecordingExecutor, done: Callable[[Health], bool]) -> Health:
    """The first verdict ``done`` accepts; looked at again after each of the loop's health reports."""
    seen: list[Health] = []

    def accepted() -> bool:
        seen.append(ex.get_health())
        return done(seen[-1])

    ex.until_reported(accepted)
    return seen[-1]


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "state"
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__STATE_DIR", str(directory))
    return directory


@pytest.fixture
def executor(state_dir: Path, launcher: str) -> Iterator[RecordingExecutor]:
    ex = RecordingExecutor(parallelism=2)
    assert ex.get_health() == Health(Verdict.UNKNOWN, ("executor not started",))
    ex.start()
    yield ex
    ex.end()
    assert ex.get_health() == Health(Verdict.UNKNOWN, ("executor stopped",))


def test_a_started_executor_turns_healthy(executor: RecordingExecutor) -> None:
    assert wait_for_health(executor, lambda h: h.verdict is not Verdict.UNKNOWN) == Health(Verdict.HEALTHY)


@pytest.mark.parametrize("launcher", ["forkserver"], indirect=True)
def test_a_dead_fork_server_is_replaced_on_an_idle_executor_which_turns_healthy_again(
    executor: RecordingExecutor, launcher: str
) -> None:
    first = workloads.task("ok")
    queue(executor, first)
    scheduler = Scheduler(executor)
    scheduler.run_until(lambda: first.key in scheduler.events)  # the fork server is up and serving
    pid = _fork_server_pid(executor)
    os.kill(pid, 9)
    # No workload arrives: the replacement must not wait for one (the reason given meanwhile, "fork
    # server (pid N) is not running; a new one is starting", is asserted in tests/core).
    replacement = _fork_server_pid(executor, other_than=pid)
    health = wait_for_health(executor, lambda h: h.verdict is Verdict.HEALTHY)
    assert health == Health(Verdict.HEALTHY)
    assert _fork_server_pid(executor) == replacement
    item = workloads.task("ok", map_index=1)
    queue(executor, item)
    scheduler.run_until(lambda: item.key in scheduler.events)
    assert _fork_server_pid(executor) == replacement


def _is_helper(process: psutil.Process) -> bool:
    try:
        command = " ".join(process.cmdline())
        return "forkserver.helper" in command and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _fork_server_pid(ex: RecordingExecutor, other_than: int | None = None) -> int:
    # A replacement helper sends no event this far; the loop's health reports are the tick to look on.
    helpers: list[psutil.Process] = []

    def found() -> bool:
        helpers[:] = [p for p in psutil.Process().children() if p.pid != other_than and _is_helper(p)]
        return bool(helpers)

    ex.until_reported(found)
    [helper] = helpers
    return int(helper.pid)


@pytest.mark.usefixtures("launcher")
def test_a_tripped_memory_guard_is_unhealthy_and_says_so(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__MIN_AVAILABLE_MEMORY_MB", str(2**40))  # no host has it
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__SHUTDOWN_TIMEOUT", "0")  # it would never launch
    ex = RecordingExecutor(parallelism=2)
    ex.start()
    try:
        queue(ex, workloads.task("ok"))
        Scheduler(ex).loop_once()
        health = wait_for_health(ex, lambda h: h.verdict is Verdict.UNHEALTHY)
        assert health.reason is not None
        assert "memory guard holding 1 workload(s)" in health.reason
    finally:
        ex.end()


@pytest.mark.usefixtures("launcher")
def test_a_blocked_loop_is_reported_while_blocked_and_after(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__ASYNC_LOCAL_EXECUTOR__HEALTH_LOOP_LAG_LIMIT", "0.5")
    clock = FakeClock()

    class FakeTimeExecutor(RecordingExecutor):
        pass

    FakeTimeExecutor.clock = clock  # the probe's sleeps and the verdict's age, driven by hand
    ex = FakeTimeExecutor(parallelism=2)
    blocking, released = threading.Event(), threading.Event()

    def block(*_: object) -> None:
        # Fault injection: something on the loop thread blocks it, as a blocking call by mistake would.
        blocking.set()
        released.wait(GUARD)

    ex.start()
    try:
        # The first report is in; the probe parks on the clock before the loop runs anything else.
        before = wait_for_health(ex, lambda h: h.verdict is not Verdict.UNKNOWN)
        assert "event loop" not in (before.reason or "")
        ex._runtime._post(block)  # type: ignore[union-attr]
        assert blocking.wait(GUARD)
        clock.advance(6.0)  # past the 5 s the loop may go without a report
        # get_health() keeps answering from this thread while the loop cannot.
        during = ex.get_health()
        assert during == Health(Verdict.UNHEALTHY, ("event loop has not answered for 6s",))
        released.set()
        # The probe's sleep of 0.5 s ended 5.5 s late: the first report after says so.
        after = wait_for_health(ex, lambda h: "lagging" in (h.reason or ""))
        assert after.verdict is Verdict.UNHEALTHY
        assert "event loop lagging 5.5s (limit 0.5s)" in after.reasons
    finally:
        released.set()
        ex.end()


def test_status_cli_shows_a_running_workload_and_the_file_goes_with_the_executor(
    executor: RecordingExecutor, state_dir: Path, gate: Path
) -> None:
    held = workloads.task(f"hold:{gate}")
    queue(executor, held)
    scheduler = Scheduler(executor)
    scheduler.run_until(lambda: holding(gate) == 1)
    pid = held_pid(gate)
    # Written every 2 s off the scheduler's thread: wait until a write has seen the workload.
    scheduler.run_until(lambda: any(r["pid"] == pid for f in read_all(state_dir) for r in f.data["running"]))

    shown = subprocess.run(
        [*CLI, "status", "--json", "--state-dir", str(state_dir)], capture_output=True, text=True, check=True
    )
    [executor_status] = json.loads(shown.stdout)
    assert executor_status["stale"] is None
    assert executor_status["pid"] == os.getpid()
    assert executor_status["health"] == {
        "status": "healthy",
        "reason": None,
        "reasons": [],
        "public_reasons": [],
        "public_codes": [],
    }
    [row] = executor_status["running"]
    assert row["key"] == f"adapter_dag.hold:{gate} try 1"
    assert row["pid"] == pid
    assert row["memory_mb"] > 0
    table = subprocess.run(
        [*CLI, "status", "--state-dir", str(state_dir)], capture_output=True, text=True, check=True
    )
    assert "HEALTHY" in table.stdout
    assert str(pid) in table.stdout
    check = subprocess.run(
        [*CLI, "status", "--check", "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout
    assert check.stdout.strip().endswith(": healthy")

    _watch_redraws_until_interrupted(state_dir, str(pid))

    gate.unlink()
    scheduler.run_until(lambda: held.key in scheduler.events)
    executor.end()
    assert read_all(state_dir) == []
    gone = subprocess.run(
        [*CLI, "status", "--check", "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert gone.returncode == 2


# Ctrl-C's SIGINT at its default disposition in the command, whatever this test runs under: a job a
# non-interactive shell starts in the background inherits SIGINT ignored, and Python then never raises
# KeyboardInterrupt. Only an ignored or default disposition survives exec; the handler comes at startup.
_WITH_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


def _watch_redraws_until_interrupted(state_dir: Path, pid: str) -> None:
    watch = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _WITH_SIGINT,
            *CLI[1:],
            "status",
            "--watch",
            "0.1",
            "--state-dir",
            str(state_dir),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert watch.stdout is not None
    reports = 0
    try:
        for line in watch.stdout:  # each report starts with a timestamp line; ends at EOF if it dies
            reports += line.startswith("--- ")
            if reports == 2 and pid in line:
                break
        watch.send_signal(signal.SIGINT)
        # Keep reading to the end: redraws written meanwhile must not fill the pipe and block the exit.
        watch.communicate(timeout=GUARD)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    assert watch.returncode == 0
    assert reports == 2


def test_the_airflow_cli_command_runs_the_same_status(
    executor: RecordingExecutor, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wait_for_health(executor, lambda h: h.verdict is Verdict.HEALTHY)
    Scheduler(executor).run_until(lambda: bool(read_all(state_dir)))
    [group] = RecordingExecutor.get_cli_commands()
    commands = {command.name: command for command in group.subcommands}
    assert group.name == "async-local-executor"
    assert sorted(commands) == ["drain", "pause", "resize", "resume", "status"]

    def parse(name: str, argv: list[str]) -> argparse.Namespace:
        parser = argparse.ArgumentParser()
        for arg in commands[name].args:
            arg.add_to_parser(parser)
        return parser.parse_args(argv)

    capsys.readouterr()  # what was printed before (Airflow's own lines at start) is not the command's
    commands["status"].func(parse("status", ["--json", "--state-dir", str(state_dir)]))
    [shown] = json.loads(capsys.readouterr().out)
    assert shown["instance"] == executor._journal.instance  # type: ignore[union-attr]
    # A control command through Airflow's CLI: it returns once the executor (whose heartbeat this loop
    # runs) applied it, and a failure is its exit status.
    done = threading.Event()

    def pause() -> None:
        try:
            commands["pause"].func(parse("pause", ["--state-dir", str(state_dir), "--by", "ops"]))
        finally:
            done.set()

    thread = threading.Thread(target=pause)
    thread.start()
    Scheduler(executor).run_until(done.is_set)
    thread.join()
    assert executor.slots_available == 0
    assert "pause: paused by ops at" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        commands["resize"].func(parse("resize", ["--parallelism", "0", "--state-dir", str(state_dir)]))
    assert refused.value.code == 2


def test_sigusr2_dump_logs_health_and_running_workloads(
    executor: RecordingExecutor, caplog: pytest.LogCaptureFixture, gate: Path
) -> None:
    queue(executor, workloads.task(f"hold:{gate}"))
    scheduler = Scheduler(executor)
    scheduler.run_until(lambda: holding(gate) == 1)
    scheduler.run_until(lambda: executor._runtime.report.state.running != ())  # type: ignore[union-attr]
    caplog.set_level(logging.INFO, logger="async_local_executor.adapter.diagnostics")
    executor.debug_dump()
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "async_local_executor health: healthy" in text
    assert f"adapter_dag.hold:{gate} try 1 pid" in text
    gate.unlink()
