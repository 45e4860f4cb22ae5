"""The fork-server helper must stay single-threaded: which preload started a thread, and whether any runs.

``fork()`` copies only the calling thread. A lock another thread held at that instant (the allocator's,
logging's, an SDK's queue) stays held in the child for good, and the workload hangs on it the first time
it needs it. Tracing and monitoring SDKs start threads at import, so a preloaded module can make the
helper unfit to fork; this module finds out which one, so the helper can refuse and say so.

Threads are counted from ``/proc/self/task``: native threads (started by C extensions) count as much as
Python's.

Native thread pools known to stop and restart on their own are stopped before the count instead
(:func:`stop_known_pools`). NumPy's OpenBLAS starts its worker threads when it is loaded (one per core
but one). Forking with them running is what the helper must not do, but OpenBLAS can stop them
(``blas_thread_shutdown_``, what its own ``pthread_atfork`` handler calls) and starts them again in each
process on the first call that needs them, with the same thread count: so a task forked from the helper
computes exactly as one that imported NumPy itself. Any other thread still makes the helper refuse the
module that started it.

Only the standard library is imported: the helper imports this module and must start fast.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator


def thread_ids() -> set[int]:
    """The kernel's ids of every thread of this process, the main one included."""
    try:
        return {int(tid) for tid in os.listdir("/proc/self/task")}
    except OSError:  # no /proc: only the threads Python knows of can be seen
        threading = sys.modules.get("threading")
        ids = {os.getpid()}
        if threading is not None:
            ids |= {t.native_id for t in threading.enumerate() if t.native_id is not None}
        return ids


def thread_name(tid: int) -> str:
    """A Python thread's name, else the kernel's name for it (what a native thread set)."""
    # threading is never imported here: a process that did not import it has no Python thread to name.
    threading = sys.modules.get("threading")
    if threading is not None:
        for thread in threading.enumerate():
            if thread.native_id == tid:
                return str(thread.name)
    try:
        with open(f"/proc/self/task/{tid}/comm") as comm:
            return f"native {comm.read().strip()}"
    except OSError:
        return f"thread {tid}"


def _plural(n: int) -> str:
    return f"{n} thread" if n == 1 else f"{n} threads"


class ThreadCensus:
    """Records which preload started which threads; says why the helper must not fork, if it must not."""

    def __init__(self) -> None:
        self._main = os.getpid()  # the helper's main thread: the one that forks
        self._started: list[tuple[str, set[int]]] = []

    @contextlib.contextmanager
    def watching(self, what: str) -> Iterator[None]:
        """Attribute to ``what`` the threads that appear while the block runs."""
        before = thread_ids()
        try:
            yield
        finally:
            self._started.append((what, thread_ids() - before))

    def settle(self, timeout: float) -> None:
        """Give Python threads that are finishing a one-off job up to ``timeout`` seconds to end.

        Only the startup check waits: a thread that ends on its own is no reason to refuse to fork.
        Native threads are waited for too, until the kernel no longer lists them.
        """
        deadline = time.monotonic() + timeout
        threading = sys.modules.get("threading")
        if threading is not None:
            for thread in threading.enumerate():
                if thread is not threading.main_thread():
                    thread.join(max(0.0, deadline - time.monotonic()))
        # A native thread that was told to stop (OpenBLAS's, by stop_known_pools) has been joined, but
        # the kernel may list it a moment longer: counted then, it would refuse a module for nothing,
        # on some starts and not others. The kernel's listing is the only thing to watch.
        while thread_ids() - {self._main} and time.monotonic() < deadline:
            time.sleep(0.01)

    def unfit(self) -> str | None:
        """Why forking now would be unsafe (the threads running besides ours and who started them)."""
        others = thread_ids() - {self._main}
        if not others:
            return None
        blamed: list[str] = []
        for what, started in self._started:
            if running := sorted(started & others):
                names = ", ".join(thread_name(tid) for tid in running)
                blamed.append(f"preloading {what} started {_plural(len(running))} ({names})")
                others -= started
        if others:
            names = ", ".join(thread_name(tid) for tid in sorted(others))
            blamed.append(f"other threads are running ({names})")
        return "; ".join(blamed) + (
            "; forking now would copy into every workload any lock those threads hold, where nothing "
            "would ever release it"
        )


# Library file names (a substring of) -> the function that stops its idle worker threads.
KNOWN_POOLS = {"openblas": "blas_thread_shutdown_"}


def loaded_libraries() -> list[str]:
    """Paths of the shared objects mapped into this process."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if line.rstrip().endswith(".so") or ".so." in line}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith("/"))


def stop_known_pools() -> list[str]:
    """Stop the worker threads of the known pools loaded here; the libraries' names whose pools stopped."""
    import ctypes

    stopped = []
    for path in loaded_libraries():
        name = os.path.basename(path).lower()
        for marker, symbol in KNOWN_POOLS.items():
            if marker not in name:
                continue
            try:
                shutdown = getattr(ctypes.CDLL(path), symbol)
            except (OSError, AttributeError):
                continue
            shutdown.restype = ctypes.c_int
            if shutdown() == 0:
                stopped.append(os.path.basename(path))
    return stopped
