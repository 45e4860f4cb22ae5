"""Children tied to the process that forked them, with real processes."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys

import psutil
import pytest

from tests.core.helpers import GUARD
from tests.processes import exits

# The owner ties its direct children, forks one into its own process group (as the task SDK does with
# the task process), has that child fork a grandchild, then is killed outright.
SCRIPT = """
import os, signal, sys, time
from async_local_executor.core.lifeline import tie_direct_children
tie_direct_children()
r, w = os.pipe()
child = os.fork()
if child == 0:
    os.setpgid(0, 0)
    grandchild = os.fork()
    if grandchild == 0:
        time.sleep(60)
        os._exit(0)
    os.write(w, f"{os.getpid()} {grandchild}\\n".encode())
    time.sleep(60)
    os._exit(0)
print(os.read(r, 100).decode().strip(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _dead(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_direct_child_dies_with_its_owner_and_later_forks_are_left_alone() -> None:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    child, grandchild = (int(x) for x in proc.stdout.readline().split())
    assert proc.wait(GUARD) == -signal.SIGKILL
    assert exits(child, GUARD), "the tied child outlived its owner"
    # The grandchild was forked by the child, not by the owner: not tied, still running.
    try:
        assert not _dead(grandchild)
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(grandchild).kill()


# Each script below ties its main thread's forks, then forks a sleeper from its main thread and one from
# another thread, prints both pids and is killed outright.
SLEEPER = """
import os, signal, sys, threading, time
from async_local_executor.core.lifeline import tie_direct_children

def fork_sleeper():
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    return pid
"""

# Tied from the main thread only: a fork from another thread is left alone (it would otherwise die with
# that thread, not with the process).
THREADS = (
    SLEEPER
    + """
tie_direct_children(main_thread_only=True)
from_thread = []
worker = threading.Thread(target=lambda: from_thread.append(fork_sleeper()))
worker.start()
worker.join()
print(fork_sleeper(), from_thread[0], flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
)

# Another thread forks while the main thread's fork runs its before-fork hooks (as the runtime's hook
# lets the loop thread run while it waits for it to park): the main thread's child is tied all the same.
INTERLEAVED = (
    SLEEPER
    + """
go, done, other = threading.Event(), threading.Event(), []

def fork_from_another_thread():
    go.wait()
    other.append(fork_sleeper())
    done.set()

threading.Thread(target=fork_from_another_thread, daemon=True).start()

def interleave():
    if threading.current_thread() is threading.main_thread() and not done.is_set():
        go.set()
        done.wait(10)

os.register_at_fork(before=interleave)  # before-fork hooks run last registered first: after the tie's
tie_direct_children(main_thread_only=True)
child = fork_sleeper()
print(child, other[0], flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
)


def _main_threads_child_dies_with_its_owner_and_the_others_does_not(script: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    from_main, from_thread = (int(x) for x in proc.stdout.readline().split())
    try:
        assert proc.wait(GUARD) == -signal.SIGKILL
        assert exits(from_main, GUARD), "the main thread's child outlived its owner"
        assert not _dead(from_thread)
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(from_thread).kill()
        proc.stdout.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_tied_from_the_main_thread_only_a_fork_from_another_thread_outlives_its_owner() -> None:
    _main_threads_child_dies_with_its_owner_and_the_others_does_not(THREADS)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_fork_from_another_thread_during_the_main_threads_fork_leaves_the_main_threads_child_tied() -> None:
    _main_threads_child_dies_with_its_owner_and_the_others_does_not(INTERLEAVED)
