"""The supervisor: admission, stops, shutdown, timeouts and events, on a fake launcher and a fake clock.

Most tests drive :class:`~tests.core.fakes.FakeLauncher`, whose children exit when the test says so,
and a :class:`~tests.core.helpers.FakeClock`, so the supervisor's own logic runs without processes and
without waiting. The tests at the end start real processes on both launch paths, because what they
check is what a real process does: its stdin and output pipes, its process group and descendants, fds
and the kernel's exit storm.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import logging
import os
import resource
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NoReturn

import anyio
import psutil
import pytest
import uvloop

from async_local_executor.core.admission import MB
from async_local_executor.core.errors import LaunchError
from async_local_executor.core.launchers.base import LauncherReport, LaunchRequest, PreloadSummary, TakesOver
from async_local_executor.core.outcome import Cleanup, OutcomeKind, Times
from async_local_executor.core.reaping import ABANDONED_REAP
from async_local_executor.core.stopping import TerminationPolicy
from async_local_executor.core.supervisor import LetGo, Supervisor
from tests.core.fakes import FakeLauncher
from tests.core.helpers import GUARD, FakeClock, Recorder, py, taking_over, until_dead
from tests.core.supervising import in_flight, request, serving

pytestmark = pytest.mark.asyncio


@asynccontextmanager
async def faked(
    *, limit: int | None = None, grace: float = 10.0, ignores: tuple[int, ...] = (), **admission: Any
) -> AsyncIterator[tuple[Supervisor, FakeLauncher, Recorder, FakeClock]]:
    """A supervisor on a fake launcher and a fake clock; on the way out, whatever still runs is stopped."""
    launcher = FakeLauncher(ignores=ignores)
    recorder = Recorder()
    clock = FakeClock()
    supervisor = Supervisor(
        TakesOver(launcher),
        recorder,
        limit=limit,
        policy=TerminationPolicy(grace=grace),
        clock=clock,
        **admission,
    )
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.serve)
        try:
            yield supervisor, launcher, recorder, clock
        finally:
            try:
                with anyio.fail_after(GUARD):
                    await supervisor.shutdown(wait=0)
            finally:
                tg.cancel_scope.cancel()


async def run_one(kind: str, argv: list[str], *, stdin: bytes = b"") -> Recorder:
    recorder = Recorder()
    async with serving(recorder, kind) as supervisor:
        supervisor.submit(LaunchRequest("k", argv, stdin=stdin))
        await recorder.until(lambda: recorder.outcomes)
    return recorder


# The supervisor's logic, on the fake launcher.


@pytest.mark.parametrize(
    ("status", "kind", "reason"),
    [
        (0, OutcomeKind.EXITED, ""),
        (3, OutcomeKind.EXITED, "exited with code 3"),
        (-signal.SIGKILL, OutcomeKind.SIGNALLED, "killed by SIGKILL"),
    ],
)
async def test_an_exit_is_reported_once_with_its_status(status: int, kind: OutcomeKind, reason: str) -> None:
    async with faked() as (supervisor, launcher, recorder, _):
        supervisor.submit(request("k"))
        await launcher.until(lambda: "k" in launcher.children)
        child = launcher.children["k"]
        await recorder.until(lambda: "k" in recorder.pids)
        assert recorder.pids["k"] == child.pid
        assert in_flight(supervisor) == 1
        child.exit(status)
        await recorder.until(lambda: recorder.outcomes)
        assert in_flight(supervisor) == 0
    [outcome] = recorder.outcomes
    assert (outcome.key, outcome.kind, outcome.returncode, outcome.reason) == ("k", kind, status, reason)
    assert outcome.ok is (status == 0)
    assert child.waits == 1
    assert launcher.entered
    assert launcher.exited


async def test_a_lost_exit_status_is_reported_lost() -> None:
    async with faked() as (supervisor, launcher, recorder, _):
        supervisor.submit(request("k"))
        await launcher.until(lambda: "k" in launcher.children)
        launcher.children["k"].lose("its pidfd was closed")
        await recorder.until(lambda: recorder.outcomes)
    assert (recorder.outcome("k").kind, recorder.outcome("k").reason) == (
        OutcomeKind.LOST,
        "its pidfd was closed",
    )


async def test_a_failed_launch_is_reported_and_the_next_workload_still_runs() -> None:
    async with faked(limit=1) as (supervisor, launcher, recorder, _):
        launcher.refuse["missing"] = LaunchError("cannot start '/nonexistent/python3': No such file")
        supervisor.submit(request("missing"))
        supervisor.submit(request("fine"))
        await launcher.until(lambda: "fine" in launcher.children)
        launcher.children["fine"].exit(0)
        await recorder.until(lambda: len(recorder.outcomes) == 2)
        state = supervisor.state()
    failed = recorder.outcome("missing")
    assert (failed.kind, failed.reason) == (
        OutcomeKind.LAUNCH_FAILED,
        "cannot start '/nonexistent/python3': No such file",
    )
    assert "missing" not in recorder.pids
    assert recorder.outcome("fine").ok
    assert [f.reason for f in state.recent_failures] == [failed.reason]
    assert state.outcomes_total == {"launch_failed": 1, "ok": 1}


async def test_the_limit_holds_and_a_slot_passes_on_when_a_workload_ends() -> None:
    async with faked(limit=3) as (supervisor, launcher, recorder, _):
        for i in range(12):
            supervisor.submit(request(i))
        most = 0
        for _ in range(12):
            await launcher.until(lambda: len(launcher.running) == min(3, 12 - len(recorder.outcomes)))
            most = max(most, len(launcher.running))
            assert supervisor.state().waiting == 12 - len(recorder.outcomes) - len(launcher.running)
            launcher.children[launcher.running[0]].exit(0)
            done = len(recorder.outcomes)
            await recorder.until(lambda: len(recorder.outcomes) == done + 1)  # noqa: B023 - awaited here
    assert most == 3
    assert [r.key for r in launcher.requests] == list(range(12))  # slots are handed out in order
    assert all(o.ok for o in recorder.outcomes)


async def test_thousands_ending_at_once_each_get_their_one_outcome() -> None:
    async with faked() as (supervisor, launcher, recorder, _):
        for i in range(1500):
            supervisor.submit(request(i))
        await launcher.until(lambda: len(launcher.children) == 1500)
        for child in launcher.children.values():
            child.exit(0)
        await recorder.until(lambda: len(recorder.outcomes) == 1500)
        assert in_flight(supervisor) == 0
    assert sorted(o.key for o in recorder.outcomes) == list(range(1500))  # type: ignore[type-var]
    assert all(o.ok for o in recorder.outcomes)


async def test_a_queue_limit_holds_its_group_without_holding_back_others() -> None:
    async with faked(limit=3, group_limits={"reports": 1}) as (supervisor, launcher, recorder, _):
        supervisor.submit(request("r1", group="reports"))
        supervisor.submit(request("r2", group="reports"))
        supervisor.submit(request("d1", group="default"))
        supervisor.submit(request("d2"))
        # Three slots: r1 and the two others start; r2 waits for its group, not for a slot.
        await launcher.until(lambda: len(launcher.children) == 3)
        assert set(launcher.children) == {"r1", "d1", "d2"}
        launcher.children["d1"].exit(0)
        await recorder.until(lambda: len(recorder.outcomes) == 1)
        assert "r2" not in launcher.children  # a free slot is not its group's
        launcher.children["r1"].exit(0)
        await launcher.until(lambda: "r2" in launcher.children)
        for key in ("r2", "d2"):
            launcher.children[key].exit(0)
        await recorder.until(lambda: len(recorder.outcomes) == 4)
    assert all(o.ok for o in recorder.outcomes)


async def test_admission_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="limit of group 'reports' must be >= 1"):
        Supervisor(FakeLauncher(), Recorder(), limit=2, group_limits={"reports": 0})


async def test_low_memory_makes_workloads_wait_not_fail() -> None:
    free = {"bytes": 10 * MB}
    reads = {"count": 0}

    def available() -> int:
        reads["count"] += 1
        return free["bytes"]

    async with faked(memory_floor=100 * MB, available_memory=available, memory_poll=2.0) as (
        supervisor,
        launcher,
        recorder,
        clock,
    ):
        supervisor.submit(request("k"))
        await clock.sleepers(1)  # it has checked, found too little and waits to check again
        clock.advance(2.0)
        await clock.sleepers(1)  # checked again, still too little
        assert reads["count"] == 2
        assert launcher.requests == []
        assert supervisor.state().memory_low
        free["bytes"] = 200 * MB
        clock.advance(2.0)
        await launcher.until(lambda: "k" in launcher.children)
        assert not supervisor.state().memory_low
        launcher.children["k"].exit(0)
        await recorder.until(lambda: recorder.outcomes)
    assert recorder.outcome("k").ok
    assert reads["count"] == 3


async def test_stop_escalates_to_sigkill_after_the_grace_period() -> None:
    async with faked(grace=7.5, ignores=(signal.SIGTERM,)) as (supervisor, launcher, recorder, clock):
        supervisor.submit(request("stubborn"))
        await launcher.until(lambda: "stubborn" in launcher.children)
        child = launcher.children["stubborn"]
        assert supervisor.stop("stubborn", "revoked") == 1
        await clock.sleepers(1)  # the grace period has begun
        assert child.signals == [signal.SIGTERM]
        clock.advance(7.4)
        assert clock.sleeping == 1  # a shorter grace would have woken (and left the clock) here
        assert recorder.outcomes == []  # still running: SIGTERM alone did not end it
        clock.advance(0.1)
        await recorder.until(lambda: recorder.outcomes)
    assert child.signals == [signal.SIGTERM, signal.SIGKILL]
    outcome = recorder.outcome("stubborn")
    assert (outcome.kind, outcome.returncode) == (OutcomeKind.TERMINATED, -signal.SIGKILL)
    assert outcome.reason == "revoked: terminated (killed by SIGKILL)"


async def test_stop_ends_at_sigterm_when_the_workload_obeys() -> None:
    async with faked() as (supervisor, launcher, recorder, clock):
        supervisor.submit(request("polite"))
        await launcher.until(lambda: "polite" in launcher.children)
        assert supervisor.stop("polite", "revoked") == 1
        assert supervisor.stop("polite", "revoked again") == 1  # a second stop sends nothing more
        await recorder.until(lambda: recorder.outcomes)
        assert clock.sleeping == 0  # the grace period's timer went with the exit
    assert launcher.children["polite"].signals == [signal.SIGTERM]
    outcome = recorder.outcome("polite")
    assert (outcome.returncode, outcome.reason) == (
        -signal.SIGTERM,
        "revoked: terminated (killed by SIGTERM)",
    )


async def test_a_workload_stopped_while_it_launches_is_terminated_once_it_exists() -> None:
    async with faked() as (supervisor, launcher, recorder, _):
        go = launcher.hold("k")
        supervisor.submit(request("k"))
        await launcher.until(lambda: launcher.requests != [])
        assert supervisor.stop("k", "revoked") == 1
        assert recorder.outcomes == []  # no final event before its process is known
        go.set()
        await recorder.until(lambda: recorder.outcomes)
    assert launcher.children["k"].signals == [signal.SIGTERM]
    assert recorder.outcome("k").kind is OutcomeKind.TERMINATED


async def test_a_stop_before_launch_drops_the_workload_and_unknown_keys_match_nothing() -> None:
    async with faked(limit=1) as (supervisor, launcher, recorder, _):
        supervisor.submit(request("first"))
        supervisor.submit(request("waiting"))
        await launcher.until(lambda: "first" in launcher.children)
        assert supervisor.stop("waiting", "revoked") == 1
        assert supervisor.stop("nobody", "revoked") == 0
        await recorder.until(lambda: recorder.outcomes)
        launcher.children["first"].exit(0)
        await recorder.until(lambda: len(recorder.outcomes) == 2)
    assert (recorder.outcome("waiting").kind, recorder.outcome("waiting").reason) == (
        OutcomeKind.NOT_STARTED,
        "revoked",
    )
    assert [r.key for r in launcher.requests] == ["first"]


async def test_shutdown_drops_waiting_workloads_and_terminates_running_ones() -> None:
    launcher = FakeLauncher()
    recorder = Recorder()
    supervisor = Supervisor(launcher, recorder, limit=1, clock=FakeClock())
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.serve)
        for key in ("a", "b", "c"):
            supervisor.submit(request(key))
        await launcher.until(lambda: "a" in launcher.children)
        with anyio.fail_after(GUARD):
            await supervisor.shutdown(wait=0)
        supervisor.submit(request("late"))
    kinds = {o.key: o.kind for o in recorder.outcomes}
    assert kinds == {
        "a": OutcomeKind.TERMINATED,
        "b": OutcomeKind.NOT_STARTED,
        "c": OutcomeKind.NOT_STARTED,
        "late": OutcomeKind.NOT_STARTED,
    }
    assert recorder.outcome("late").reason == "executor is shutting down"
    assert in_flight(supervisor) == 0
    assert launcher.exited


async def test_shutdown_waits_its_bound_on_the_clock_then_stops_what_still_runs() -> None:
    launcher = FakeLauncher()
    recorder = Recorder()
    clock = FakeClock()
    supervisor = Supervisor(launcher, recorder, limit=2, clock=clock)
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.serve)
        supervisor.submit(request("quick"))
        supervisor.submit(request("slow"))
        await launcher.until(lambda: len(launcher.children) == 2)
        tg.start_soon(supervisor.shutdown, 30.0)
        await clock.sleepers(1)  # the shutdown's wait has begun
        launcher.children["quick"].exit(0)
        await recorder.until(lambda: recorder.outcomes)
        clock.advance(29.9)
        assert launcher.children["slow"].signals == []  # still within the bound
        clock.advance(0.1)
        await recorder.until(lambda: len(recorder.outcomes) == 2)
    assert recorder.outcome("quick").ok
    slow = recorder.outcome("slow")
    assert (slow.kind, slow.reason) == (
        OutcomeKind.TERMINATED,
        "executor shut down: terminated (killed by SIGTERM)",
    )


async def test_a_workload_past_its_timeout_is_terminated_and_says_so() -> None:
    async with faked() as (supervisor, launcher, recorder, clock):
        supervisor.submit(request("slow", timeout=0.5))
        await launcher.until(lambda: "slow" in launcher.children)
        await clock.sleepers(1)  # its timer runs
        clock.advance(0.4)
        assert clock.sleeping == 1  # not due yet
        supervisor.submit(request("quick", timeout=30))
        await launcher.until(lambda: "quick" in launcher.children)
        launcher.children["quick"].exit(0)
        await recorder.until(lambda: recorder.outcomes)
        # The quick one's 30 s timer was cancelled when it exited: only the slow one's is left.
        await anyio.wait_all_tasks_blocked()
        assert clock.sleeping == 1
        clock.advance(0.1)
        await recorder.until(lambda: len(recorder.outcomes) == 2)
    slow = recorder.outcome("slow")
    assert (slow.kind, slow.reason) == (
        OutcomeKind.TERMINATED,
        "timed out after 0.5s: terminated (killed by SIGTERM)",
    )
    assert recorder.outcome("quick").ok


async def test_a_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeout must be > 0"):
        request("k", timeout=0)


async def test_times_are_read_from_the_injected_clock() -> None:
    free = {"bytes": 0}
    async with faked(memory_floor=100 * MB, available_memory=lambda: free["bytes"], memory_poll=5.0) as (
        supervisor,
        launcher,
        recorder,
        clock,
    ):
        accepted = clock.time()
        supervisor.submit(request("k"))
        await clock.sleepers(1)  # accepted now, held back by memory
        free["bytes"] = 200 * MB
        clock.advance(5.0)
        await launcher.until(lambda: "k" in launcher.children)
        clock.advance(2.0)
        launcher.children["k"].exit(0)
        await recorder.until(lambda: recorder.outcomes)
        clock.advance(1.0)
        launcher.refuse["missing"] = LaunchError("no such program")
        supervisor.submit(request("missing"))
        await recorder.until(lambda: len(recorder.outcomes) == 2)
        state = supervisor.state()
    assert recorder.outcome("k").times == Times(accepted, accepted + 5.0, accepted + 7.0)
    assert recorder.outcome("missing").times == Times(accepted + 8.0, None, accepted + 8.0)
    assert state.last_launched_at == accepted + 5.0
    [failure] = state.recent_failures
    assert (failure.at, failure.label) == (accepted + 8.0, "missing")


PRELOAD: PreloadSummary = {"mode": "explicit", "modules": ["json"]}


async def test_the_state_reports_the_launcher_and_each_workload() -> None:
    async with faked(limit=1) as (supervisor, launcher, _, clock):
        launcher.report_as = LauncherReport("fake: degraded", "its helper died", PRELOAD)
        supervisor.submit(request("running", label="running one", group="reports"))
        supervisor.submit(request("waiting"))
        await launcher.until(lambda: "running" in launcher.children)
        state = supervisor.state()
    [running] = state.running
    assert (running.label, running.pid, running.launched, running.group, running.cgroup) == (
        "running one",
        launcher.children["running"].pid,
        clock.time(),
        "reports",
        None,
    )
    assert (state.waiting, state.oldest_waiting_since) == (1, clock.time())
    assert (state.launcher_state, state.launcher_problem, state.preload) == (
        "fake: degraded",
        "its helper died",
        PRELOAD,
    )


async def test_what_a_contained_workload_left_is_in_its_outcome() -> None:
    async with faked() as (supervisor, launcher, recorder, _):
        supervisor.submit(request("k"))
        await launcher.until(lambda: "k" in launcher.children)
        child = launcher.children["k"]
        child.cleanup_after_exit = Cleanup(leftovers=2, killed=2, oom_kills=1, memory_limit=64 * MB)
        child.exit(-signal.SIGKILL)
        await recorder.until(lambda: recorder.outcomes)
    outcome = recorder.outcome("k")
    assert outcome.cleanup == child.cleanup_after_exit
    assert (
        outcome.reason
        == "killed by the kernel: memory limit 64 MiB exceeded (killed by SIGKILL); 2 leftover processes killed"
    )


class FailingOnStart(Recorder):
    """A listener that raises when told a workload started: a bug after the process exists."""

    def started(self, key: Any, pid: int) -> None:
        super().started(key, pid)
        raise RuntimeError("listener bug")


async def test_an_internal_error_after_launch_kills_the_process_awaits_it_and_reports_it_lost() -> None:
    launcher = FakeLauncher()
    recorder = FailingOnStart()
    async with serving(recorder, launcher, clock=FakeClock()) as supervisor:
        supervisor.submit(request("running"))
        await recorder.until(lambda: recorder.outcomes)
    child = launcher.children["running"]
    # Nothing reaps or reports it any more: it must not run on after its final event...
    assert child.signals == [signal.SIGKILL]
    # ...and it is awaited, so a real process would leave no zombie and no open pipe behind.
    assert child.waits == 1
    [outcome] = recorder.outcomes
    assert (outcome.kind, outcome.reason) == (
        OutcomeKind.LOST,
        "internal error: RuntimeError('listener bug')",
    )


async def test_a_killed_process_that_never_exits_is_given_up_on_the_clock(
    caplog: pytest.LogCaptureFixture,
) -> None:
    launcher = FakeLauncher(ignores=(signal.SIGTERM,))
    recorder = FailingOnStart()
    clock = FakeClock()
    supervisor = Supervisor(launcher, recorder, limit=None, clock=clock)
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.serve)
        launcher.stuck.add("stuck")
        supervisor.submit(request("stuck"))
        await recorder.until(lambda: recorder.outcomes)
        child = launcher.children["stuck"]
        tg.start_soon(supervisor.shutdown, 0.0)
        await clock.sleepers(1)  # awaiting the killed process, bounded on the clock
        assert in_flight(supervisor) == 1
        clock.advance(ABANDONED_REAP)
    assert in_flight(supervisor) == 0
    assert child.signals == [signal.SIGKILL]
    assert recorder.outcome("stuck").kind is OutcomeKind.LOST
    assert any("was not gone" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


class BrokenLauncher(FakeLauncher):
    """A launcher with a bug: it raises something other than LaunchError."""

    async def launch(self, request: LaunchRequest) -> NoReturn:
        raise RuntimeError("launcher bug")


async def test_an_internal_error_before_launch_reports_a_failed_launch() -> None:
    recorder = Recorder()
    async with serving(recorder, BrokenLauncher(), clock=FakeClock()) as supervisor:
        supervisor.submit(request("k"))
        await recorder.until(lambda: recorder.outcomes)
        state = supervisor.state()
    [outcome] = recorder.outcomes
    assert (outcome.kind, outcome.reason) == (
        OutcomeKind.LAUNCH_FAILED,
        "internal error: RuntimeError('launcher bug')",
    )
    assert [f.reason for f in state.recent_failures] == [outcome.reason]
    assert state.outcomes_total == {"launch_failed": 1}


# With real processes on both launch paths: what a real process does is the point of each.


async def test_stdin_reaches_the_child_and_never_argv(kind: str) -> None:
    # Real: the payload travels through a real pipe (or the fork server's socket), never argv.
    secret = b"token-that-must-not-be-in-argv"
    recorder = await run_one(kind, py("import sys; print(sys.stdin.read())"), stdin=secret)
    assert ("k", secret.decode()) in recorder.lines


async def test_a_full_file_table_fails_launches_clearly_and_they_work_again_once_it_is_lifted(
    kind: str,
) -> None:
    # Real: the launch paths meet a real file table full (EMFILE) and recover once it is not.
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
    # Real: the process group and session are the kernel's.
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


async def test_thousands_finishing_at_once_lose_no_result(tmp_path: Path, kind: str) -> None:
    # Real: what is tested is each launch path's exit detection (the event loop's child watcher, the
    # fork server's pidfds) when the kernel reports thousands of exits at the same moment.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    n = min(storm_size(kind), (hard - 200) // 4)
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


def storm_size(kind: str) -> int:
    """Full size once per launch path, 400 on the other loop: what the suite's time allows.

    400 children (about 1,600 descriptors) still put descriptors past select()'s 1,024 and exit
    together. Both paths spawn and reap the same way on either loop (``Popen`` or the fork server, and
    a pidfd), so the loop no longer decides how fast children launch; each path keeps the loop it had.
    """
    on_uvloop = isinstance(asyncio.get_running_loop(), uvloop.Loop)
    return 1500 if on_uvloop == (kind == "forkserver") else 400


def gate_waiter(kind: str, gate: Path) -> list[str]:
    # A tiny exec for the plain path; in a fork-server child the same wait costs no interpreter start.
    if kind == "forkserver":
        return py(f"import fcntl; fcntl.flock(open({str(gate)!r}), fcntl.LOCK_SH)")
    return ["flock", "-s", str(gate), "true"]


async def test_terminate_kills_the_whole_process_group(tmp_path: Path, kind: str) -> None:
    # Real: the signal must reach a real grandchild through the process group.
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


async def test_output_is_drained_while_the_child_runs(kind: str) -> None:
    # Real: a real pipe, whose 64 KiB buffer blocks a writer nobody reads.
    # 4 MiB through a 64 KiB pipe: the child would block forever if nobody read.
    recorder = await run_one(kind, py("import sys; sys.stdout.write(('x' * 1023 + '\\n') * 4096)"))
    assert recorder.outcome("k").ok
    assert [key for key, line in recorder.lines if line and key != "k"] == []
    assert sum(1 for key, line in recorder.lines if line) == 4096


async def test_stopping_a_workload_reaches_groups_its_descendants_made(kind: str) -> None:
    # Real: a descendant in a process group of its own is found in the real process tree.
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
    # Real: a real descendant holding a real pipe open.
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
    # Real: EOF on the output comes before the exit, which only a real process can do.
    code = "import os, time\nprint('bye', flush=True)\nos.close(1)\nos.close(2)\ntime.sleep(0.3)\nraise SystemExit(5)\n"
    recorder = Recorder()
    async with serving(recorder, kind) as supervisor:
        supervisor.submit(LaunchRequest("k", py(code)))
        await recorder.until(lambda: len(recorder.outcomes) == 1)
    outcome = recorder.outcome("k")
    assert (outcome.kind, outcome.returncode) == (OutcomeKind.EXITED, 5)
    assert ("k", "bye") in recorder.lines


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


async def test_an_internal_error_after_launch_still_awaits_the_process_and_closes_its_pipes(
    kind: str,
) -> None:
    # Real: what is checked is the process table and this process's open fds.
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
    # Real: the sink runs inside each launch path's reading of a real output pipe.
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


# Handing running workloads over at a stop, and adopting them in a successor (fake launcher).


async def test_release_hands_running_workloads_over_alive_with_no_event_and_drops_the_rest() -> None:
    launcher = FakeLauncher()
    recorder = Recorder()
    clock = FakeClock()
    supervisor = Supervisor(launcher, recorder, limit=2, clock=clock)
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.serve)
        supervisor.submit(request("a", timeout=100))
        supervisor.submit(request("b"))
        supervisor.submit(request("waiting"))
        await launcher.until(lambda: len(launcher.children) == 2)
        clock.advance(40)
        with anyio.fail_after(GUARD):
            handovers = await supervisor.release(grace=0)
        supervisor.submit(request("late"))
    by_key = {h.key: h for h in handovers}
    assert set(by_key) == {"a", "b"}
    assert by_key["a"].pid == launcher.children["a"].pid
    for key in ("a", "b"):
        child = launcher.children[key]
        assert child.released
        assert child.running
        assert child.signals == []
    assert {o.key: o.kind for o in recorder.outcomes} == {
        "waiting": OutcomeKind.NOT_STARTED,
        "late": OutcomeKind.NOT_STARTED,
    }
    assert in_flight(supervisor) == 0


async def test_release_stops_what_it_may_not_hand_over_and_what_is_being_stopped() -> None:
    launcher = FakeLauncher()
    recorder = Recorder()
    supervisor = Supervisor(launcher, recorder, limit=None, clock=FakeClock())
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.serve)
        for key in ("task", "callback", "fixed", "revoked"):
            supervisor.submit(request(key))
        await launcher.until(lambda: len(launcher.children) == 4)
        launcher.children["fixed"].releasable = False
        supervisor.stop("revoked", "revoked by the scheduler")
        with anyio.fail_after(GUARD):
            handovers = await supervisor.release(grace=0, which=lambda key: key != "callback")
    assert [(h.key, h.kill_in) for h in handovers] == [("task", None)]
    kinds = {o.key: o.kind for o in recorder.outcomes}
    assert kinds == {
        "callback": OutcomeKind.TERMINATED,
        "fixed": OutcomeKind.TERMINATED,
        "revoked": OutcomeKind.TERMINATED,
    }
    assert launcher.children["task"].signals == []


async def test_a_workload_being_stopped_for_its_timeout_when_release_begins_is_handed_over() -> None:
    # Its end would be an event nobody reads (a scheduler reads none once it stops): its adopter, which
    # finds its limit gone, stops it and reports that end instead. Revoked ones are still stopped here.
    launcher = FakeLauncher(ignores=(signal.SIGTERM,))
    recorder = Recorder()
    clock = FakeClock()
    supervisor = Supervisor(launcher, recorder, limit=None, clock=clock, policy=TerminationPolicy(grace=30))
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.serve)
        supervisor.submit(request("timed", timeout=10))
        supervisor.submit(request("revoked"))
        await launcher.until(lambda: len(launcher.children) == 2)
        await anyio.wait_all_tasks_blocked()  # its deadline's timer asleep on the clock
        clock.advance(11)
        await launcher.until(lambda: launcher.children["timed"].signals == [signal.SIGTERM])
        supervisor.stop("revoked", "revoked by the scheduler")
        await launcher.until(lambda: launcher.children["revoked"].signals == [signal.SIGTERM])

        async def release() -> None:
            handovers.extend(await supervisor.release(grace=0))

        handovers: list[LetGo] = []
        tg.start_soon(release)
        await anyio.wait_all_tasks_blocked()
        clock.advance(30)  # the grace: what is still being stopped here gets SIGKILL
    assert [(h.key, h.kill_in) for h in handovers] == [("timed", 30.0)]  # its SIGKILL due 30 s on
    timed = launcher.children["timed"]
    assert timed.released
    assert timed.running
    assert timed.signals == [signal.SIGTERM]  # no SIGKILL after it was let go
    assert launcher.children["revoked"].signals == [signal.SIGTERM, signal.SIGKILL]
    assert {o.key: o.kind for o in recorder.outcomes} == {"revoked": OutcomeKind.TERMINATED}


async def test_a_workload_still_launching_when_release_begins_is_handed_over_once_it_runs() -> None:
    launcher = FakeLauncher()
    recorder = Recorder()
    supervisor = Supervisor(TakesOver(launcher), recorder, limit=None, clock=FakeClock())
    go = launcher.hold("slow-start")
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.serve)
        supervisor.submit(request("slow-start"))
        await launcher.until(lambda: bool(launcher.requests))
        result: list[Any] = []

        async def release() -> None:
            result.extend(await supervisor.release(grace=GUARD))

        tg.start_soon(release)
        await anyio.wait_all_tasks_blocked()
        go.set()
    assert [h.key for h in result] == ["slow-start"]
    assert launcher.children["slow-start"].released
    assert recorder.outcomes == []


async def test_an_adopted_workload_holds_a_slot_times_out_and_reports_its_end_once() -> None:
    adopted_launcher = FakeLauncher()  # stands for the processes a predecessor launched
    async with faked(limit=1) as (supervisor, launcher, recorder, clock):
        predecessor = await adopted_launcher.launch(request("adopted"))
        supervisor.adopt(taking_over(request("adopted", timeout=5), lambda: predecessor, 12.5, None))
        supervisor.submit(request("new"))
        await recorder.until(lambda: recorder.pids)
        await anyio.wait_all_tasks_blocked()
        assert launcher.requests == []  # the adopted one holds the only slot
        state = supervisor.state()
        assert [(w.pid, w.launched) for w in state.running] == [(predecessor.pid, 12.5)]
        clock.advance(5)
        await recorder.until(lambda: recorder.outcomes)
        assert predecessor.signals == [signal.SIGTERM]
        await launcher.until(lambda: "new" in launcher.children)
        launcher.children["new"].exit(0)
        await recorder.until(lambda: len(recorder.outcomes) == 2)
    adopted = recorder.outcome("adopted")
    assert (adopted.kind, adopted.reason) == (
        OutcomeKind.TERMINATED,
        "timed out after 5s: terminated (killed by SIGTERM)",
    )
    assert list(recorder.pids) == ["adopted", "new"]


async def test_an_adopted_workload_let_go_during_its_limit_s_grace_gets_only_what_was_left_of_it() -> None:
    # Its predecessor's stop for its limit had its SIGKILL due 7 s from now when it let it go, and the
    # SIGTERM was ignored: the SIGKILL comes then, not a whole grace period after the adoption.
    adopted_launcher = FakeLauncher(ignores=(signal.SIGTERM,))
    async with faked(grace=10.0, ignores=(signal.SIGTERM,)) as (supervisor, _, recorder, clock):
        predecessor = await adopted_launcher.launch(request("spent"))
        took = _kill_in(taking_over(request("spent"), lambda: predecessor, 1.0, None), 7.0)
        supervisor.adopt(dataclasses.replace(took, timeout=-3.0))
        await adopted_launcher.until(lambda: predecessor.signals == [signal.SIGTERM])
        await clock.sleepers(1)  # what is left of the grace period
        clock.advance(6.9)
        await anyio.wait_all_tasks_blocked()
        assert clock.sleeping == 1  # not over yet: none would have woken at once
        assert predecessor.signals == [signal.SIGTERM]
        clock.advance(0.1)
        await recorder.until(lambda: recorder.outcomes)
    assert predecessor.signals == [signal.SIGTERM, signal.SIGKILL]
    outcome = recorder.outcome("spent")
    assert (outcome.kind, outcome.reason) == (
        OutcomeKind.TERMINATED,
        "timed out 3.0s before its adoption: terminated (killed by SIGKILL)",
    )


async def test_an_adopted_workload_whose_sigkill_was_due_already_is_killed_at_once() -> None:
    adopted_launcher = FakeLauncher(ignores=(signal.SIGTERM,))
    async with faked(grace=5.0, ignores=(signal.SIGTERM,)) as (supervisor, _, recorder, _clock):
        predecessor = await adopted_launcher.launch(request("long-gone"))
        took = _kill_in(taking_over(request("long-gone"), lambda: predecessor, 1.0, None), -7.0)
        supervisor.adopt(dataclasses.replace(took, timeout=-12.0))
        await recorder.until(lambda: recorder.outcomes)  # the clock never moved
    assert predecessor.signals == [signal.SIGTERM, signal.SIGKILL]
    assert recorder.outcome("long-gone").reason == (
        "timed out 12.0s before its adoption: terminated (killed by SIGKILL)"
    )


async def test_an_adopted_workload_whose_limit_ran_out_with_no_stop_under_way_gets_a_whole_grace() -> None:
    # Its limit ran out while no scheduler ran, so nobody signalled it yet: it gets SIGTERM now and the
    # whole grace period for its on_kill, as at any stop (its custody countdown bounded the time before).
    adopted_launcher = FakeLauncher(ignores=(signal.SIGTERM,))
    async with faked(grace=10.0, ignores=(signal.SIGTERM,)) as (supervisor, _, recorder, clock):
        predecessor = await adopted_launcher.launch(request("unsignalled"))
        took = taking_over(request("unsignalled"), lambda: predecessor, 1.0, None)
        supervisor.adopt(dataclasses.replace(took, timeout=-30.0))
        await adopted_launcher.until(lambda: predecessor.signals == [signal.SIGTERM])
        await clock.sleepers(1)
        clock.advance(9.9)
        await anyio.wait_all_tasks_blocked()
        assert clock.sleeping == 1  # a shortened grace would have woken by now
        assert predecessor.signals == [signal.SIGTERM]
        clock.advance(0.1)
        await recorder.until(lambda: recorder.outcomes)
    assert predecessor.signals == [signal.SIGTERM, signal.SIGKILL]
    assert recorder.outcome("unsignalled").reason == (
        "timed out 30.0s before its adoption: terminated (killed by SIGKILL)"
    )


@pytest.mark.parametrize("adopted", [False, True], ids=["launched here", "adopted with a whole grace"])
async def test_a_workload_let_go_during_its_limit_s_grace_says_how_much_of_it_was_left(adopted: bool) -> None:
    # Its own limit's stop, or one an adoption began with a whole grace period: a stop 4 s into a 10 s
    # grace passes on the 6 s left, never a whole grace again, nor the limit's end as if its SIGTERM
    # had gone out then.
    launcher = FakeLauncher(ignores=(signal.SIGTERM,))
    recorder = Recorder()
    clock = FakeClock()
    policy = TerminationPolicy(grace=10.0)
    supervisor = Supervisor(TakesOver(launcher), recorder, limit=None, clock=clock, policy=policy)
    predecessors = FakeLauncher(ignores=(signal.SIGTERM,))  # stands for the processes another launched
    running = await predecessors.launch(request("limited"))
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.serve)
        if adopted:
            took = taking_over(request("limited"), lambda: running, 1.0, None)
            supervisor.adopt(dataclasses.replace(took, timeout=-30.0))
            await predecessors.until(lambda: running.signals == [signal.SIGTERM])
        else:
            supervisor.submit(request("limited", timeout=5))
            await launcher.until(lambda: "limited" in launcher.children)
            await clock.sleepers(1)
            clock.advance(5)
            await launcher.until(lambda: launcher.children["limited"].signals == [signal.SIGTERM])
        await clock.sleepers(1)  # the grace period runs
        clock.advance(4)
        await anyio.wait_all_tasks_blocked()
        with anyio.fail_after(GUARD):
            handovers = await supervisor.release(grace=0)
    assert [(h.key, h.kill_in) for h in handovers] == [("limited", 6.0)]


def _kill_in(request: LaunchRequest, seconds: float) -> LaunchRequest:
    """A takeover whose predecessor let it go while stopping it for its limit, its SIGKILL due then."""
    assert request.takeover is not None
    return dataclasses.replace(request, takeover=dataclasses.replace(request.takeover, kill_in=seconds))


async def test_a_spent_limit_is_only_for_a_takeover_and_must_be_a_number() -> None:
    took = taking_over(request("k"), lambda: None, 1.0, None)  # type: ignore[arg-type,return-value]
    assert dataclasses.replace(took, timeout=-1.0).timeout == -1.0
    for bad in (float("nan"), float("-inf")):
        with pytest.raises(ValueError, match="timeout must be > 0"):
            dataclasses.replace(took, timeout=bad)
    with pytest.raises(ValueError, match="timeout must be > 0"):
        request("k", timeout=-1.0)


async def test_an_adopted_process_that_is_gone_ends_as_a_failed_launch() -> None:
    def gone() -> Any:
        raise LaunchError("process 42 no longer runs as the workload that was handed over")

    async with faked() as (supervisor, _, recorder, _clock):
        supervisor.adopt(taking_over(request("vanished"), gone, 1.0, None))
        await recorder.until(lambda: recorder.outcomes)
    outcome = recorder.outcome("vanished")
    assert outcome.kind is OutcomeKind.LAUNCH_FAILED
    assert "no longer runs" in outcome.reason


async def test_an_adopted_workload_is_handed_over_again_with_its_cgroup_at_the_next_stop() -> None:
    adopted_launcher = FakeLauncher()
    launcher = FakeLauncher()
    recorder = Recorder()
    supervisor = Supervisor(TakesOver(launcher), recorder, limit=None, clock=FakeClock())
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.serve)
        child = await adopted_launcher.launch(request("again"))
        supervisor.adopt(taking_over(request("again"), lambda: child, 3.0, "/cg/1-t2-ab/w1"))
        await recorder.until(lambda: recorder.pids)
        with anyio.fail_after(GUARD):
            handovers = await supervisor.release(grace=0)
    assert [(h.key, h.cgroup, h.launched) for h in handovers] == [("again", "/cg/1-t2-ab/w1", 3.0)]
    assert child.released
    assert recorder.outcomes == []


async def test_adopted_workloads_beyond_the_limit_run_at_once_and_new_launches_wait_until_enough_ended() -> (
    None
):
    # A successor with a lower limit than its predecessor's: two running processes, one slot.
    adopted_launcher = FakeLauncher()
    async with faked(limit=1) as (supervisor, launcher, recorder, _clock):
        first = await adopted_launcher.launch(request("first"))
        second = await adopted_launcher.launch(request("second"))
        supervisor.adopt(taking_over(request("first"), lambda: first, 1.0, None))
        supervisor.adopt(taking_over(request("second"), lambda: second, 2.0, None))
        supervisor.submit(request("new"))
        await recorder.until(lambda: len(recorder.pids) == 2)
        assert sorted(w.pid for w in supervisor.state().running) == sorted([first.pid, second.pid])
        first.exit(0)
        await recorder.until(lambda: len(recorder.outcomes) == 1)
        await anyio.wait_all_tasks_blocked()
        assert launcher.requests == []  # one adopted workload still runs: the count is at the limit
        second.exit(0)
        await launcher.until(lambda: "new" in launcher.children)
        launcher.children["new"].exit(0)
        await recorder.until(lambda: len(recorder.outcomes) == 3)
    assert [o.key for o in recorder.outcomes] == ["first", "second", "new"]
    assert all(o.ok for o in recorder.outcomes)


async def test_an_adopted_workload_stopped_before_its_supervision_began_has_its_process_stopped() -> None:
    # Revoked in the same loop turn as its adoption: its process runs, so it is stopped, not dropped.
    adopted_launcher = FakeLauncher()
    async with faked() as (supervisor, _, recorder, _clock):
        child = await adopted_launcher.launch(request("revoked"))
        supervisor.adopt(taking_over(request("revoked"), lambda: child, 1.0, None))
        assert supervisor.stop("revoked", "revoked by the scheduler") == 1
        await recorder.until(lambda: recorder.outcomes)
    assert child.signals == [signal.SIGTERM]
    outcome = recorder.outcome("revoked")
    assert (outcome.kind, outcome.reason) == (
        OutcomeKind.TERMINATED,
        "revoked by the scheduler: terminated (killed by SIGTERM)",
    )
    assert list(recorder.pids) == ["revoked"]


async def test_an_adopted_workload_not_yet_taken_when_release_begins_is_handed_over_again() -> None:
    adopted_launcher = FakeLauncher()
    recorder = Recorder()
    supervisor = Supervisor(TakesOver(FakeLauncher()), recorder, limit=1, clock=FakeClock())
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.serve)
        child = await adopted_launcher.launch(request("again"))
        supervisor.adopt(taking_over(request("again"), lambda: child, 3.0, None))
        with anyio.fail_after(GUARD):
            handovers = await supervisor.release(grace=0)
    assert [(h.key, h.pid) for h in handovers] == [("again", child.pid)]
    assert child.released
    assert child.signals == []
    assert recorder.outcomes == []


async def test_an_adopted_workload_offered_after_a_shutdown_began_is_stopped_not_dropped() -> None:
    adopted_launcher = FakeLauncher()
    recorder = Recorder()
    launcher = FakeLauncher()
    supervisor = Supervisor(TakesOver(launcher), recorder, limit=None, clock=FakeClock())
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.serve)
        supervisor.submit(request("running"))
        await launcher.until(lambda: "running" in launcher.children)
        tg.start_soon(supervisor.shutdown, GUARD)
        await anyio.wait_all_tasks_blocked()
        child = await adopted_launcher.launch(request("late"))
        supervisor.adopt(taking_over(request("late"), lambda: child, 3.0, None))
        await recorder.until(lambda: recorder.outcomes)
        launcher.children["running"].exit(0)
    assert child.signals == [signal.SIGTERM]
    assert recorder.outcome("late").kind is OutcomeKind.TERMINATED
    assert recorder.outcome("running").ok
