"""The fork-server launch path with real forks, an injectable target and no Airflow."""

from __future__ import annotations

import ast
import logging
import os
import signal

import anyio
import psutil
import pytest

from async_local_executor.launchers.base import LaunchRequest
from async_local_executor.launchers.forkserver import ForkServerLauncher
from async_local_executor.launchers.subprocess import SubprocessLauncher
from async_local_executor.supervisor import OutcomeKind
from tests.core.helpers import GUARD, Recorder, py
from tests.core.test_supervisor import TARGET, serving, until_dead

pytestmark = pytest.mark.asyncio

SLEEPER = py("import os, time; print('ready', os.getpid(), flush=True); time.sleep(60)")


def fork_server(recorder: Recorder, **kwargs: object) -> ForkServerLauncher:
    options: dict[str, object] = {"target": TARGET, "output": recorder.output}
    options.update(kwargs)
    return ForkServerLauncher(**options)  # type: ignore[arg-type]


def ready_pids(recorder: Recorder) -> dict[object, int]:
    return {k: int(line.split()[1]) for k, line in recorder.lines if line.startswith("ready ")}


async def test_children_are_forked_by_one_helper() -> None:
    recorder = Recorder()
    launcher = fork_server(recorder)
    async with serving(recorder, launcher) as supervisor:
        for i in range(5):
            supervisor.submit(LaunchRequest(i, py("import os; print(os.getppid())")))
        await recorder.until(lambda: len(recorder.outcomes) == 5)
        helper = launcher.helper_pid
    assert all(o.ok for o in recorder.outcomes)
    assert {line for k, line in recorder.lines if k != "fork-server"} == {str(helper)}
    assert launcher.helpers_started == 1


async def test_helper_leads_its_own_group_in_our_session_and_ignores_ctrl_c() -> None:
    # A terminal's Ctrl-C goes to the foreground group (the scheduler's); the helper must neither be
    # in it nor die of SIGINT, and stays in our session so the kernel counts its CPU as ours.
    recorder = Recorder()
    launcher = fork_server(recorder)
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(LaunchRequest("k", SLEEPER))
        await recorder.until(lambda: "k" in ready_pids(recorder))
        helper = launcher.helper_pid
        assert helper is not None
        assert os.getpgid(helper) == helper != os.getpgid(0)
        assert os.getsid(helper) == os.getsid(0)
        assert psutil.Process(helper).status() != psutil.STATUS_ZOMBIE
        os.kill(helper, signal.SIGINT)
        supervisor.submit(LaunchRequest("after", py("print('ok')")))
        await recorder.until(lambda: any(o.key == "after" for o in recorder.outcomes))
        assert launcher.helper_pid == helper
        assert launcher.helpers_started == 1
        supervisor.stop("k", "test over")
        await recorder.until(lambda: len(recorder.outcomes) == 2)
    assert recorder.outcome("after").ok


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
        helper_pid = launcher.helper_pid
        assert helper_pid is not None
        for pid in (helper_pid, ready_pids(recorder)["k"]):
            assert secret not in " ".join(psutil.Process(pid).cmdline())
        supervisor.stop("k", "done")
        await recorder.until(lambda: recorder.outcomes)


async def test_preloads_happen_once_in_the_helper_and_a_bad_entry_is_skipped() -> None:
    recorder = Recorder()
    launcher = fork_server(recorder, preload=["decimal", "no_such_module_for_preload"])
    code = "import sys, tests.core.forkserver_targets as t; print(t.PRELOADED, 'decimal' in sys.modules)"
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


async def test_helper_killed_with_children_in_flight_loses_none_and_restarts() -> None:
    recorder = Recorder()
    launcher = fork_server(recorder)
    async with serving(recorder, launcher) as supervisor:
        for key in ("a", "b", "c"):
            supervisor.submit(LaunchRequest(key, SLEEPER))
        await recorder.until(lambda: len(ready_pids(recorder)) == 3)
        first_helper = launcher.helper_pid
        assert first_helper is not None
        os.kill(first_helper, signal.SIGKILL)
        await recorder.until(lambda: len(recorder.outcomes) == 3)
        for pid in ready_pids(recorder).values():
            await until_dead(pid)
        supervisor.submit(LaunchRequest("after", py("print('fine')")))
        await recorder.until(lambda: len(recorder.outcomes) == 4)
        assert launcher.helper_pid not in (None, first_helper)
    for key in ("a", "b", "c"):
        outcome = recorder.outcome(key)
        assert outcome.kind is OutcomeKind.LOST
        assert outcome.reason.startswith("fork server died")
    assert recorder.outcome("after").ok
    assert launcher.helpers_started == 2


async def _helper_replaced(launcher: ForkServerLauncher, dead: int) -> int:
    with anyio.fail_after(GUARD):
        # The launcher publishes no event for a new helper; the guard bounds a real failure.
        while launcher.helper_pid in (None, dead):  # noqa: ASYNC110
            await anyio.sleep(0.01)
    pid = launcher.helper_pid
    assert pid is not None
    return pid


async def test_an_idle_helper_that_dies_is_replaced_without_waiting_for_a_workload(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="async_local_executor.launchers.forkserver")
    recorder = Recorder()
    launcher = fork_server(recorder, restart_delay=0.2)
    async with serving(recorder, launcher) as supervisor:
        first = await _helper_replaced(launcher, -1)
        os.kill(first, signal.SIGKILL)
        await until_dead(first)
        with anyio.fail_after(GUARD):
            while launcher.problem is None:  # noqa: ASYNC110 - seen before the restart delay ends
                await anyio.sleep(0.01)
        assert launcher.problem == f"fork server (pid {first}) is not running; a new one is starting"
        second = await _helper_replaced(launcher, first)  # no workload asked for it
        assert launcher.problem is None
        os.kill(second, signal.SIGKILL)
        third = await _helper_replaced(launcher, second)
        supervisor.submit(LaunchRequest("after", py("import os; print(os.getppid())")))
        await recorder.until(lambda: recorder.outcomes)
    assert recorder.outcome("after").ok
    assert [line for k, line in recorder.lines if k == "after"] == [str(third)]
    assert launcher.helpers_started == 3
    # Helpers that die young are replaced less and less eagerly.
    delays = [r.getMessage() for r in caplog.records if r.getMessage().startswith("starting a new")]
    assert delays == ["starting a new fork server in 0.2s", "starting a new fork server in 0.4s"]


async def test_a_helper_that_stops_answering_is_replaced() -> None:
    recorder = Recorder()
    launcher = fork_server(recorder, ping_interval=0.05, ping_timeout=0.5)
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(LaunchRequest("stuck", SLEEPER))
        await recorder.until(lambda: "stuck" in ready_pids(recorder))
        first_helper = launcher.helper_pid
        assert first_helper is not None
        os.kill(first_helper, signal.SIGSTOP)
        await recorder.until(lambda: recorder.outcomes)
        supervisor.submit(LaunchRequest("next", py("pass")))
        await recorder.until(lambda: len(recorder.outcomes) == 2)
    assert recorder.outcome("stuck").kind is OutcomeKind.LOST
    assert recorder.outcome("next").ok
    await until_dead(first_helper)


async def test_a_helper_that_cannot_start_falls_back_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="async_local_executor.launchers.forkserver")
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


async def test_a_request_too_large_for_the_channel_uses_the_fallback() -> None:
    recorder = Recorder()
    launcher = fork_server(recorder, fallback=SubprocessLauncher(output=recorder.output))
    big = b"x" * (2 * 1024 * 1024)
    code = "import os, sys; print(len(sys.stdin.read()), os.getppid())"
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(LaunchRequest("big", py(code), stdin=big))
        await recorder.until(lambda: recorder.outcomes)
    assert recorder.outcome("big").ok
    [line] = [line for k, line in recorder.lines if k == "big"]
    assert line == f"{len(big)} {os.getpid()}"  # forked by us, not by the helper


async def test_with_an_idle_timeout_the_helper_starts_on_demand_and_leaves_when_idle() -> None:
    recorder = Recorder()
    launcher = fork_server(recorder, idle_timeout=0.2)
    async with serving(recorder, launcher) as supervisor:
        assert launcher.helper_pid is None  # nothing started before the first workload
        supervisor.submit(LaunchRequest("first", py("import os; print(os.getppid())")))
        await recorder.until(lambda: len(recorder.outcomes) == 1)
        [first_helper] = [int(line) for k, line in recorder.lines if k == "first"]
        await until_dead(first_helper)  # idle for 0.2 s: stopped
        assert launcher.helper_pid is None
        supervisor.submit(LaunchRequest("second", py("import os; print(os.getppid())")))
        await recorder.until(lambda: len(recorder.outcomes) == 2)
    assert recorder.outcome("first").ok
    assert recorder.outcome("second").ok
    [second_helper] = [int(line) for k, line in recorder.lines if k == "second"]
    assert second_helper != first_helper
    assert launcher.helpers_started == 2
