"""Native thread pools a preload starts that can be stopped before forking and restart on their own.

NumPy's OpenBLAS starts its worker threads when it is loaded (one per core but one). Forking with them
running is what the helper must not do, but OpenBLAS can stop them (``blas_thread_shutdown_``, what its
own ``pthread_atfork`` handler calls) and starts them again in each process on the first call that
needs them, with the same thread count: so a task forked from the helper computes exactly as one that
imported NumPy itself. Only pools known to behave so are stopped; any other thread still makes the
helper refuse the module that started it.

Only the standard library is imported: the helper imports this module and must start fast.
"""

from __future__ import annotations

import os

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
