"""Health verdicts from live signals, and the status file (the probe on a fake clock: test_health_probe)."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
import time
from pathlib import Path

import anyio
import psutil
import pytest

from async_local_executor.core.admission import MB
from async_local_executor.core.health import (
    PUBLIC_REASONS,
    WITHHELD,
    Health,
    Report,
    Thresholds,
    Verdict,
    assess,
)
from async_local_executor.core.launchers.base import LaunchRequest
from async_local_executor.core.launchers.subprocess import SubprocessLauncher
from async_local_executor.core.state import LaunchFailure, SupervisorState
from async_local_executor.core.supervisor import Supervisor
from async_local_executor.ops.status import StatusWriter, read_all, status_path, tree_rss
from tests.core.helpers import GUARD, Recorder, py
from tests.states import meta, quiet

pytestmark = pytest.mark.asyncio

NOW = 1_000_000.0


def verdict(state: SupervisorState, lag: float = 0.0) -> Health:
    return assess(state, lag, Thresholds(), NOW)


async def test_a_quiet_supervisor_is_healthy() -> None:
    assert verdict(quiet()) == Health(Verdict.HEALTHY)


@pytest.mark.parametrize(
    ("state", "lag", "reason"),
    [
        (quiet(), 2.5, "event loop lagging 2.5s"),
        (
            quiet(launcher_problem="fork server (pid 7) is not running"),
            0.0,
            "fork server (pid 7) is not running",
        ),
        (
            quiet(
                recent_failures=tuple(
                    LaunchFailure(NOW - i, f"t{i}", "Too many open files") for i in range(3)
                )
            ),
            0.0,
            "3 launch failures in the last 300s (last: t2: Too many open files)",
        ),
        (
            quiet(memory_low=True, waiting=2, available_memory=100 * MB),
            0.0,
            "memory guard holding 2 workload(s): 100 MB available, floor 256 MB",
        ),
        (
            quiet(waiting=4, oldest_waiting_since=NOW - 900),
            0.0,
            "4 workload(s) waiting to launch, the oldest for 900s",
        ),
    ],
)
async def test_each_cause_makes_it_unhealthy_and_says_why(
    state: SupervisorState, lag: float, reason: str
) -> None:
    health = verdict(state, lag)
    assert health.verdict is Verdict.UNHEALTHY
    assert health.reason is not None
    assert reason in health.reason


async def test_old_or_few_launch_failures_and_short_waits_are_not_a_problem() -> None:
    old = tuple(LaunchFailure(NOW - 1000, "t", "x") for _ in range(5))
    few = tuple(LaunchFailure(NOW, "t", "x") for _ in range(2))
    assert verdict(quiet(recent_failures=old)).verdict is Verdict.HEALTHY
    assert verdict(quiet(recent_failures=few)).verdict is Verdict.HEALTHY
    assert verdict(quiet(waiting=9, oldest_waiting_since=NOW - 60)).verdict is Verdict.HEALTHY


async def test_launch_failures_followed_by_a_launch_that_worked_are_not_a_problem() -> None:
    failures = tuple(LaunchFailure(NOW - 10 + i, f"t{i}", "Too many open files") for i in range(4))
    assert verdict(quiet(recent_failures=failures, last_launched_at=NOW - 5)).verdict is Verdict.HEALTHY
    # Three of them after the last launch: still failing.
    health = verdict(quiet(recent_failures=failures, last_launched_at=NOW - 9.5))
    assert health.reason is not None
    assert "3 launch failures in the last 300s (last: t3: Too many open files)" in health.reason


async def test_several_causes_are_all_given_as_reasons() -> None:
    health = verdict(quiet(launcher_problem="fork server gone", memory_low=True, waiting=1), lag=2.0)
    assert health.verdict is Verdict.UNHEALTHY
    assert len(health.reasons) == 3
    assert health.reason == "; ".join(health.reasons)
    assert health.as_dict() == {
        "status": "unhealthy",
        "reason": health.reason,
        "reasons": list(health.reasons),
        "public_reasons": [
            "the executor's event loop is lagging",
            "the launch path is degraded",
            "the memory guard is holding workloads until memory frees up",
        ],
        "public_codes": ["loop_lagging", "launcher_degraded", "memory_low"],
    }


async def test_public_reasons_name_no_task_and_no_pid() -> None:
    failures = tuple(LaunchFailure(NOW - 3 + i, f"dag.secret_task try {i}", "boom") for i in range(3))
    problem = "fork server (pid 4242) is not running; a new one is starting"
    health = verdict(quiet(launcher_problem=problem, recent_failures=failures))
    assert health.reasons == (
        problem,
        "3 launch failures in the last 300s (last: dag.secret_task try 2: boom)",
    )
    assert health.public_codes == ("launcher_degraded", "launch_failures")
    assert health.public_reasons == ("the launch path is degraded", "launches keep failing")
    assert health.as_dict()["public_reasons"] == list(health.public_reasons)


@pytest.mark.parametrize(
    "problem",
    [
        (
            "fork server could not start (preloading secret_vendor_sdk.client failed: ImportError: "
            "libsecret.so.1: cannot open shared object file); workloads start fresh interpreters until it is back"
        ),
        (
            "fork server unavailable (pid 31337 exited with -9 reading /opt/secret/dags/etl.py); every workload "
            "starts a fresh interpreter"
        ),
    ],
)
async def test_a_launcher_problem_goes_public_as_a_fixed_code_and_fixed_words(problem: str) -> None:
    health = verdict(quiet(launcher_problem=problem))
    assert health.reasons == (problem,)  # in full for whoever may see the status
    public = json.dumps({k: v for k, v in health.as_dict().items() if k.startswith("public_")})
    for secret in ("secret", "31337", "ImportError", "/opt", "pid"):
        assert secret not in public
    assert health.public_codes == ("launcher_degraded",)
    assert health.public_reasons == (PUBLIC_REASONS["launcher_degraded"],)


async def test_reasons_without_codes_are_withheld_from_the_public() -> None:
    health = Health(Verdict.UNHEALTHY, ("event loop thread is dead: RuntimeError('in secret_module')",))
    assert health.public_codes == (WITHHELD,)
    assert health.public_reasons == ("the reasons are in the authenticated status",)
    unknown = Health(Verdict.UNHEALTHY, ("x",), codes=("a code of a newer version",))
    assert unknown.public_codes == (WITHHELD,)
    assert Health(Verdict.HEALTHY).as_dict()["public_codes"] == []


async def test_supervisor_state_and_status_file_show_running_waiting_and_failures(tmp_path: Path) -> None:
    recorder = Recorder()
    gate = tmp_path / "gate"
    gate.touch()
    hold = py(
        f"import os, time\nprint('holding', flush=True)\nwhile os.path.exists({str(gate)!r}): time.sleep(0.01)"
    )
    supervisor = Supervisor(SubprocessLauncher(output=recorder.output), recorder, limit=1)
    gone = subprocess.Popen(py("pass"))  # noqa: ASYNC220 - set-up before the loop work begins
    gone.wait()  # a pid no scheduler holds
    writer = StatusWriter(status_path(tmp_path, "abc"), meta("abc", pid=gone.pid, parallelism=1))
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.serve)
        supervisor.submit(LaunchRequest("bad", ["/nonexistent/python3"], label="bad try 1"))
        supervisor.submit(LaunchRequest("held", hold, label="held try 1", group="reports"))
        supervisor.submit(LaunchRequest("next", py("pass"), label="next try 1"))
        # Running its own code, not still being exec'd (whose resident set can round to 0 MB).
        await recorder.until(lambda: ("held", "holding") in recorder.lines)
        state = supervisor.state()
        [running] = state.running
        assert (running.label, running.pid, running.group) == ("held try 1", recorder.pids["held"], "reports")
        assert state.waiting == 1
        assert [f.label for f in state.recent_failures] == ["bad try 1"]
        assert state.launched_total == 1
        assert state.outcomes_total == {"launch_failed": 1}

        report = Report(time.monotonic(), 0.0, 0.0, Health(Verdict.HEALTHY), state)
        await anyio.to_thread.run_sync(writer.write, report)
        gate.unlink()
        first = json.loads(writer.path.read_text())
        await recorder.until(lambda: len(recorder.outcomes) == 3)
        after = supervisor.state()
        await anyio.to_thread.run_sync(writer.write, dataclasses.replace(report, state=after))
        await supervisor.shutdown(wait=GUARD)
    assert stat.S_IMODE(writer.path.stat().st_mode) == 0o600
    data = first
    [row] = data["running"]
    assert (row["key"], row["pid"], row["queue"]) == ("held try 1", recorder.pids["held"], "reports")
    assert row["memory_mb"] > 0
    assert data["waiting"] == 1
    assert data["health"] == {
        "status": "healthy",
        "reason": None,
        "reasons": [],
        "public_reasons": [],
        "public_codes": [],
    }
    assert data["recent_launch_failures"][0]["key"] == "bad try 1"
    assert data["launcher_state"] == "subprocess: every workload starts a fresh interpreter"
    [failed] = data["recent_finished"]
    assert (failed["key"], failed["outcome"], failed["ran_s"]) == ("bad try 1", "launch_failed", None)
    assert "nonexistent" in failed["reason"]
    # The latest first, each with how it ended and how long it ran; one history sample per write.
    data = json.loads(writer.path.read_text())
    finished = [(f["key"], f["outcome"], f["returncode"]) for f in data["recent_finished"]]
    assert sorted(finished[:2]) == [("held try 1", "ok", 0), ("next try 1", "ok", 0)]
    assert finished[2] == ("bad try 1", "launch_failed", None)
    assert all(f["ran_s"] >= 0 for f in data["recent_finished"][:2])
    assert [sample[1:] for sample in data["history"]] == [[1, 1], [0, 0]]
    assert data["history"][0][0] <= data["history"][1][0] == round(data["written_at"], 1)
    # Its writer is gone: a reader calls it stale rather than trusting it.
    [found] = read_all(tmp_path)
    assert found.path == writer.path
    assert found.stale == f"scheduler pid {gone.pid} is not running"
    assert not found.healthy


async def test_a_killed_scheduler_not_yet_reaped_is_not_running(tmp_path: Path) -> None:
    zombie = subprocess.Popen(py("import time; time.sleep(60)"))  # noqa: ASYNC220 - a pid to leave unreaped
    try:
        zombie.kill()
        # Killed, not reaped: the pid still exists, as a zombie, until its parent waits for it.
        with anyio.fail_after(GUARD):
            await anyio.to_thread.run_sync(
                lambda: os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT), abandon_on_cancel=True
            )
        assert psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE
        writer = StatusWriter(status_path(tmp_path, "z"), meta("z", pid=zombie.pid, parallelism=1))
        writer.write(Report(time.monotonic(), 0.0, 0.0, Health(Verdict.HEALTHY), quiet()))
        [found] = read_all(tmp_path)
        assert found.gone
        assert found.stale == f"scheduler pid {zombie.pid} is not running"
    finally:
        zombie.wait()


# A parent whose child holds 64 MB resident; the parent prints both pids once the memory is touched.
HOLDER = """
import subprocess, sys
child = subprocess.Popen(
    [sys.executable, "-c", "import sys; b = bytearray(64 << 20); print('ok', flush=True); sys.stdin.read()"],
    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
)
child.stdout.readline()
print(child.pid, flush=True)
sys.stdin.read()
"""


async def test_tree_rss_counts_each_workload_with_its_descendants_in_one_pass() -> None:
    parents = [
        subprocess.Popen(py(HOLDER), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # noqa: ASYNC220
        for _ in range(2)
    ]
    try:
        with anyio.fail_after(GUARD):
            children = [int(await anyio.to_thread.run_sync(p.stdout.readline)) for p in parents]  # type: ignore[union-attr]
        gone = subprocess.Popen(py("pass"))  # noqa: ASYNC220
        gone.wait()
        memory = tree_rss([*(p.pid for p in parents), gone.pid])
        for parent, child in zip(parents, children, strict=True):
            total = memory[parent.pid]
            assert total is not None
            assert total >= 64 * MB + psutil.Process(parent.pid).memory_info().rss // 2
            assert psutil.Process(child).ppid() == parent.pid
        assert memory[gone.pid] is None
    finally:
        for parent in parents:
            parent.kill()
            parent.wait()
