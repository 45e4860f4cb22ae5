"""The supervision core with real child processes and no Airflow."""

from __future__ import annotations

import fcntl
import os
import resource
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NoReturn

import anyio
import psutil
import pytest

from async_local_executor.core.admission import MB
from async_local_executor.core.clock import SYSTEM, Clock
from async_local_executor.core.launchers.base import Launcher, LaunchRequest
from async_local_executor.core.launchers.forkserver.launcher import ForkServerLauncher
from async_local_executor.core.launchers.subprocess import SubprocessLauncher
from async_local_executor.core.outcome import OutcomeKind, Times
from async_local_executor.core.supervisor import Supervisor
from async_local_executor.core.termination import TerminationPolicy
from tests.core.helpers import GUARD, FakeClock, Recorder, py

pytestmark = pytest.mark.asyncio


TARGET = "tests.core.launchers.forkserver.targets:python_c"


@pytest.fixture(params=["subprocess", "forkserver"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def make_launcher(kind: str, recorder: Recorder) -> Launcher:
    if kind == "forkserver":
        return ForkServerLauncher(target=TARGET, output=recorder.output)
    return SubprocessLauncher(output=recorder.output)


@asynccontextmanager
async def serving(
    recorder: Recorder,
    kind: str | Launcher = "subprocess",
    *,
    limit: int | None = None,
    clock: Clock = SYSTEM,
    grace: float = 10.0,
    **admission: Any,
) -> AsyncIterator[Supervisor]:
    supervisor = Supervisor(
        make_launcher(kind, recorder) if isinstance(kind, str) else kind,
        recorder,
        limit=limit,
        policy=TerminationPolicy(grace=grace),
        clock=clock,
        **admission,
    )
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.serve)
        try:
            yield supervisor
        finally:
            try:
                # Longer than the shutdown's own wait, so its escalation runs before the guard trips.
                with anyio.fail_after(GUARD * 2 + grace):
                    await supervisor.shutdown(wait=GUARD)
            finally:
                tg.cancel_scope.cancel()  # a shutdown cut short must fail the test, not leave serve() running


def is_dead(pid: int) -> bool:
    # Killed but not yet reaped by its new parent (init) still counts as dead.
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


async def until_dead(pid: int) -> None:
    # SIGTERM/SIGKILL are queued at once but take effect when the process next runs; on a loaded
    # machine that is not instantaneous, so wait for the effect (the guard only bounds a real failure).
    with anyio.fail_after(GUARD):
        while not is_dead(pid):  # noqa: ASYNC110 - a process's death has no event to await here
            await anyio.sleep(0.01)


async def run_one(kind: str, argv: list[str], *, stdin: bytes = b"") -> Recorder:
    recorder = Recorder()
    async with serving(recorder, kind) as supervisor:
        supervisor.submit(LaunchRequest("k", argv, stdin=stdin))
        await recorder.until(lambda: recorder.outcomes)
    return recorder


async def test_success_reports_exit_zero_and_pid(kind: str) -> None:
    recorder = await run_one(kind, py("print('hello')"))
    outcome = recorder.outcome("k")
    assert outcome.ok
    assert outcome.kind is OutcomeKind.EXITED
    assert recorder.pids["k"] > 0
    assert ("k", "hello") in recorder.lines


async def test_stdin_reaches_the_child_and_never_argv(kind: str) -> None:
    secret = b"token-that-must-not-be-in-argv"
    recorder = await run_one(kind, py("import sys; print(sys.stdin.read())"), stdin=secret)
    assert ("k", secret.decode()) in recorder.lines


async def test_nonzero_exit_is_a_failure_with_its_code(kind: str) -> None:
    outcome = (await run_one(kind, py("import sys; sys.exit(3)"))).outcome("k")
    assert not outcome.ok
    assert (outcome.kind, outcome.returncode, outcome.reason) == (OutcomeKind.EXITED, 3, "exited with code 3")


async def test_killed_by_a_signal(kind: str) -> None:
    outcome = (await run_one(kind, py("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"))).outcome(
        "k"
    )
    assert (outcome.kind, outcome.returncode, outcome.reason) == (
        OutcomeKind.SIGNALLED,
        -signal.SIGKILL,
        "killed by SIGKILL",
    )


async def test_launch_failure_names_the_cause_and_the_next_workload_still_runs() -> None:
    recorder = Recorder()
    async with serving(recorder, limit=1) as supervisor:
        supervisor.submit(LaunchRequest("missing", ["/nonexistent/python3"]))
        supervisor.submit(LaunchRequest("fine", py("pass")))
        await recorder.until(lambda: len(recorder.outcomes) == 2)
    failed = recorder.outcome("missing")
    assert failed.kind is OutcomeKind.LAUNCH_FAILED
    assert "/nonexistent/python3" in failed.reason
    assert "No such file" in failed.reason
    assert "missing" not in recorder.pids
    assert recorder.outcome("fine").ok


async def test_a_full_file_table_fails_launches_clearly_and_they_work_again_once_it_is_lifted(
    kind: str,
) -> None:
    recorder = Recorder()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    async with serving(recorder, kind, limit=2) as supervisor:
        supervisor.submit(LaunchRequest("warm", py("pass")))  # the fork server is up before the squeeze
        await recorder.until(lambda: len(recorder.outcomes) == 1)
        # RLIMIT_NOFILE caps fd numbers: at the lowest free one, every new fd fails with EMFILE.
        probe = os.open(os.devnull, os.O_RDONLY)
        os.close(probe)
        resource.setrlimit(resource.RLIMIT_NOFILE, (probe, hard))
        try:
            supervisor.submit(LaunchRequest("starved", py("pass")))
            await recorder.until(lambda: len(recorder.outcomes) == 2)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        supervisor.submit(LaunchRequest("after", py("print('ran')")))
        await recorder.until(lambda: len(recorder.outcomes) == 3)
    starved = recorder.outcome("starved")
    assert starved.kind is OutcomeKind.LAUNCH_FAILED
    assert "Too many open files" in starved.reason
    assert "starved" not in recorder.pids
    assert recorder.outcome("after").ok
    assert ("after", "ran") in recorder.lines


async def test_each_child_leads_its_own_process_group(kind: str) -> None:
    # Fork-server children stay in our session, so Linux's per-session CPU fairness (autogroups)
    # counts them as our work; plain children start their own session (exec gives no race-free
    # way to set only the group from a multi-threaded parent).
    recorder = await run_one(kind, py("import os; print(os.getpgid(0) == os.getpid(), os.getsid(0))"))
    [line] = [line for key, line in recorder.lines if key == "k"]
    leads, session = line.split()
    assert leads == "True"
    if kind.endswith("forkserver"):
        assert int(session) == os.getsid(0)
    else:
        assert int(session) != os.getsid(0)


async def test_limit_holds_counted_by_the_children(tmp_path: Path, kind: str) -> None:
    live = tmp_path / "live"
    live.mkdir()
    record = tmp_path / "record"
    # Each child marks itself live, holds, counts the live markers, unmarks, exits: markers are a subset
    # of the children alive, so a count above the limit means the limit broke.
    code = f"""
import os, time
me = os.path.join({str(live)!r}, str(os.getpid()))
open(me, "w").close()
time.sleep(0.5)
n = len(os.listdir({str(live)!r}))
os.remove(me)
with open({str(record)!r}, "a") as f:
    f.write(f"{{n}}\\n")
"""
    recorder = Recorder()
    async with serving(recorder, kind, limit=3) as supervisor:
        for i in range(12):
            supervisor.submit(LaunchRequest(i, py(code)))
        await recorder.until(lambda: len(recorder.outcomes) == 12)
    counts = [int(line) for line in record.read_text().split()]
    assert len(counts) == 12
    assert all(o.ok for o in recorder.outcomes)
    assert max(counts) == 3


async def test_thousands_finishing_at_once_lose_no_result(tmp_path: Path, kind: str) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    n = min(1500, (hard - 200) // 4)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    gate = tmp_path / "gate"
    gate.touch()
    recorder = Recorder()
    try:
        async with serving(recorder, kind) as supervisor:
            # Inside serving(): whatever fails, the lock goes before the shutdown waits for the children.
            with gate.open() as held:
                # Every child blocks on a shared lock until we drop our exclusive one: they all exit together.
                fcntl.flock(held, fcntl.LOCK_EX)
                for i in range(n):
                    supervisor.submit(LaunchRequest(i, gate_waiter(kind, gate)))
                await recorder.until(lambda: len(recorder.pids) == n, guard=THOUSANDS_GUARD)
                assert recorder.outcomes == []
                fcntl.flock(held, fcntl.LOCK_UN)
            await recorder.until(lambda: len(recorder.outcomes) == n, guard=THOUSANDS_GUARD)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert sorted(o.key for o in recorder.outcomes) == list(range(n))  # type: ignore[type-var]
    assert all(o.ok for o in recorder.outcomes)


# 1,500 launches on 2 busy cores: only a hang should trip this.
THOUSANDS_GUARD = 300.0


def gate_waiter(kind: str, gate: Path) -> list[str]:
    # A tiny exec for the plain path; in a fork-server child the same wait costs no interpreter start.
    if kind == "forkserver":
        return py(f"import fcntl; fcntl.flock(open({str(gate)!r}), fcntl.LOCK_SH)")
    return ["flock", "-s", str(gate), "true"]


IGNORES_TERM = """
import signal, sys, time
def on_term(signum, frame):
    print("got SIGTERM, carrying on", flush=True)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
while True:
    time.sleep(1)
"""


def said(recorder: Recorder, key: object, text: str) -> Callable[[], bool]:
    return lambda: (key, text) in recorder.lines


async def test_terminate_escalates_to_sigkill_after_the_grace_period(kind: str) -> None:
    recorder = Recorder()
    clock = FakeClock()
    async with serving(recorder, kind, clock=clock, grace=7.5) as supervisor:
        supervisor.submit(LaunchRequest("stubborn", py(IGNORES_TERM)))
        await recorder.until(said(recorder, "stubborn", "ready"))
        assert supervisor.stop("stubborn", "revoked") == 1
        await recorder.until(said(recorder, "stubborn", "got SIGTERM, carrying on"))
        await clock.sleepers(1)  # the grace period has begun
        clock.advance(7.4)
        assert clock.sleeping == 1  # a shorter grace would have woken (and left the clock) here
        assert recorder.outcomes == []  # still alive: SIGTERM alone did not end it
        clock.advance(0.1)
        await recorder.until(lambda: recorder.outcomes)
    outcome = recorder.outcome("stubborn")
    assert outcome.kind is OutcomeKind.TERMINATED
    assert outcome.returncode == -signal.SIGKILL
    assert outcome.reason == "revoked: terminated (killed by SIGKILL)"


async def test_terminate_stops_at_sigterm_when_the_child_obeys(kind: str) -> None:
    recorder = Recorder()
    clock = FakeClock()  # never advanced: the grace period cannot run out
    async with serving(recorder, kind, clock=clock) as supervisor:
        supervisor.submit(
            LaunchRequest("polite", py("import time; print('ready', flush=True); time.sleep(60)"))
        )
        await recorder.until(said(recorder, "polite", "ready"))
        supervisor.stop("polite", "revoked")
        await recorder.until(lambda: recorder.outcomes)
    assert recorder.outcome("polite").returncode == -signal.SIGTERM


async def test_terminate_kills_the_whole_process_group(tmp_path: Path, kind: str) -> None:
    # The grandchild stands in for the task process the Airflow supervisor forks.
    code = """
import subprocess, sys, time
g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(g.pid, flush=True)
time.sleep(60)
"""
    recorder = Recorder()
    async with serving(recorder, kind) as supervisor:
        supervisor.submit(LaunchRequest("tree", py(code)))  # same for both paths
        await recorder.until(lambda: any(k == "tree" and line.isdigit() for k, line in recorder.lines))
        grandchild = int(next(line for _, line in recorder.lines if line.isdigit()))
        supervisor.stop("tree", "revoked")
        await recorder.until(lambda: recorder.outcomes)
    await until_dead(grandchild)


async def test_shutdown_drops_waiting_workloads_and_terminates_running_ones(kind: str) -> None:
    recorder = Recorder()
    supervisor = Supervisor(make_launcher(kind, recorder), recorder, limit=1)
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.serve)
        for key in ("a", "b", "c"):
            supervisor.submit(
                LaunchRequest(key, py("import time; print('ready', flush=True); time.sleep(60)"))
            )
        await recorder.until(said(recorder, "a", "ready"))
        with anyio.fail_after(GUARD):
            await supervisor.shutdown(wait=0)
        supervisor.submit(LaunchRequest("late", py("pass")))
    kinds = {o.key: o.kind for o in recorder.outcomes}
    assert kinds == {
        "a": OutcomeKind.TERMINATED,
        "b": OutcomeKind.NOT_STARTED,
        "c": OutcomeKind.NOT_STARTED,
        "late": OutcomeKind.NOT_STARTED,
    }
    assert supervisor.in_flight == 0


async def test_shutdown_waits_for_running_workloads_within_its_bound(kind: str) -> None:
    recorder = Recorder()
    supervisor = Supervisor(make_launcher(kind, recorder), recorder, limit=2)
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.serve)
        supervisor.submit(LaunchRequest("quick", py("import time; time.sleep(0.2)")))
        with anyio.fail_after(GUARD):
            await supervisor.shutdown(wait=GUARD)
    assert recorder.outcome("quick").ok


async def test_output_is_drained_while_the_child_runs(kind: str) -> None:
    # 4 MiB through a 64 KiB pipe: the child would block forever if nobody read.
    recorder = await run_one(kind, py("import sys; sys.stdout.write(('x' * 1023 + '\\n') * 4096)"))
    assert recorder.outcome("k").ok
    assert [key for key, line in recorder.lines if line and key != "k"] == []
    assert sum(1 for key, line in recorder.lines if line) == 4096


async def test_a_workload_past_its_timeout_is_terminated_and_says_so(kind: str) -> None:
    recorder = Recorder()
    clock = FakeClock()
    async with serving(recorder, kind, clock=clock) as supervisor:
        supervisor.submit(LaunchRequest("slow", py("import time; time.sleep(60)"), timeout=0.5))
        await recorder.until(lambda: "slow" in recorder.pids)
        await clock.sleepers(1)  # its timer runs
        clock.advance(0.4)
        assert clock.sleeping == 1  # not due yet
        supervisor.submit(LaunchRequest("quick", py("pass"), timeout=30))
        await recorder.until(lambda: recorder.outcomes)
        assert [o.key for o in recorder.outcomes] == ["quick"]
        clock.advance(0.1)
        await recorder.until(lambda: len(recorder.outcomes) == 2)
    slow = recorder.outcome("slow")
    assert slow.kind is OutcomeKind.TERMINATED
    assert slow.reason.startswith("timed out after 0.5s: terminated (killed by SIG")
    # The quick one's 30 s timer was cancelled when it exited: the clock never reaches it, so leaving
    # `serving` would otherwise wait on it until the guard failed the test.
    assert recorder.outcome("quick").ok


async def test_a_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeout must be > 0"):
        LaunchRequest("k", py("pass"), timeout=0)


async def test_a_queue_limit_holds_its_group_without_holding_back_others(tmp_path: Path, kind: str) -> None:
    gate = tmp_path / "gate"
    gate.touch()
    hold = py(f"import os, time\nwhile os.path.exists({str(gate)!r}): time.sleep(0.01)")
    recorder = Recorder()
    async with serving(recorder, kind, limit=3, group_limits={"reports": 1}) as supervisor:
        supervisor.submit(LaunchRequest("r1", hold, group="reports"))
        supervisor.submit(LaunchRequest("r2", hold, group="reports"))
        supervisor.submit(LaunchRequest("d1", hold, group="default"))
        supervisor.submit(LaunchRequest("d2", hold))
        # Three slots: r1 and the two others start; r2 waits for its group, not for a slot.
        await recorder.until(lambda: len(recorder.pids) == 3)
        assert set(recorder.pids) == {"r1", "d1", "d2"}
        gate.unlink()
        await recorder.until(lambda: len(recorder.outcomes) == 4)
    assert all(o.ok for o in recorder.outcomes)


async def test_low_memory_makes_workloads_wait_not_fail(kind: str) -> None:
    free = {"bytes": 10 * MB}
    reads = {"count": 0}

    def available() -> int:
        reads["count"] += 1
        return free["bytes"]

    recorder = Recorder()
    clock = FakeClock()
    async with serving(
        recorder, kind, clock=clock, memory_floor=100 * MB, available_memory=available, memory_poll=2.0
    ) as supervisor:
        supervisor.submit(LaunchRequest("k", py("print('ran')")))
        await clock.sleepers(1)  # it has checked, found too little and waits to check again
        clock.advance(2.0)
        await clock.sleepers(1)  # checked again, still too little
        assert reads["count"] == 2
        assert recorder.pids == {}
        assert recorder.outcomes == []
        assert supervisor.state().memory_low
        free["bytes"] = 200 * MB
        clock.advance(2.0)
        await recorder.until(lambda: len(recorder.outcomes) == 1)
        assert not supervisor.state().memory_low
    assert recorder.outcome("k").ok
    assert reads["count"] == 3


async def test_admission_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="limit of group 'reports' must be >= 1"):
        Supervisor(SubprocessLauncher(), Recorder(), limit=2, group_limits={"reports": 0})


async def test_stopping_a_workload_reaches_groups_its_descendants_made(kind: str) -> None:
    # As the task SDK does with the task process: a child in a process group of its own.
    code = (
        "import os, sys, time\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.setpgid(0, 0)\n"
        "    print('grandchild', os.getpid(), flush=True)\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "time.sleep(60)\n"
    )
    recorder = Recorder()
    async with serving(recorder, kind) as supervisor:
        supervisor.submit(LaunchRequest("k", py(code)))
        await recorder.until(lambda: any(line.startswith("grandchild") for _, line in recorder.lines))
        [grandchild] = [int(line.split()[1]) for _, line in recorder.lines if line.startswith("grandchild")]
        assert os.getpgid(grandchild) == grandchild
        supervisor.stop("k", "test over")
        await recorder.until(lambda: len(recorder.outcomes) == 1)
        await until_dead(grandchild)
    assert recorder.outcome("k").kind is OutcomeKind.TERMINATED


async def test_a_grandchild_left_holding_the_output_does_not_delay_the_outcome(kind: str) -> None:
    # The leader exits at once; its grandchild (same group) would hold the pipe open for a minute.
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    print('grandchild', os.getpid(), flush=True)\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "time.sleep(0.2)\n"
    )
    recorder = Recorder()
    async with serving(recorder, kind) as supervisor:
        supervisor.submit(LaunchRequest("k", py(code)))
        with anyio.fail_after(30):  # far less than the grandchild's minute
            await recorder.until(lambda: len(recorder.outcomes) == 1)
    assert recorder.outcome("k").ok
    [grandchild] = [int(line.split()[1]) for _, line in recorder.lines if line.startswith("grandchild")]
    await until_dead(grandchild)


async def test_a_child_that_closes_its_output_early_is_still_awaited(kind: str) -> None:
    code = "import os, time\nprint('bye', flush=True)\nos.close(1)\nos.close(2)\ntime.sleep(0.3)\nraise SystemExit(5)\n"
    recorder = Recorder()
    async with serving(recorder, kind) as supervisor:
        supervisor.submit(LaunchRequest("k", py(code)))
        await recorder.until(lambda: len(recorder.outcomes) == 1)
    outcome = recorder.outcome("k")
    assert (outcome.kind, outcome.returncode) == (OutcomeKind.EXITED, 5)
    assert ("k", "bye") in recorder.lines


class FailingOnStart(Recorder):
    """A listener that raises when told a workload started: a bug after the process exists."""

    def started(self, key: Any, pid: int) -> None:
        super().started(key, pid)
        raise RuntimeError("listener bug")


async def test_an_internal_error_after_launch_kills_the_process_and_reports_it_lost(kind: str) -> None:
    recorder = FailingOnStart()
    async with serving(recorder, kind) as supervisor:
        supervisor.submit(LaunchRequest("running", py("import time; time.sleep(600)")))
        await recorder.until(lambda: recorder.outcomes)
        # Nothing reaps or reports it any more: it must not run on after its final event.
        await until_dead(recorder.pids["running"])
    [outcome] = recorder.outcomes
    assert outcome.kind is OutcomeKind.LOST
    assert outcome.reason == "internal error: RuntimeError('listener bug')"


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


async def test_an_internal_error_after_launch_still_awaits_the_process_and_closes_its_pipes(
    kind: str,
) -> None:
    # A first workload opens what the event loop keeps for every later one (uvloop opens /dev/null).
    await run_one(kind, py("pass"))
    before = open_fds()
    recorder = FailingOnStart()
    async with serving(recorder, kind) as supervisor:
        supervisor.submit(LaunchRequest("running", py("import time; time.sleep(600)")))
        await recorder.until(lambda: recorder.outcomes)
    # The shutdown waited for the workload's task, which awaited the process it killed.
    with pytest.raises(psutil.NoSuchProcess):  # reaped: not even a zombie is left
        psutil.Process(recorder.pids["running"])
    assert open_fds() == before, "its pipes (or pidfd) are still open"
    assert recorder.outcome("running").kind is OutcomeKind.LOST


class FailingOutput(Recorder):
    """An output sink with a bug: it raises on one line."""

    def output(self, key: Any, line: str) -> None:
        super().output(key, line)
        if line == "bad":
            raise RuntimeError("sink bug")


async def test_an_output_sink_that_raises_loses_lines_not_the_workload(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = FailingOutput()
    async with serving(recorder, kind) as supervisor:
        supervisor.submit(LaunchRequest("k", py("print('bad'); print('bad'); print('good')")))
        await recorder.until(lambda: recorder.outcomes)
    assert recorder.outcome("k").ok
    assert ("k", "good") in recorder.lines
    # Said once per workload, not once per line.
    [said] = [r for r in caplog.records if r.name == "async_local_executor.core.launchers.output"]
    assert said.exc_info is not None
    assert str(said.exc_info[1]) == "sink bug"


async def test_times_are_read_from_the_injected_clock() -> None:
    clock = FakeClock()
    accepted = clock.time()
    free = {"bytes": 0}
    recorder = Recorder()
    async with serving(
        recorder, clock=clock, memory_floor=100 * MB, available_memory=lambda: free["bytes"], memory_poll=5.0
    ) as supervisor:
        supervisor.submit(LaunchRequest("k", py("pass")))
        await clock.sleepers(1)  # accepted now, held back by memory
        free["bytes"] = 200 * MB
        clock.advance(5.0)
        await recorder.until(lambda: recorder.outcomes)
        clock.advance(1.0)
        supervisor.submit(LaunchRequest("missing", ["/nonexistent/python3"]))
        await recorder.until(lambda: len(recorder.outcomes) == 2)
        state = supervisor.state()
    assert recorder.outcome("k").times == Times(accepted, accepted + 5.0, accepted + 5.0)
    assert recorder.outcome("missing").times == Times(accepted + 6.0, None, accepted + 6.0)
    assert state.last_launched_at == accepted + 5.0
    [failure] = state.recent_failures
    assert (failure.at, failure.label) == (accepted + 6.0, "missing")


class BrokenLauncher(SubprocessLauncher):
    """A launcher with a bug: it raises something other than LaunchError."""

    async def launch(self, request: LaunchRequest) -> NoReturn:
        raise RuntimeError("launcher bug")


async def test_an_internal_error_before_launch_reports_a_failed_launch() -> None:
    recorder = Recorder()
    async with serving(recorder, BrokenLauncher()) as supervisor:
        supervisor.submit(LaunchRequest("k", py("pass")))
        await recorder.until(lambda: recorder.outcomes)
        state = supervisor.state()
    [outcome] = recorder.outcomes
    assert (outcome.kind, outcome.reason) == (
        OutcomeKind.LAUNCH_FAILED,
        "internal error: RuntimeError('launcher bug')",
    )
    assert [f.reason for f in state.recent_failures] == [outcome.reason]
    assert state.outcomes_total == {"launch_failed": 1}
