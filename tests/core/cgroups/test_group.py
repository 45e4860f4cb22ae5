"""A workload cgroup with real processes: nothing escapes it, signals reach members only, usage is read."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from async_local_executor.core.cgroups import WorkloadCgroup, cgroup_of
from tests.core.cgroups import helpers as cgroup_helpers
from tests.core.cgroups.helpers import MiB, Scratch, gone, read_line
from tests.core.helpers import GUARD

pytestmark = pytest.mark.skipif(bool(cgroup_helpers.unusable()), reason=cgroup_helpers.unusable())

# Everything a task can do to leave a process group or a session: a double fork, a new session, a
# cleared environment. The grandchild tells its pid (sh's $$, which exec keeps) and sleeps; the child
# says it once the process between them is reaped, so the cgroup then holds the two alone.
ESCAPER = """
import os, sys
r, w = os.pipe()
first = os.fork()
if first == 0:
    if os.fork() == 0:
        os.setsid()
        os.dup2(w, 1)
        os.execvp("env", ["env", "-i", "sh", "-c", "echo $$; exec sleep 600"])
    os._exit(0)
os.waitpid(first, 0)
os.close(w)
print(os.fdopen(r).readline().strip(), flush=True)
sys.stdin.readline()
"""
# A grandchild in a session of its own that reports SIGTERM; the child keeps the default action.
TERM_ELSEWHERE = """
import os, signal, sys
first = os.fork()
if first == 0:
    if os.fork() == 0:
        os.setsid()
        def term(*_):
            print("TERM", os.getpid(), flush=True)
            os._exit(0)
        signal.signal(signal.SIGTERM, term)
        print(os.getpid(), flush=True)
        while True:
            signal.pause()
    os._exit(0)
os.waitpid(first, 0)
sys.stdin.readline()
"""
# Echoes each line it reads; a SIGTERM is reported as a line of its own.
ECHO = """
import signal, sys
signal.signal(signal.SIGTERM, lambda *_: print("TERM", flush=True))
print("ready", flush=True)
for line in sys.stdin:
    print(line.strip(), flush=True)
"""
SLEEPER = "import time\nprint('ready', flush=True)\ntime.sleep(600)\n"


@pytest.fixture
def box() -> Iterator[Scratch]:
    with cgroup_helpers.scratch() as made:
        yield made


def workload(box: Scratch, name: str = "w") -> WorkloadCgroup:
    cgroup = box.open().create(name)
    assert cgroup is not None
    return cgroup


def test_nothing_escapes_and_kill_ends_it_all(box: Scratch) -> None:
    cgroup = workload(box)
    child = box.start(ESCAPER, cgroup)
    grandchild = int(read_line(child))
    assert cgroup_of(grandchild) == cgroup.relative
    assert os.getsid(grandchild) != os.getsid(child.pid)
    assert os.getpgid(grandchild) != os.getpgid(child.pid)
    assert sorted(cgroup.members()) == sorted([child.pid, grandchild])
    assert cgroup.populated()

    assert cgroup.kill() == 2
    assert cgroup.wait_empty(GUARD)
    assert child.wait(GUARD) == -signal.SIGKILL
    assert gone(grandchild)
    assert cgroup.remove()
    assert not cgroup.path.exists()
    assert not any(directory.exists() for directory in cgroup.v1.values())


def test_a_removed_cgroup_answers_without_raising(box: Scratch) -> None:
    cgroup = workload(box)
    assert cgroup.remove()
    assert cgroup.members() == []
    assert not cgroup.populated()
    assert cgroup.kill() == 0
    assert cgroup.signal(signal.SIGTERM) == 0
    assert cgroup.wait_empty(GUARD)
    assert cgroup.oom_kills() == 0
    assert cgroup.usage().cpu_seconds is None
    assert cgroup.remove()
    with pytest.raises(FileNotFoundError):
        cgroup.join(os.getpid())


def test_signal_reaches_members_in_other_sessions(box: Scratch) -> None:
    cgroup = workload(box)
    child = box.start(TERM_ELSEWHERE, cgroup)
    grandchild = int(read_line(child))
    assert os.getsid(grandchild) != os.getsid(child.pid)

    assert cgroup.signal(signal.SIGTERM) == 2
    assert read_line(child) == f"TERM {grandchild}"
    assert child.wait(GUARD) == -signal.SIGTERM
    assert cgroup.wait_empty(GUARD)


class Snapshot(WorkloadCgroup):
    """``cgroup`` as it was when ``pids`` were read from cgroup.procs: a signal races every move and exit."""

    def __init__(self, cgroup: WorkloadCgroup, pids: list[int]) -> None:
        super().__init__(cgroup.name, cgroup.path, cgroup.v1, cgroup.limits, cgroup.relative)
        self._pids = pids

    def members(self) -> list[int]:
        return self._pids


def test_signal_skips_a_process_that_moved_or_exited(box: Scratch) -> None:
    containment = box.open()
    here, there = containment.create("here"), containment.create("there")
    assert here is not None
    assert there is not None
    echo = box.start(ECHO, here)
    assert read_line(echo) == "ready"
    exited = box.start("", here)
    assert exited.wait(GUARD) == 0
    stale = Snapshot(here, [echo.pid, exited.pid])

    there.join(echo.pid)
    assert cgroup_of(echo.pid) == there.relative
    assert stale.signal(signal.SIGTERM) == 0
    assert echo.stdin is not None
    echo.stdin.write("still here\n")
    echo.stdin.flush()
    assert read_line(echo) == "still here"
    # Where it is now, the same signal arrives.
    assert there.signal(signal.SIGTERM) == 1
    assert read_line(echo) == "TERM"


def test_freeze_then_kill_where_there_is_no_cgroup_kill(box: Scratch) -> None:
    cgroup = workload(box)
    child = box.start(ESCAPER, cgroup)
    grandchild = int(read_line(child))
    cgroup._freeze_and_kill()
    assert cgroup.wait_empty(GUARD)
    assert child.wait(GUARD) == -signal.SIGKILL
    assert gone(grandchild)
    assert (cgroup.path / "cgroup.freeze").read_text().strip() == "0"
    assert cgroup.remove()


def test_wait_empty_times_out_while_populated(box: Scratch) -> None:
    cgroup = workload(box)
    child = box.start(SLEEPER, cgroup)
    assert read_line(child) == "ready"
    assert not cgroup.wait_empty(0.05)
    assert not cgroup.remove()  # a populated cgroup stays, and says so
    assert cgroup.kill() == 1
    assert cgroup.wait_empty(GUARD)
    assert cgroup.remove()


def test_usage_counts_memory_and_cpu(box: Scratch) -> None:
    containment = box.open()
    cgroup = containment.create("w")
    assert cgroup is not None
    holder = box.start(
        "b = bytearray(64 << 20)\nb[::4096] = b'x' * len(range(0, len(b), 4096))\n"
        "sum(i * i for i in range(2_000_000))\nprint('ready', flush=True)\nimport time\ntime.sleep(600)\n",
        cgroup,
    )
    assert read_line(holder) == "ready"
    usage = cgroup.usage()
    assert usage.cpu_seconds is not None
    assert usage.cpu_seconds > 0
    if "memory" not in containment.controllers:
        pytest.skip(f"no memory accounting here ({containment.describe()})")
    assert usage.memory_current is not None
    assert usage.memory_current >= 60 * MiB
    assert usage.memory_peak is not None
    assert usage.memory_peak >= usage.memory_current
