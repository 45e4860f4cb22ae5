"""The fork-server launch path with real forks, an injectable target and no Airflow."""

from __future__ import annotations

import ast
import contextlib
import logging
import os
import signal
import time

import anyio
import psutil
import pytest

from async_local_executor.core.launchers.base import LaunchRequest
from async_local_executor.core.launchers.forkserver.launcher import ForkServerLauncher
from async_local_executor.core.launchers.subprocess import SubprocessLauncher
from async_local_executor.core.outcome import OutcomeKind
from tests.core.helpers import GUARD, FakeClock, Recorder, is_dead, py, until_dead
from tests.core.supervising import fork_server, helper_replaced, serving

SLEEPER = py("import os, time; print('ready', os.getpid(), flush=True); time.sleep(60)")


def ready_pids(recorder: Recorder) -> dict[object, int]:
    return {k: int(line.split()[1]) for k, line in recorder.lines if line.startswith("ready ")}


@pytest.mark.asyncio
async def test_children_are_forked_by_one_helper_as_our_own_children() -> None:
    # CLONE_PARENT: the helper forks, but each child is ours, so the helper's fate is not theirs.
    recorder = Recorder()
    launcher = fork_server(recorder)
    code = "import os, tests.core.launchers.forkserver.targets as t; print(os.getppid(), t.PRELOADED)"
    async with serving(recorder, launcher) as supervisor:
        for i in range(5):
            supervisor.submit(LaunchRequest(i, py(code)))
        await recorder.until(lambda: len(recorder.outcomes) == 5)
    assert all(o.ok for o in recorder.outcomes)
    assert {line for k, line in recorder.lines if k != "fork-server"} == {f"{os.getpid()} True"}
    assert launcher.helpers_started == 1


@pytest.mark.asyncio
async def test_helper_leads_its_own_group_in_our_session_and_ignores_ctrl_c() -> None:
    # A terminal's Ctrl-C goes to the foreground group (the scheduler's); the helper must neither be
    # in it nor die of SIGINT, and stays in our session so the kernel counts its CPU as ours.
    recorder = Recorder()
    launcher = fork_server(recorder)
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(LaunchRequest("k", SLEEPER))
        await recorder.until(lambda: "k" in ready_pids(recorder))
        helper = launcher.report().pid
        assert helper is not None
        assert os.getpgid(helper) == helper != os.getpgid(0)
        assert os.getsid(helper) == os.getsid(0)
        assert psutil.Process(helper).status() != psutil.STATUS_ZOMBIE
        os.kill(helper, signal.SIGINT)
        supervisor.submit(LaunchRequest("after", py("print('ok')")))
        await recorder.until(lambda: any(o.key == "after" for o in recorder.outcomes))
        assert launcher.report().pid == helper
        assert launcher.helpers_started == 1
        supervisor.stop("k", "test over")
        await recorder.until(lambda: len(recorder.outcomes) == 2)
    assert recorder.outcome("after").ok


@pytest.mark.asyncio
async def test_child_gets_only_its_stdio_and_default_signal_handlers() -> None:
    code = (
        "import os, signal\n"
        "print(sorted(os.listdir('/proc/self/fd')))\n"
        "print([signal.getsignal(s) == signal.SIG_DFL for s in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP)])\n"
    )
    recorder = Recorder()
    async with serving(recorder, fork_server(recorder)) as supervisor:
        supervisor.submit(LaunchRequest("k", py(code)))
        await recorder.until(lambda: recorder.outcomes)
    lines = [line for k, line in recorder.lines if k == "k"]
    # fd 3 is the directory listdir itself opened
    assert ast.literal_eval(lines[0]) == ["0", "1", "2", "3"]
    assert lines[1] == "[True, True, True]"


@pytest.mark.asyncio
async def test_payload_never_appears_on_a_command_line() -> None:
    secret = "payload-token-0123456789"
    recorder = Recorder()
    launcher = fork_server(recorder)
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(
            LaunchRequest(
                "k",
                py(
                    "import sys, os; sys.stdin.read(); print('ready', os.getpid(), flush=True); import time; time.sleep(60)"
                ),
                stdin=secret.encode(),
            )
        )
        await recorder.until(lambda: "k" in ready_pids(recorder))
        helper_pid = launcher.report().pid
        assert helper_pid is not None
        for pid in (helper_pid, ready_pids(recorder)["k"]):
            assert secret not in " ".join(psutil.Process(pid).cmdline())
        supervisor.stop("k", "done")
        await recorder.until(lambda: recorder.outcomes)


@pytest.mark.asyncio
async def test_preloads_happen_once_in_the_helper_and_a_bad_entry_is_skipped() -> None:
    recorder = Recorder()
    launcher = fork_server(recorder, preload=["decimal", "no_such_module_for_preload"])
    code = "import sys, tests.core.launchers.forkserver.targets as t; print(t.PRELOADED, 'decimal' in sys.modules)"
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(LaunchRequest("k", py(code)))
        await recorder.until(lambda: recorder.outcomes)
    assert recorder.outcome("k").ok
    assert ("k", "True True") in recorder.lines
    assert any(
        "cannot preload 'no_such_module_for_preload'" in line
        for k, line in recorder.lines
        if k == "fork-server"
    )


@pytest.mark.asyncio
async def test_the_preload_of_the_module_the_target_names_runs_even_for_a_function_defined_elsewhere() -> (
    None
):
    # The workload entries are methods of a shared skeleton: the function's own module is not the one
    # named in the target, and it is the named one whose preload() imports what every child needs.
    recorder = Recorder()
    launcher = fork_server(recorder, target="tests.core.launchers.forkserver.reexport:run")
    code = "import tests.core.launchers.forkserver.targets as t; print(t.REEXPORT_PRELOADED)"
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(LaunchRequest("k", py(code)))
        await recorder.until(lambda: recorder.outcomes)
    assert recorder.outcome("k").ok
    assert ("k", "True") in recorder.lines


@pytest.mark.asyncio
async def test_helper_killed_with_sigkill_leaves_its_workloads_running_and_reported() -> None:
    recorder = Recorder()
    launcher = fork_server(recorder)
    # Each waits for SIGUSR1 from the test (blocked before it says ready), then exits with code 3.
    waiter = (
        "import os, signal, sys; signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1]); "
        "print('ready', os.getpid(), flush=True); signal.sigwait([signal.SIGUSR1]); sys.exit(3)"
    )
    async with serving(recorder, launcher) as supervisor:
        for key in ("a", "b", "c"):
            supervisor.submit(LaunchRequest(key, SLEEPER if key == "c" else py(waiter)))
        await recorder.until(lambda: len(ready_pids(recorder)) == 3)
        first_helper = launcher.report().pid
        assert first_helper is not None
        os.kill(first_helper, signal.SIGKILL)
        await until_dead(first_helper)
        # The helper's death is noticed and a new one takes the next launch ...
        supervisor.submit(LaunchRequest("after", py("print('fine')")))
        await recorder.until(lambda: any(o.key == "after" for o in recorder.outcomes))
        assert launcher.report().pid not in (None, first_helper)
        # ... while the three it forked still run, reported with their real statuses when they end.
        assert recorder.outcomes == [recorder.outcome("after")]
        pids = ready_pids(recorder)
        assert all(psutil.Process(pid).ppid() == os.getpid() for pid in pids.values())
        for key in ("a", "b"):
            os.kill(pids[key], signal.SIGUSR1)
        supervisor.stop("c", "test over")
        await recorder.until(lambda: len(recorder.outcomes) == 4)
    assert recorder.outcome("a").kind is OutcomeKind.EXITED
    assert recorder.outcome("a").returncode == 3
    assert recorder.outcome("b").returncode == 3
    assert recorder.outcome("c").kind is OutcomeKind.TERMINATED
    assert recorder.outcome("after").ok
    assert launcher.helpers_started == 2


@pytest.mark.asyncio
async def test_a_launch_right_after_the_helper_died_goes_to_a_new_helper() -> None:
    # The launch can reach the dead helper before the channel's reader has seen it close: the broken
    # channel itself must retire the helper, or the retry picks it again and the launch fails.
    recorder = Recorder()
    async with fork_server(recorder) as launcher:
        first = await helper_replaced(launcher, -1)
        os.kill(first, signal.SIGKILL)
        # Blocks the loop until the helper has exited (not reaping it): the reader cannot run meanwhile.
        with contextlib.suppress(ChildProcessError):  # reaped already by the loop's child watcher
            os.waitid(os.P_PID, first, os.WEXITED | os.WNOWAIT)  # noqa: ASYNC222
        child = await launcher.launch(LaunchRequest("k", py("print('fine')")))
        assert await child.wait() == 0
        assert launcher.report().pid not in (None, first)
    assert ("k", "fine") in recorder.lines
    assert launcher.helpers_started == 2


async def _waiting_to_restart(launcher: ForkServerLauncher, clock: FakeClock) -> None:
    """Until the launcher has seen its helper go and waits out the restart delay on ``clock``."""
    with anyio.fail_after(GUARD):
        # The launcher publishes no event for a dead helper; the guard bounds a real failure.
        while launcher.problem is None:  # noqa: ASYNC110
            await anyio.sleep(0.01)
    # The dead helper's watchdog left the clock before the helper counted as gone: this is the delay.
    await clock.sleepers(1)


@pytest.mark.asyncio
async def test_an_idle_helper_that_dies_is_replaced_without_waiting_for_a_workload(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="async_local_executor.core.launchers.forkserver")
    recorder = Recorder()
    clock = FakeClock()
    launcher = fork_server(recorder, restart_delay=0.5, clock=clock)
    async with serving(recorder, launcher) as supervisor:
        first = await helper_replaced(launcher, -1)
        os.kill(first, signal.SIGKILL)
        await until_dead(first)
        await _waiting_to_restart(launcher, clock)
        assert launcher.problem == f"fork server (pid {first}) is not running; a new one is starting"
        assert launcher.state == launcher.problem  # what the status report and the dashboard show
        clock.advance(0.5)
        second = await helper_replaced(launcher, first)  # no workload asked for it
        assert launcher.problem is None
        assert launcher.state == f"fork server running (pid {second}, 2 started so far)"
        os.kill(second, signal.SIGKILL)
        await _waiting_to_restart(launcher, clock)
        clock.advance(0.75)
        # The second died young, so its delay doubled: 0.75 s is not enough (other waits may be parked too).
        assert any(left == pytest.approx(0.25) for left in clock.remaining())
        clock.advance(0.25)
        third = await helper_replaced(launcher, second)
        supervisor.submit(
            LaunchRequest(
                "after", py("import tests.core.launchers.forkserver.targets as t; print(t.PRELOADED)")
            )
        )
        await recorder.until(lambda: recorder.outcomes)
        assert launcher.report().pid == third
    assert recorder.outcome("after").ok
    assert [line for k, line in recorder.lines if k == "after"] == ["True"]
    assert launcher.helpers_started == 3
    # Helpers that die young are replaced less and less eagerly.
    delays = [r.getMessage() for r in caplog.records if r.getMessage().startswith("starting a new")]
    assert delays == ["starting a new fork server in 0.5s", "starting a new fork server in 1.0s"]


async def until_stopped(pid: int) -> None:
    with anyio.fail_after(GUARD):
        # SIGSTOP takes effect when the process next runs; its state is the only sign.
        while psutil.Process(pid).status() != psutil.STATUS_STOPPED:  # noqa: ASYNC110
            await anyio.sleep(0.01)


@pytest.mark.asyncio
async def test_a_helper_that_stops_answering_is_replaced_and_its_workloads_keep_running() -> None:
    recorder = Recorder()
    clock = FakeClock()
    launcher = fork_server(recorder, ping_interval=1.0, ping_timeout=5.0, clock=clock)
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(LaunchRequest("stuck", SLEEPER))
        await recorder.until(lambda: "stuck" in ready_pids(recorder))
        first_helper = launcher.report().pid
        assert first_helper is not None
        os.kill(first_helper, signal.SIGSTOP)
        await until_stopped(first_helper)
        for _ in range(4):  # the watchdog's ticks; each is parked on the clock before it is let go
            await clock.sleepers(1)
            clock.advance(1.0)
        await clock.sleepers(1)
        assert launcher.report().pid == first_helper  # 4 s of silence: not yet the 5 s timeout
        clock.advance(1.0)
        await until_dead(first_helper)  # retired, then killed: it owns no workload
        supervisor.submit(LaunchRequest("next", py("pass")))
        await recorder.until(lambda: len(recorder.outcomes) == 1)
        assert not is_dead(ready_pids(recorder)["stuck"])
        supervisor.stop("stuck", "test over")
        await recorder.until(lambda: len(recorder.outcomes) == 2)
    assert recorder.outcome("stuck").kind is OutcomeKind.TERMINATED
    assert recorder.outcome("next").ok
    assert launcher.helpers_started == 2


@pytest.mark.asyncio
async def test_a_busy_helper_behind_a_lagging_loop_is_not_replaced() -> None:
    # The burst that once got a healthy helper killed: many children starting and exiting, each
    # flooding its output, while the loop thread itself is blocked for longer than the ping timeout.
    recorder = Recorder()
    launcher = fork_server(recorder, ping_interval=0.05, ping_timeout=0.5)
    flood = "for i in range(2000): print('line', i)"
    async with serving(recorder, launcher) as supervisor:
        first_helper = await helper_replaced(launcher, -1)
        for i in range(60):
            supervisor.submit(LaunchRequest(i, py(flood)))
            if i % 20 == 19:
                # The loop thread itself stalls (the behaviour under test), thrice the ping timeout.
                time.sleep(1.5)  # noqa: ASYNC251
        await recorder.until(lambda: len(recorder.outcomes) == 60)
        assert launcher.report().pid == first_helper
    assert all(o.ok for o in recorder.outcomes)
    assert sum(1 for k, line in recorder.lines if line == "line 1999") == 60
    assert launcher.helpers_started == 1


@pytest.mark.asyncio
async def test_a_helper_that_cannot_start_falls_back_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="async_local_executor.core.launchers.forkserver")
    recorder = Recorder()
    launcher = fork_server(
        recorder, target="no_such_module:run", fallback=SubprocessLauncher(output=recorder.output)
    )
    async with serving(recorder, launcher) as supervisor:
        for key in ("a", "b"):
            supervisor.submit(LaunchRequest(key, py("print('via fallback')")))
        await recorder.until(lambda: len(recorder.outcomes) == 2)
    assert all(o.ok for o in recorder.outcomes)
    assert [k for k, line in recorder.lines if line == "via fallback"] in (["a", "b"], ["b", "a"])
    warnings = [r for r in caplog.records if "fork server could not start" in r.getMessage()]
    assert len(warnings) == 1


@pytest.mark.asyncio
async def test_a_large_payload_reaches_the_forked_child_through_its_own_socket() -> None:
    # Far past the channel's message limit and the kernel's default socket buffers.
    recorder = Recorder()
    launcher = fork_server(recorder, fallback=SubprocessLauncher(output=recorder.output))
    big = b"x" * (8 * 1024 * 1024)
    code = (
        "import sys, tests.core.launchers.forkserver.targets as t; print(len(sys.stdin.read()), t.PRELOADED)"
    )
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(LaunchRequest("big", py(code), stdin=big))
        await recorder.until(lambda: recorder.outcomes)
    assert recorder.outcome("big").ok
    [line] = [line for k, line in recorder.lines if k == "big"]
    assert line == f"{len(big)} True"  # forked by the helper, not started afresh


@pytest.mark.asyncio
async def test_a_request_too_large_for_the_channel_uses_the_fallback() -> None:
    recorder = Recorder()
    launcher = fork_server(recorder, fallback=SubprocessLauncher(output=recorder.output))
    # Over the channel's 1 MiB in all, though each argument is within exec's own limit.
    args = ["a" * 100_000] * 12
    code = "import sys; print(len(sys.argv), 'tests.core.launchers.forkserver.targets' in sys.modules)"
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(LaunchRequest("big", [*py(code), *args]))
        await recorder.until(lambda: recorder.outcomes)
    assert recorder.outcome("big").ok
    [line] = [line for k, line in recorder.lines if k == "big"]
    assert line == "13 False"  # a fresh interpreter: the fallback


@pytest.mark.asyncio
async def test_with_an_idle_timeout_the_helper_starts_on_demand_and_leaves_when_idle(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="async_local_executor.core.launchers.forkserver")
    recorder = Recorder()
    clock = FakeClock()
    launcher = fork_server(recorder, idle_timeout=2.0, clock=clock)

    def helpers() -> list[int]:
        ready = (r.getMessage() for r in caplog.records)
        return [int(m.split("pid ")[1].rstrip(")")) for m in ready if m.startswith("fork server ready")]

    async with serving(recorder, launcher) as supervisor:
        assert launcher.report().pid is None  # nothing started before the first workload
        supervisor.submit(LaunchRequest("first", py("pass")))
        await recorder.until(lambda: len(recorder.outcomes) == 1)
        [first_helper] = helpers()
        # Parked on the clock: the idle check (every 0.5 s) and the helper's watchdog (every 5 s).
        await clock.sleepers(2)
        clock.advance(1.5)
        await clock.sleepers(2)  # the idle check ran and went back to sleep
        assert launcher.report().pid == first_helper  # idle for 1.5 s: kept
        clock.advance(0.5)
        await until_dead(first_helper)  # idle for 2 s: stopped
        assert launcher.report().pid is None
        supervisor.submit(LaunchRequest("second", py("pass")))
        await recorder.until(lambda: len(recorder.outcomes) == 2)
    assert recorder.outcome("first").ok
    assert recorder.outcome("second").ok
    assert len(set(helpers())) == 2
    assert launcher.helpers_started == 2


def test_target_must_name_a_function() -> None:
    with pytest.raises(ValueError, match="target must look like module:function"):
        ForkServerLauncher(target="tests.core.launchers.forkserver.targets")
