"""Forking a sibling: ``fork()`` with ``CLONE_PARENT``, so the child is our parent's child, not ours.

The fork-server helper forks each workload this way: the scheduler reaps it and reads its real exit
status, and the helper's death costs no workload. Only the standard library is imported: the helper
imports this module and must start fast.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import signal
import sys

_CLONE_PARENT = 0x00008000
# clone(2)'s syscall number; its other arguments are all zero here, so their order per arch is moot.
_SYS_CLONE = {"x86_64": 56, "aarch64": 220}


def sibling_fork_supported() -> str | None:
    """Why :func:`fork_sibling` cannot work here, or ``None`` when it can."""
    if not sys.platform.startswith("linux"):
        return "it needs Linux (clone with CLONE_PARENT)"
    if platform.machine() not in _SYS_CLONE:
        return f"clone(2) is not wired for {platform.machine()}"
    if not hasattr(os, "pidfd_open"):
        return "this Python has no os.pidfd_open"
    try:
        pidfd = os.pidfd_open(os.getpid())
    except OSError as exc:
        return f"the kernel has no pidfd_open ({exc.strerror}; Linux 5.3 or later needed)"
    try:
        os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)
    except ChildProcessError:
        pass  # we are not our own child: the kernel understood the request
    except OSError as exc:
        return f"the kernel cannot wait on a pidfd ({exc.strerror}; Linux 5.4 or later needed)"
    finally:
        os.close(pidfd)
    return None


def fork_sibling() -> int:
    """``os.fork()``, except that the child's parent is our parent (``CLONE_PARENT``).

    Python's own fork hooks run around it exactly as ``os.fork`` runs them (held GIL, import lock,
    ``os.register_at_fork`` callbacks). Only a single-threaded process may call it, as with fork.
    """
    api, number = _api()
    api.PyOS_BeforeFork()
    pid = api.syscall(
        number,
        ctypes.c_ulong(_CLONE_PARENT | signal.SIGCHLD),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
    )
    if pid == 0:
        api.PyOS_AfterFork_Child()
        return 0
    error = ctypes.get_errno()
    api.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(error, os.strerror(error))
    return int(pid)


@functools.cache
def _api() -> tuple[ctypes.PyDLL, ctypes.c_long]:
    # Made once per helper: a PyDLL and its four functions made for each fork were a tenth of the
    # helper's own Python time per workload (py-spy over the ordinary benchmark).
    api = ctypes.PyDLL(None, use_errno=True)  # PyDLL: the GIL stays held across the clone, as in os.fork
    api.PyOS_BeforeFork.restype = None
    api.PyOS_AfterFork_Child.restype = None
    api.PyOS_AfterFork_Parent.restype = None
    api.syscall.restype = ctypes.c_long
    return api, ctypes.c_long(_SYS_CLONE[platform.machine()])
