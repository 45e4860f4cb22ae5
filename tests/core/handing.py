"""A workload in real custody and the stand-in executor (its "owner") that started it, for the tests of
custody (tests/core/test_custody.py) and of what reclaims a workload handed over (tests/ops).

The owner starts the workload process in a session of its own, reads its output pipe and passes each line
on to the test. The workload takes custody with the owner's pid, forks a grandchild into its process
group, and then does what the test writes on its stdin (which it inherited from the owner, so the test
can still tell it what to do once the owner is dead).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from async_local_executor.core import custody_files
from async_local_executor.core.proc_identity import start_ticks
from tests.core.cgroups.helpers import read_line
from tests.core.helpers import GUARD

TIMEOUT = 2.0

WORKLOAD = """
import json, os, signal, sys
from async_local_executor.core.custody import Custody

if sys.argv[4:] == ["late"]:  # takes custody only once its owner has exited (released it, say)
    import select
    try:
        owner = os.pidfd_open(int(sys.argv[1]))
    except ProcessLookupError:  # exited and reaped already
        pass
    else:
        select.select([owner], [], [])
held = Custody.start(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3])
if held is None:
    sys.exit(3)

def tell(lines):  # where the entry point would write the task's log
    with open(f"{sys.argv[3]}.{os.getpid()}.told", "a") as f:
        f.write(json.dumps(lines) + "\\n")

held.tell = tell

def sleep_for_ever():
    while True:
        signal.pause()

grandchild = os.fork()
if grandchild == 0:  # stays in the workload's process group
    sleep_for_ever()
print("ready", os.getpid(), grandchild, flush=True)
while line := sys.stdin.readline():
    command, _, arg = line.strip().partition(" ")
    if command == "say":
        print(arg, flush=True)
    elif command == "burst":  # arg KiB on fd 1, some on fd 2, then a line that says it is done
        try:
            for _ in range(int(arg)):
                sys.stdout.write("x" * 1023 + "\\n")
            sys.stdout.flush()
            os.write(2, b"straight to fd 2\\n")
            print("burst done", flush=True)
        except BaseException as exc:
            with open(os.path.join(sys.argv[3], "raised"), "w") as f:
                f.write(repr(exc))
            raise
    elif command == "escape":  # a child in a session of its own: only its cgroup holds it
        child = os.fork()
        if child == 0:
            os.setsid()
            sleep_for_ever()
        print("escaped", child, flush=True)
    elif command == "exit":
        held.record_exit(int(arg))
        sys.exit(int(arg))
"""

OWNER = """
import os, subprocess, sys
workload = subprocess.Popen(
    [sys.executable, "-c", sys.argv[1], str(os.getpid()), sys.argv[2], sys.argv[3]],
    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
)
print("workload", workload.pid, flush=True)
if sys.argv[4] == "leak":  # a process that holds the pipe's read end and never reads it
    leaker = subprocess.Popen(
        [sys.executable, "-c", "import signal; signal.pause()"], pass_fds=[workload.stdout.fileno()],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
    )
    print("leaker", leaker.pid, flush=True)
for line in workload.stdout:
    print("relayed", line.decode().rstrip(), flush=True)
print("exited", workload.wait(), flush=True)
"""

# An owner that exits as soon as it has started the workload, before the workload takes custody.
OWNER_GONE = """
import os, subprocess, sys
workload = subprocess.Popen(
    [sys.executable, "-c", sys.argv[1], str(os.getpid()), sys.argv[2], sys.argv[3], "late"],
    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
)
print("workload", workload.pid, flush=True)
"""

# A successor executor: it claims the workload, naming itself, then lives until its stdin closes.
SUCCESSOR = """
import json, os, sys
from async_local_executor.core.proc_identity import start_ticks
claim = {"owner_pid": os.getpid(), "owner_start": start_ticks(os.getpid())}
tmp = sys.argv[1] + ".tmp"
with open(tmp, "w") as f:
    json.dump(claim, f)
os.replace(tmp, sys.argv[1])
print("claimed", flush=True)
sys.stdin.read()
"""


class Handed:
    """An owner and the workload it started, with the workload's custody files."""

    def __init__(self, directory: Path, *, leak: bool = False, timeout: float = TIMEOUT) -> None:
        self.directory = directory
        self.owner = subprocess.Popen(
            [sys.executable, "-c", OWNER, WORKLOAD, str(timeout), str(directory), "leak" if leak else "-"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pid = int(self.expect("workload").split()[1])
        self.leaker = int(self.expect("leaker").split()[1]) if leak else 0
        ready = self.expect("relayed ready").split()
        assert int(ready[2]) == self.pid
        self.grandchild = int(ready[3])
        self.name = custody_files.name(self.pid, start_ticks(self.pid) or 0)
        self.others: list[subprocess.Popen[str]] = []

    def expect(self, prefix: str) -> str:
        """The owner's next line that starts with ``prefix`` (others are skipped)."""
        while not (line := read_line(self.owner, GUARD)).startswith(prefix):
            assert line, f"the owner ended before a line starting with {prefix!r}"
        return line

    def tell(self, command: str) -> None:
        assert self.owner.stdin is not None
        self.owner.stdin.write(command + "\n")
        self.owner.stdin.flush()

    def kill_owner(self) -> None:
        self.owner.kill()
        assert self.owner.wait(GUARD) == -signal.SIGKILL

    def file(self, suffix: str) -> Path:
        return self.directory / f"{self.name}{suffix}"

    def out(self) -> str:
        try:
            return self.file(".out").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def told(self) -> list[list[str]]:
        """What the workload told (``Custody.tell``), one list of lines per call."""
        try:
            with open(f"{self.directory}.{self.pid}.told") as told:
                return [json.loads(line) for line in told]
        except FileNotFoundError:
            return []

    def successor(self, claim_for: Path | None = None) -> subprocess.Popen[str]:
        """A successor that claims the workload (or writes its claim to ``claim_for``)."""
        proc = subprocess.Popen(
            [sys.executable, "-c", SUCCESSOR, str(claim_for or self.file(".json"))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.others.append(proc)
        assert read_line(proc) == "claimed"
        return proc

    def cleanup(self) -> None:
        for pid in (self.pid, self.grandchild, self.leaker):
            with contextlib.suppress(OSError):
                if pid:
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.killpg(self.pid, signal.SIGKILL)
        for proc in (self.owner, *self.others):
            with contextlib.suppress(OSError):
                proc.kill()
            proc.wait(GUARD)
            for pipe in (proc.stdin, proc.stdout):
                with contextlib.suppress(OSError):
                    if pipe is not None:
                        pipe.close()
