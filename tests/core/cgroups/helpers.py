"""Real cgroups for tests: a scratch cgroup2 root per test, removed with everything in it, even on failure.

Each test opens its containments through :class:`Scratch` under ``/ale-test-<random>``; on the way out
every process in that subtree is killed (``cgroup.kill``), waited for and reaped, and every directory
removed deepest first, on cgroup2 and in the cgroup v1 hierarchies the instances used.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

from async_local_executor.core.cgroups import Containment, WorkloadCgroup, cgroup2_mount
from async_local_executor.core.cgroups.discovery import (
    MOUNTINFO,
    directory_of,
    mount_root,
    own_cgroups,
    v1_mounts,
)
from tests.core.helpers import GUARD

# Waits for a child to leave a killed cgroup; never what a test waits for.
EMPTY_GUARD = 10.0
MiB = 1024 * 1024


def unusable() -> str:
    """Why this host cannot run the cgroup tests; ``""`` when it can."""
    mount = cgroup2_mount()
    if mount is None:
        return "no cgroup2 mount"
    if os.geteuid() != 0 or not os.access(mount, os.W_OK):
        return f"cannot create cgroups in {mount}"
    return ""


def v1_usable(controller: str) -> bool:
    """Whether the cgroup v1 hierarchy of ``controller`` is mounted here (a hybrid host)."""
    return controller in v1_mounts()


def _v1_parents() -> list[Path]:
    own, found = own_cgroups(), []
    for controller, point in v1_mounts().items():
        if controller in own:
            found.append(directory_of(point, mount_root(point), own[controller]))
    return list(dict.fromkeys(found))


class Scratch:
    """A test's cgroup2 root and the containments and processes opened under it."""

    def __init__(self) -> None:
        self.root = f"/ale-test-{uuid4().hex[:8]}"
        mount = cgroup2_mount()
        assert mount is not None
        self.directory = mount / self.root.lstrip("/")
        self.instances: list[str] = []
        self.processes: list[subprocess.Popen[str]] = []

    def name(self, prefix: str = "i") -> str:
        """A fresh instance name, remembered for the cleanup."""
        name = f"{prefix}-{uuid4().hex[:8]}"
        self.instances.append(name)
        return name

    def open(self, instance: str | None = None, *, root: str = "", mountinfo: str = MOUNTINFO) -> Containment:
        """A containment under this root (or ``root``, which the test must make sure is removed)."""
        instance = instance or self.name()
        if instance not in self.instances:
            self.instances.append(instance)
        return Containment.open(instance, root=root or self.root, mountinfo=mountinfo)

    def start(self, code: str, cgroup: WorkloadCgroup | None = None) -> subprocess.Popen[str]:
        """``python -c code``, joined to ``cgroup`` before it runs ``code``; stdin and stdout are pipes."""
        gate = "import sys\nsys.stdin.readline()\n"
        proc = subprocess.Popen(
            [sys.executable, "-c", gate + code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.processes.append(proc)
        assert proc.stdin is not None
        if cgroup is not None:
            cgroup.join(proc.pid)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        return proc

    def cleanup(self) -> None:
        _kill_tree(self.directory)
        for proc in self.processes:
            with contextlib.suppress(OSError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(GUARD)
            for pipe in (proc.stdin, proc.stdout):
                with contextlib.suppress(OSError):
                    if pipe is not None:
                        pipe.close()
        # Every directory is tried before the first failure is reported.
        failures: list[OSError] = []
        tops = [self.directory]
        tops += [parent / f"ale-{instance}" for parent in _v1_parents() for instance in self.instances]
        for top in tops:
            try:
                _remove_tree(top)
            except OSError as exc:
                failures.append(exc)
        if failures:
            raise failures[0]


@contextlib.contextmanager
def scratch() -> Iterator[Scratch]:
    """A :class:`Scratch`, cleaned up whatever the test did."""
    made = Scratch()
    try:
        yield made
    finally:
        made.cleanup()


def _kill_tree(top: Path) -> None:
    if not top.is_dir():
        return
    with contextlib.suppress(OSError):
        (top / "cgroup.kill").write_text("1")
    deadline = time.monotonic() + EMPTY_GUARD
    while _populated(top) and time.monotonic() < deadline:
        time.sleep(0.01)  # a guard: killed processes leave at once, but not synchronously


def _populated(top: Path) -> bool:
    try:
        return "populated 1" in (top / "cgroup.events").read_text()
    except OSError:
        return False


def _remove_tree(top: Path) -> None:
    if not top.is_dir():
        return
    for directory, _, _ in sorted(os.walk(top), key=lambda entry: -len(entry[0])):
        path = Path(directory)
        with contextlib.suppress(OSError):
            for pid in (path / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    os.kill(int(pid), signal.SIGKILL)
        deadline = time.monotonic() + EMPTY_GUARD
        while path.exists():
            try:
                path.rmdir()
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)  # a guard: a v1 directory empties a moment after its last process exits


def read_line(proc: subprocess.Popen[str], guard: float = GUARD) -> str:
    """The next line the child writes, failing the test when none comes within ``guard``.

    Read a byte at a time from the pipe itself: a buffered reader would hide lines from select().
    """
    assert proc.stdout is not None
    fd, line = proc.stdout.fileno(), b""
    deadline = time.monotonic() + guard
    while not line.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"pid {proc.pid} wrote no line in {guard} s (so far {line!r})"
        byte = os.read(fd, 1)
        if not byte:
            break
        line += byte
    return line.decode().strip()


def gone(pid: int) -> bool:
    """Not running (never existed, exited, or a zombie nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except OSError:
        return True


def wait_gone(pid: int, guard: float = EMPTY_GUARD) -> bool:
    """Whether ``pid`` is gone within ``guard`` seconds (a killed process exits soon, not at once)."""
    deadline = time.monotonic() + guard
    while not gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
