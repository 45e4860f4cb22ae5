"""Workloads in cgroups of their own, through both launch paths, with real cgroups and plain children.

Each test runs under a scratch cgroup root of its own (tests/core/cgroups/helpers.py), removed with
everything in it whatever the test did.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from async_local_executor.core.cgroups import Containment, Limits, WorkloadCgroup, cgroup_of, group
from async_local_executor.core.launchers.adopted import AdoptedChild
from async_local_executor.core.launchers.base import Launcher, LaunchRequest, TakesOver
from async_local_executor.core.launchers.contained import ContainedLauncher
from async_local_executor.core.launchers.forkserver.launcher import ForkServerLauncher
from async_local_executor.core.launchers.subprocess import SubprocessLauncher
from async_local_executor.core.outcome import OutcomeKind
from async_local_executor.core.proc_identity import start_ticks
from tests.core.cgroups import helpers as cgroup_helpers
from tests.core.cgroups.helpers import MiB, Scratch, gone
from tests.core.helpers import Recorder, alive, taking_over, until_dead
from tests.core.helpers import payload_py as py
from tests.core.launchers.releasing import HOLDER, finish, gate, release_once_up, said
from tests.core.supervising import TARGET, make_launcher, serving

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.skipif(bool(cgroup_helpers.unusable()), reason=cgroup_helpers.unusable()),
]

# Leaves a sleeper behind that no process group, session or environment marker ties to the workload:
# a new session, an empty environment, its parent exited (a double fork).
ESCAPER = """
import os, subprocess, sys
first = os.fork()
if first == 0:
    os.setsid()
    proc = subprocess.Popen(
        ["sleep", "600"], env={}, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    print("escaped", proc.pid, flush=True)
    os._exit(0)
os.waitpid(first, 0)
cgroup2 = [line for line in open("/proc/self/cgroup").read().splitlines() if line.startswith("0::")]
print("cgroup", cgroup2[0][3:], flush=True)
"""


def _said(recorder: Recorder, word: str) -> list[str]:
    return [line.split(" ", 1)[1] for _, line in recorder.lines if line.startswith(word + " ")]


async def test_nothing_a_workload_starts_outlives_it(box: Scratch, kind: str) -> None:
    recorder = Recorder()
    containment = box.open()
    launcher = ContainedLauncher(make_launcher(kind, recorder), containment)
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(LaunchRequest(key="w", argv=py(ESCAPER)))
        await recorder.until(lambda: recorder.outcomes)
    outcome = recorder.outcome("w")
    assert outcome.ok, outcome
    [escaped] = [int(pid) for pid in _said(recorder, "escaped")]
    assert gone(escaped)
    # It was inside before it ran a line of the workload, so its descendants were born there.
    [where] = _said(recorder, "cgroup")
    assert containment.path is not None
    assert where.startswith(f"/{box.root.strip('/')}/ale-{containment.instance}/w")
    assert outcome.cleanup is not None
    assert (outcome.cleanup.leftovers, outcome.cleanup.killed) == (1, 1)
    assert outcome.cleanup.cpu_seconds is not None
    assert outcome.cleanup.cpu_seconds > 0
    assert [path.name for path in containment.path.iterdir() if path.is_dir()] == []  # removed


async def test_leftovers_stay_when_asked_to(box: Scratch, kind: str) -> None:
    recorder = Recorder()
    containment = box.open()
    launcher = ContainedLauncher(make_launcher(kind, recorder), containment, kill_leftovers=False)
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(LaunchRequest(key="w", argv=py(ESCAPER)))
        await recorder.until(lambda: recorder.outcomes)
    outcome = recorder.outcome("w")
    [escaped] = [int(pid) for pid in _said(recorder, "escaped")]
    assert not gone(escaped)
    assert outcome.cleanup is not None
    assert (outcome.cleanup.leftovers, outcome.cleanup.killed) == (1, 0)
    assert str(cgroup_of(escaped)).endswith("/w1")  # still contained: the box's cleanup kills it there


async def test_a_stopped_workload_takes_its_escaped_processes_with_it(box: Scratch, kind: str) -> None:
    # Both ignore SIGTERM, so only the cgroup's SIGKILL after the grace period ends them; leftovers are
    # not killed at exit here, so the escaped one can only have gone with the stop.
    recorder = Recorder()
    stubborn = ESCAPER.replace('["sleep", "600"]', '["sh", "-c", "trap \'\' TERM; sleep 600"]')
    code = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + stubborn
    code += "import time\ntime.sleep(600)\n"
    launcher = ContainedLauncher(make_launcher(kind, recorder), box.open(), kill_leftovers=False)
    async with serving(recorder, launcher, grace=0.5) as supervisor:
        supervisor.submit(LaunchRequest(key="w", argv=py(code)))
        await recorder.until(lambda: _said(recorder, "cgroup"))
        assert supervisor.stop("w", "revoked") == 1
        await recorder.until(lambda: recorder.outcomes)
    outcome = recorder.outcome("w")
    assert outcome.kind is OutcomeKind.TERMINATED, outcome
    assert outcome.returncode == -signal.SIGKILL
    [escaped] = [int(pid) for pid in _said(recorder, "escaped")]
    # Killed with the rest of the cgroup, but leftovers are not waited for here: it may still be exiting.
    assert cgroup_helpers.wait_gone(escaped)


async def test_the_kernel_s_oom_kill_is_the_reason(box: Scratch, kind: str) -> None:
    containment = box.open()
    if "memory" not in containment.controllers:
        pytest.skip(f"no memory controller here ({containment.describe()})")
    recorder = Recorder()
    hog = "blocks = []\nwhile True:\n    blocks.append(bytearray(16 * 1024 * 1024))\n"
    launcher = ContainedLauncher(make_launcher(kind, recorder), containment)
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(LaunchRequest(key="hog", argv=py(hog), limits=Limits(memory=64 * MiB)))
        supervisor.submit(LaunchRequest(key="fine", argv=py("print('fine')")))
        await recorder.until(lambda: len(recorder.outcomes) == 2)
    outcome = recorder.outcome("hog")
    assert not outcome.ok
    assert outcome.reason.startswith("killed by the kernel: memory limit 64 MiB exceeded"), outcome
    assert outcome.cleanup is not None
    assert outcome.cleanup.oom_kills >= 1
    assert outcome.cleanup.memory_peak is not None
    assert outcome.cleanup.memory_peak <= 64 * MiB
    assert recorder.outcome("fine").ok


async def test_a_limit_its_controller_cannot_enforce_fails_that_launch_only(
    box: Scratch, kind: str, tmp_path: Path
) -> None:
    # Only the cgroup2 mount is listed: the cgroup v1 controllers of a hybrid host are out of sight.
    lines = Path("/proc/self/mountinfo").read_text().splitlines()  # noqa: ASYNC240 - a test's setup
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("\n".join(line for line in lines if " - cgroup2 " in line) + "\n")
    containment: Containment = box.open(mountinfo=str(mountinfo))
    if "pids" in containment.controllers:
        pytest.skip("cgroup2 gives the pids controller here")
    recorder = Recorder()
    launcher = ContainedLauncher(make_launcher(kind, recorder), containment)
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(LaunchRequest(key="limited", argv=py("print(1)"), limits=Limits(pids=10)))
        supervisor.submit(LaunchRequest(key="plain", argv=py("print(1)")))
        await recorder.until(lambda: len(recorder.outcomes) == 2)
    failed = recorder.outcome("limited")
    assert failed.kind is OutcomeKind.LAUNCH_FAILED
    assert "cannot apply its limits (pids 10): pids limit needs the pids controller" in failed.reason
    assert "limited" not in recorder.pids
    assert recorder.outcome("plain").ok


async def test_a_process_that_cannot_join_is_killed_before_it_runs(
    box: Scratch, kind: str, tmp_path: Path
) -> None:
    recorder = Recorder()
    containment = box.open()
    launcher = ContainedLauncher(make_launcher(kind, recorder), containment)
    marker = tmp_path / "ran"  # what the workload would create if it ran

    async def refuse(pid: int) -> None:
        refuse.pid = pid  # type: ignore[attr-defined]
        raise OSError("refused by the test")

    code = f"open({str(marker)!r}, 'w').close()"
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(LaunchRequest(key="w", argv=py(code), before_start=refuse))
        await recorder.until(lambda: recorder.outcomes)
    outcome = recorder.outcome("w")
    assert outcome.kind is OutcomeKind.LAUNCH_FAILED
    assert "cannot prepare the workload process: refused by the test" in outcome.reason
    assert gone(refuse.pid)  # type: ignore[attr-defined]
    assert not marker.exists()
    assert containment.path is not None
    assert [path for path in containment.path.iterdir() if path.is_dir()] == []


async def test_a_timed_out_workload_takes_its_escaped_processes_with_it(box: Scratch, kind: str) -> None:
    recorder = Recorder()
    launcher = ContainedLauncher(make_launcher(kind, recorder), box.open(), kill_leftovers=False)
    async with serving(recorder, launcher, grace=0.5) as supervisor:
        supervisor.submit(
            LaunchRequest(key="w", argv=py(ESCAPER + "import time\ntime.sleep(600)\n"), timeout=1.0)
        )
        await recorder.until(lambda: recorder.outcomes)
    outcome = recorder.outcome("w")
    assert outcome.kind is OutcomeKind.TERMINATED, outcome
    [escaped] = [int(pid) for pid in _said(recorder, "escaped")]
    # SIGTERM to every member of the cgroup, the escaped one in its own session included.
    assert cgroup_helpers.wait_gone(escaped)


async def test_the_fork_server_s_death_costs_a_contained_workload_nothing(
    box: Scratch, tmp_path: Path
) -> None:
    recorder = Recorder()
    forkserver = ForkServerLauncher(target=TARGET, output=recorder.output)
    launcher = ContainedLauncher(forkserver, box.open())
    done = tmp_path / "done"
    code = ESCAPER + f"import os, time\nwhile not os.path.exists({str(done)!r}):\n    time.sleep(0.01)\n"
    async with serving(recorder, launcher) as supervisor:
        supervisor.submit(LaunchRequest(key="w", argv=py(code)))
        await recorder.until(lambda: _said(recorder, "cgroup"))
        helper = forkserver.report().pid
        assert helper is not None
        os.kill(helper, signal.SIGKILL)
        await until_dead(helper)
        done.touch()
        await recorder.until(lambda: recorder.outcomes)
    outcome = recorder.outcome("w")
    assert outcome.ok, outcome  # it ran on, and its own exit status was reported
    [escaped] = [int(pid) for pid in _said(recorder, "escaped")]
    assert gone(escaped)  # what it left was killed when it ended
    assert outcome.cleanup is not None
    assert outcome.cleanup.killed == 1


async def test_without_cgroup_kill_no_kill_waits_on_the_loop(
    box: Scratch, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A kernel before 5.14: the file is hidden (the name the code looks for does not exist). Freezing
    # then waits for the freeze, up to a second per workload (members in D state): never on the loop.
    monkeypatch.setattr(group, "KILL_FILE", "cgroup.kill-absent")
    froze_on: list[int] = []
    freeze_and_kill = WorkloadCgroup._freeze_and_kill

    def recorded(cgroup: WorkloadCgroup) -> None:
        froze_on.append(threading.get_ident())
        freeze_and_kill(cgroup)

    monkeypatch.setattr(WorkloadCgroup, "_freeze_and_kill", recorded)
    recorder = Recorder()
    stubborn = ESCAPER.replace('["sleep", "600"]', '["sh", "-c", "trap \'\' TERM; sleep 600"]')
    code = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + stubborn
    code += "import time\ntime.sleep(600)\n"
    # Leftovers are not killed at exit: what ends the escaped one is the stop's SIGKILL alone.
    launcher = ContainedLauncher(make_launcher(kind, recorder), box.open(), kill_leftovers=False)
    async with serving(recorder, launcher, grace=0.5) as supervisor:
        loop_thread = threading.get_ident()
        supervisor.submit(LaunchRequest(key="w", argv=py(code)))
        await recorder.until(lambda: _said(recorder, "cgroup"))
        assert supervisor.stop("w", "revoked") == 1
        await recorder.until(lambda: recorder.outcomes)
    outcome = recorder.outcome("w")
    assert outcome.returncode == -signal.SIGKILL
    [escaped] = [int(pid) for pid in _said(recorder, "escaped")]
    assert cgroup_helpers.wait_gone(escaped)
    assert loop_thread not in froze_on


# Another instance's workload, in the cgroup that instance made for it: it leaves a process behind that
# nothing but its cgroup ties to it, says so, and exits once its stdin says go.
PREDECESSORS = ESCAPER + "sys.stdin.readline()\n"


async def test_a_taken_over_workload_is_settled_in_its_own_cgroup_like_one_of_ours(box: Scratch) -> None:
    # The handover's successor: the cgroup wrapper re-attaches the cgroup its predecessor made, so at its
    # end its leftovers are killed and the cgroup removed.
    predecessor = box.open()
    cgroup = predecessor.create("w1")
    assert cgroup is not None
    proc = box.start(PREDECESSORS, cgroup)  # past its gate: it runs until its stdin says go
    assert proc.stdin is not None
    assert proc.stdout is not None
    escaped = int(proc.stdout.readline().split()[1])
    start = start_ticks(proc.pid)
    assert start is not None
    recorder = Recorder()
    launcher = ContainedLauncher(TakesOver(SubprocessLauncher(output=recorder.output)), box.open())
    take = functools.partial(AdoptedChild.take, proc.pid, start, lambda: 0)
    async with serving(recorder, launcher) as supervisor:
        supervisor.adopt(taking_over(LaunchRequest("w", ("adopted",)), take, 1.0, str(cgroup.path)))
        await recorder.until(lambda: recorder.pids or recorder.outcomes)
        assert recorder.pids, recorder.outcomes  # a failed take says why
        [running] = supervisor.state().running
        assert running.cgroup is not None
        assert running.cgroup.path == cgroup.path
        proc.stdin.write("go\n")
        proc.stdin.flush()
        await recorder.until(lambda: recorder.outcomes)
    outcome = recorder.outcome("w")
    assert outcome.ok, outcome
    assert outcome.cleanup is not None
    assert (outcome.cleanup.leftovers, outcome.cleanup.killed) == (1, 1)
    assert gone(escaped)
    assert not cgroup.path.exists()


async def test_a_taken_over_workload_stopped_in_its_cgroup_ends_terminated_by_the_signal(
    box: Scratch,
) -> None:
    # It ignores SIGTERM and records no exit status: only the escalation's SIGKILL, sent to its cgroup,
    # ends it, and that signal is its end (not a lost process).
    predecessor = box.open()
    cgroup = predecessor.create("w1")
    assert cgroup is not None
    proc = box.start(
        "import signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(600)\n",
        cgroup,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    start = start_ticks(proc.pid)
    assert start is not None
    recorder = Recorder()
    launcher = ContainedLauncher(TakesOver(SubprocessLauncher(output=recorder.output)), box.open())
    take = functools.partial(AdoptedChild.take, proc.pid, start, lambda: None)
    async with serving(recorder, launcher, grace=0.5) as supervisor:
        supervisor.adopt(taking_over(LaunchRequest("w", ("adopted",)), take, 1.0, str(cgroup.path)))
        await recorder.until(lambda: recorder.pids)
        assert supervisor.stop("w", "revoked") == 1
        await recorder.until(lambda: recorder.outcomes)
    outcome = recorder.outcome("w")
    assert outcome.kind is OutcomeKind.TERMINATED, outcome
    assert outcome.returncode == -signal.SIGKILL


async def test_a_released_contained_child_keeps_its_cgroup_and_everything_in_it(
    box: Scratch, tmp_path: Path, kind: str
) -> None:
    # It leaves a process of its own in its cgroup: a cgroup settled on release would kill it. It reads
    # its input first, as a workload does: on the plain path, what it ran before would run outside.
    code = (
        "import subprocess, sys\n"
        "sys.stdin.read()\n"
        "left = subprocess.Popen(['sleep', '600'], stdout=subprocess.DEVNULL, start_new_session=True)\n"
        "print('left', left.pid, flush=True)\n" + HOLDER
    )
    recorder = Recorder()
    launcher: Launcher = ContainedLauncher(make_launcher(kind, recorder), box.open())
    with gate(tmp_path) as held:
        async with launcher:
            child = await launcher.launch(LaunchRequest("held", [sys.executable, "-c", code, str(tmp_path)]))
            assert child.cgroup is not None
            assert child.releasable
            pid = await release_once_up(child, recorder)
            left = said(recorder, "left")
            assert left is not None
            child.signal(signal.SIGKILL)  # neither its cgroup nor its group gets anything
            assert child.cleanup is None  # never settled
        path = child.cgroup.path
        assert path.is_dir()
        members = {int(p) for p in (path / "cgroup.procs").read_text().split()}
        assert {pid, left} <= members
        assert alive(pid)
        assert alive(left)
        assert finish(tmp_path, held, pid) == 0
    assert alive(left)  # the box's cleanup kills it, with the cgroup
    assert not (tmp_path / "signals").exists()
